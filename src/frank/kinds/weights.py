"""Weights: a hub repo at one full revision hash; fetched and verified at serve time."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import AfterValidator

from frank.kinds.base import FlagValue, PartBase
from frank.pins import HubRevision, Sha256, matching

check_repo_id = matching(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*",
                         "a hub repo id of the form owner/name")


RepoId = Annotated[str, AfterValidator(check_repo_id)]


class Weights(PartBase):
    """A weight pack. Not baked into the image: the launcher fetches the pinned revision
    (allow patterns only) into a cache and checks each file's sha256 before the engine starts.
    """

    layer_rank: ClassVar[int] = 90
    artifact_fields: ClassVar[tuple[str, ...]] = ("revision",)

    kind: Literal["weights"]
    repo_id: RepoId
    revision: HubRevision | None = None
    allow_patterns: list[str] = ["*"]
    files: dict[str, Sha256] = {}
    quantization: str | None = None
    served_model_name: str

    def flags(self) -> dict[str, FlagValue]:
        # No --revision: the launcher fetches the pinned revision and passes its folder.
        out: dict[str, FlagValue] = {"served-model-name": self.served_model_name}
        if self.quantization is not None:
            out["quantization"] = self.quantization
        return out
