"""An audit's result, its one-line differences, and its record next to the layout.

The record (``audit.json`` beside ``out/<stack>/image``) is keyed by the image's manifest
digest: a rebuilt image has another digest, so an old verdict never speaks for it. ``frank
run``, ``push`` and ``trial run`` read it and audit again when it is absent or names another
digest; they refuse an image whose audit failed.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from frank.fsutil import write_atomic

AUDIT_RECORD = "audit.json"
AUDIT_FORMAT = 1


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Difference(Model):
    """One way the image is not what the lock says: which part, where, both sides."""

    part: str
    path: str
    check: str
    lock: str
    image: str

    def line(self) -> str:
        return f"{self.part}: {self.path}: {self.check}: lock says {self.lock}; " \
               f"image has {self.image}"


class CudaOwner(Model):
    """The GPU code of one distribution or part: its archs and whether it runs on target."""

    owner: str
    files: int
    sass: list[str]
    ptx: list[str]
    runs_as_sass: int  # files with SASS for the target
    runs_as_ptx: int  # files the driver must JIT from PTX for the target
    runs_not: int  # files with neither
    not_examples: list[str] = []

    def line(self, target: str) -> str:
        verdict = (f"on {target}: {self.runs_as_sass} SASS, {self.runs_as_ptx} PTX JIT only, "
                   f"{self.runs_not} neither" if target.startswith("sm_") else
                   f"target {target or '-'} is no GPU")
        return f"{self.owner}: {self.files} files; SASS {' '.join(self.sass) or '-'}; " \
               f"PTX {' '.join(self.ptx) or '-'}; {verdict}"


class Cost(Model):
    """What the audit took: wall and CPU seconds, bytes and files read."""

    seconds: float
    cpu_seconds: float
    layers: int
    bytes: int
    files: int
    # layers whose entries the build read from the bytes it wrote (not read back here)
    read_in_build: int = 0


class AuditReport(Model):
    """The full result of ``frank audit``."""

    format: int = AUDIT_FORMAT
    layout: str
    digest: str  # the image's manifest digest
    stack: str
    lock_digest: str
    target: str
    ok: bool
    require_target: bool = False
    differences: list[Difference] = []
    notes: list[str] = []
    cuda: list[CudaOwner] = []
    dists: int = 0
    base_dists: list[str] = []
    cost: Cost

    def lines(self) -> list[str]:
        return [d.line() for d in self.differences]


def record_path(layout: Path) -> Path:
    return Path(layout).parent / AUDIT_RECORD


def save_record(report: AuditReport, folder: Path) -> Path:
    """Write the report as ``folder/audit.json`` (atomically)."""
    path = folder / AUDIT_RECORD
    write_atomic(path, report.model_dump_json(indent=2) + "\n")
    return path


def load_record(layout: Path, digest: str) -> AuditReport | None:
    """The recorded audit of the image ``digest`` at ``layout``, if one was kept."""
    path = record_path(layout)
    try:
        report = AuditReport.model_validate(json.loads(path.read_bytes()))
    except (OSError, ValueError, ValidationError, RecursionError):  # audited again
        return None
    return report if report.digest == digest and report.format == AUDIT_FORMAT else None
