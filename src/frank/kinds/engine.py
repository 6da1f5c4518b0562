"""Engine base: vLLM at a pinned commit (and, for a release, its wheel pinned by sha256)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import HttpUrl

from frank.kinds.base import LayerContribution, PartBase, PartContext, Slug, Strict
from frank.pins import Commit, GitUrl, ImageRef, Sha256


class PinnedWheel(Strict):
    """A wheel file at a URL (as the index reports it), pinned by its sha256."""

    url: HttpUrl
    sha256: Sha256

    def requirement(self, name: str) -> str:
        """A pip requirement line that installs exactly this file or fails."""
        return f"{name} @ {self.url} --hash=sha256:{self.sha256}"


class EngineBase(PartBase):
    """The engine everything else sits on.

    How it gets into the image is derived, not declared: an official ``image`` by digest;
    else the release ``wheel`` by hash (Python-only patches applied to the installed
    package); else vLLM's precompiled path at ``commit``; a patch that touches compiled
    code forces a source build. The build plan records which path and why.
    """

    layer_rank: ClassVar[int] = 10
    artifact_fields: ClassVar[tuple[str, ...]] = ("commit",)

    kind: Literal["engine"]
    repo: GitUrl
    commit: Commit | None = None
    release: str | None = None
    wheel: PinnedWheel | None = None
    image: ImageRef | None = None
    python: str
    torch: str
    cuda: str
    cuda_arch_list: list[str]
    patches: list[Slug] = []

    def inputs(self, ctx: PartContext) -> dict[str, str]:
        out = {f"git+{self.repo}": str(self.commit)}
        if self.wheel is not None:
            out[str(self.wheel.url)] = self.wheel.sha256
        if self.image is not None:
            out["image"] = self.image
        return out

    def layer(self, ctx: PartContext) -> LayerContribution | None:
        if self.image is not None:
            return LayerContribution(why=f"official engine image {self.image} is the base")
        if self.wheel is not None:
            return LayerContribution(
                generated=(("/opt/frank/engine/requirements.txt",
                            self.wheel.requirement("vllm") + "\n"),),
                run=("pip install --require-hashes --no-deps "
                     "-r /opt/frank/engine/requirements.txt",
                     # the wheel is installed; this only brings its dependencies
                     f"pip install 'vllm=={self.release}'" if self.release
                     else f"pip install 'vllm @ {self.wheel.url}'"),
                why=f"release wheel {str(self.wheel.url).rsplit('/', 1)[-1]} pinned by sha256"
                    " (its dependencies come from the index: pin them with package parts)",
            )
        return LayerContribution(
            run=(
                f"VLLM_USE_PRECOMPILED=1 VLLM_PRECOMPILED_WHEEL_COMMIT={self.commit} "
                f"pip install 'vllm @ git+{self.repo}@{self.commit}'",
            ),
            why="no release wheel: vLLM's precompiled path at the pinned commit",
        )
