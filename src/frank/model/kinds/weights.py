"""Weights: a hub repo at one full revision hash, or a local directory pinned file by file;
fetched (or found) and verified at serve time."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from frank.model.kinds.base import FlagValue, PartBase
from frank.model.pins import HubRevision, Sha256, matching

check_repo_id = matching(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*",
                         "a hub repo id of the form owner/name")


RepoId = Annotated[str, AfterValidator(check_repo_id)]


def check_local_dir(value: str) -> str:
    """An absolute, normalized directory path: the engine is given it as it is, on the host
    or mounted at the same path in a container, so it must not depend on a working dir."""
    path = PurePosixPath(value)
    if not path.is_absolute() or ".." in path.parts or str(path) != value.rstrip("/"):
        raise ValueError(f"{value!r} is not an absolute, normalized directory path")
    return str(path)


def check_file_name(value: str) -> str:
    """A relative path inside the weights folder (no ``..``, no leading ``/``)."""
    path = PurePosixPath(value)
    if path.is_absolute() or ".." in path.parts or str(path) != value or value in ("", "."):
        raise ValueError(f"{value!r} is not a relative file path inside the weights folder")
    return value


LocalDir = Annotated[str, AfterValidator(check_local_dir)]
FileName = Annotated[str, AfterValidator(check_file_name)]


class Weights(PartBase):
    """A weight pack. Not baked into the image. Two sources:

    - hub: ``repo_id`` at ``revision`` (allow patterns only), fetched into the hub cache;
    - a local directory, ``path``: every file in it must be listed in ``files`` with its
      sha256 (the hashes are its only pin, so an unlisted file is refused at serve time).

    Either way the launcher checks each listed file's sha256 before the engine starts.
    """

    layer_rank: ClassVar[int] = 90
    artifact_fields: ClassVar[tuple[str, ...]] = ()  # per source: see _one_source

    kind: Literal["weights"]
    repo_id: RepoId | None = None
    revision: HubRevision | None = None
    path: LocalDir | None = None
    allow_patterns: list[str] = ["*"]
    files: dict[FileName, Sha256] = {}
    quantization: str | None = None
    served_model_name: str

    @model_validator(mode="after")
    def _one_source(self) -> Weights:
        if (self.repo_id is None) == (self.path is None):
            raise ValueError("give exactly one source: repo_id (hub, with revision) or path "
                             "(a local directory, with files)")
        if self.path is not None:
            for name in ("revision", "allow_patterns"):
                if name in self.model_fields_set:
                    raise ValueError(f"{name} is for hub weights; a local directory (path) "
                                     "is pinned by files alone")
            if not self.files:
                raise ValueError("a local directory (path) needs files: the sha256 of every "
                                 "file in it (they are its only pin)")
        elif self.revision is None and self.status in ("served", "candidate"):
            raise ValueError(f"revision is required for a {self.status} part (only parked or "
                             "rejected parts may lack their artifact)")
        return self

    def missing_artifact(self) -> str | None:
        return "revision" if self.repo_id is not None and self.revision is None else None

    @model_serializer(mode="wrap")
    def _only_its_source(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A hub part dumps exactly as before local directories existed (its lock key and
        # every stack digest stay the same); a local part shows only what pins it.
        data: dict[str, Any] = handler(self)
        if self.path is None:
            data.pop("path", None)
        else:
            for name in ("repo_id", "revision", "allow_patterns"):
                data.pop(name, None)
        return data

    def flags(self) -> dict[str, FlagValue]:
        # No --revision: the launcher fetches the pinned revision and passes its folder.
        out: dict[str, FlagValue] = {"served-model-name": self.served_model_name}
        if self.quantization is not None:
            out["quantization"] = self.quantization
        return out
