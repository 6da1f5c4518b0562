"""The input types compose hands to the image builder (converted from its build plan).

Plain frozen dataclasses rather than pydantic models: they are built in code from an
already-validated plan, never parsed from user files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

# Where every frank image carries its lock: written by the plan, read by run, attest and trial.
LOCK_IN_IMAGE = "/etc/frank/frank.lock"

@dataclass(frozen=True)
class LayerInput:
    """One image layer: a name for history, a content key from the lock, files to put in it."""

    name: str  # e.g. "part:region-cache" or "lock"
    key: str  # sha256 hex keying the layer's content (from the lock)
    entries: tuple[tuple[Path, str], ...]  # (file or dir on disk, absolute path in the image)


@dataclass(frozen=True)
class ImageSpec:
    """Everything that determines an image: same spec, same manifest digest."""

    base_layout: Path  # an OCI image layout directory
    base_digest: str  # "sha256:<64hex>" manifest digest the base must have (verified)
    layers: tuple[LayerInput, ...]
    env: dict[str, str] = field(default_factory=dict)
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    source_date_epoch: int = 0
