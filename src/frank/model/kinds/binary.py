"""Prebuilt binaries: one compiled file, or a folder of them (many cubins), copied in as
they are, pinned by content.

A file is pinned by its sha256; a folder by the hash of its tree (``hashing.sha256_tree``:
every file's path, mode and bytes; a symlink kept as a link, one leading out of the folder
refused). ``sha256`` states the hash the manifest expects, so a changed file or tree is an
error rather than a silently different image. ``env_var`` names the variable that points
the engine at ``dest`` (FlashInfer's cubin folder, a kernel library path).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from frank.errors import FrankError
from frank.model.kinds.base import FileCopy, LayerContribution, PartBase, PartContext
from frank.model.kinds.env import EnvName
from frank.model.kinds.kernel import Arch
from frank.model.pins import ImagePath, Sha256


class Binary(PartBase):
    """A shared object or cubin (or a folder of them) built elsewhere; archs say what it
    holds code for."""

    layer_rank: ClassVar[int] = 50
    artifact_fields: ClassVar[tuple[str, ...]] = ("path",)

    kind: Literal["binary"]
    path: str | None = None
    sha256: Sha256 | None = None
    archs: list[Arch]
    dest: ImagePath
    env_var: EnvName | None = Field(default=None, exclude_if=lambda v: v is None)

    def inputs(self, ctx: PartContext) -> dict[str, str]:
        assert self.path is not None
        where = ctx.path(self.path, "path")
        if where.is_dir():
            digest = ctx.tree_hash(self.path, "path", every_file=True)
            if self.sha256 is not None and digest != self.sha256:
                raise FrankError(f"tree hash mismatch for {self.path}/: manifest says "
                                 f"{self.sha256}, the folder has {digest}",
                                 file=ctx.manifest, field="sha256")
            return {f"{self.path}/": digest}
        if not where.is_file():
            raise FrankError(f"{self.path!r} is neither a file nor a folder",
                             file=ctx.manifest, field="path")
        return {self.path: ctx.file_hash(self.path, "path", self.sha256)}

    def layer(self, ctx: PartContext) -> LayerContribution | None:
        assert self.path is not None
        what = "folder" if ctx.path(self.path, "path").is_dir() else "binary"
        return LayerContribution(files=(FileCopy(self.path, self.dest),),
                                 why=f"prebuilt {what} copied as it is")

    def env(self) -> dict[str, str]:
        return {self.env_var: self.dest} if self.env_var else {}
