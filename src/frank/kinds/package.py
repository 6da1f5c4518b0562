"""Python package pinned over the engine: an index wheel by sha256, or a git commit."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import model_validator

from frank.kinds.base import LayerContribution, PartBase, PartContext, Strict
from frank.kinds.engine import PinnedWheel
from frank.pins import Commit, GitUrl


class GitSource(Strict):
    """A package built into a wheel from a git commit."""

    repo: GitUrl
    commit: Commit
    subdirectory: str | None = None


class Package(PartBase):
    """A Python distribution installed over the engine (e.g. a newer FlashInfer).

    Chosen as a kind of its own, not a field of the engine base, so that each pinned
    package has its own evidence and one-step revert.
    """

    layer_rank: ClassVar[int] = 30
    artifact_fields: ClassVar[tuple[str, ...]] = ()

    kind: Literal["package"]
    distribution: str
    wheel: PinnedWheel | None = None
    git: GitSource | None = None
    entry_points: list[str] = []  # vllm.general_plugins names it provides (VLLM_PLUGINS)

    @model_validator(mode="after")
    def _one_source(self) -> Package:
        if (self.wheel is None) == (self.git is None):
            raise ValueError("give exactly one of wheel or git")
        return self

    def inputs(self, ctx: PartContext) -> dict[str, str]:
        if self.wheel is not None:
            return {str(self.wheel.url): self.wheel.sha256}
        assert self.git is not None
        return {f"git+{self.git.repo}": self.git.commit}

    def layer(self, ctx: PartContext) -> LayerContribution | None:
        if self.wheel is not None:
            req = f"/opt/frank/packages/{self.name}.txt"
            return LayerContribution(
                generated=((req, self.wheel.requirement(self.distribution) + "\n"),),
                run=(f"pip install --require-hashes --no-deps -r {req}",),
                why="wheel pinned by sha256",
            )
        assert self.git is not None
        sub = f"#subdirectory={self.git.subdirectory}" if self.git.subdirectory else ""
        return LayerContribution(
            run=(f"pip install --no-deps '{self.distribution} @ "
                 f"git+{self.git.repo}@{self.git.commit}{sub}'",),
            why="wheel built from a pinned git commit",
        )

    def plugin_names(self) -> list[str]:
        return list(self.entry_points)
