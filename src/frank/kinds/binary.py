"""Prebuilt kernel binary: a compiled file copied in as it is, pinned by sha256."""

from __future__ import annotations

from typing import ClassVar, Literal

from frank.kinds.base import FileCopy, LayerContribution, PartBase, PartContext
from frank.kinds.kernel import Arch
from frank.pins import ImagePath, Sha256


class Binary(PartBase):
    """A shared object or cubin built elsewhere; archs say what it holds code for."""

    layer_rank: ClassVar[int] = 50
    artifact_fields: ClassVar[tuple[str, ...]] = ("path",)

    kind: Literal["binary"]
    path: str | None = None
    sha256: Sha256 | None = None
    archs: list[Arch]
    dest: ImagePath

    def inputs(self, ctx: PartContext) -> dict[str, str]:
        assert self.path is not None
        return {self.path: ctx.file_hash(self.path, "path", self.sha256)}

    def layer(self, ctx: PartContext) -> LayerContribution | None:
        assert self.path is not None
        return LayerContribution(files=(FileCopy(self.path, self.dest),),
                                 why="prebuilt binary copied as it is")
