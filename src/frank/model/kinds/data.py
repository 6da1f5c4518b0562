"""Data file: a file from the repo or the hub, pinned by sha256, placed in the image."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import model_validator

from frank.model.kinds.base import (
    FileCopy,
    FlagName,
    FlagValue,
    LayerContribution,
    PartBase,
    PartContext,
    Strict,
)
from frank.model.kinds.env import EnvName
from frank.model.kinds.weights import RepoId
from frank.model.pins import HubRevision, ImagePath, RelativePath, Sha256


class HubFile(Strict):
    """One file of a hub repo at a full revision hash."""

    repo_id: RepoId
    revision: HubRevision
    filename: RelativePath


class DataFile(Strict):
    """Where a data file comes from: a repo path or a hub file (exactly one)."""

    path: str | None = None
    hub: HubFile | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> DataFile:
        if (self.path is None) == (self.hub is None):
            raise ValueError("give exactly one of path or hub")
        return self


class Data(PartBase):
    """A data file the engine reads, found through an env variable or an engine flag."""

    layer_rank: ClassVar[int] = 80
    artifact_fields: ClassVar[tuple[str, ...]] = ("sha256",)

    kind: Literal["data"]
    source: DataFile
    sha256: Sha256 | None = None
    dest: ImagePath
    env_var: EnvName | None = None
    flag: FlagName | None = None

    @model_validator(mode="after")
    def _pointer(self) -> Data:
        if (self.env_var is None) == (self.flag is None):
            raise ValueError("give exactly one of env_var or flag (how the engine finds it)")
        return self

    def inputs(self, ctx: PartContext) -> dict[str, str]:
        if self.source.path is not None:
            path = self.source.path
            return {path: ctx.file_hash(path, "source.path", self.sha256)}
        hub = self.source.hub
        assert hub is not None and self.sha256 is not None
        return {f"hub:{hub.repo_id}@{hub.revision}/{hub.filename}": self.sha256}

    def layer(self, ctx: PartContext) -> LayerContribution | None:
        if self.source.path is None:
            return None  # a hub file is fetched and verified by the launcher
        return LayerContribution(files=(FileCopy(self.source.path, self.dest),),
                                 why="data file copied to its place")

    def env(self) -> dict[str, str]:
        return {self.env_var: self.dest} if self.env_var else {}

    def flags(self) -> dict[str, FlagValue]:
        return {self.flag: self.dest} if self.flag else {}
