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


class UnusedVerdict(Model):
    """A declaration that the engine never runs a library's kernels on the family."""

    part: str
    path: str
    rule: str
    why: str
    files: list[str]  # image paths it matched
    evaluated: bool | None = None  # the pure rule's answer for the device, where declared


class DeadCode(Model):
    """Device code one owner carries that the target cannot run."""

    owner: str
    bytes: int  # stored bytes of entries (SASS, PTX) the device cannot run
    device_bytes: int  # all the owner's device code
    files_all_dead: int  # files none of whose code runs


class KernelVerdict(Model):
    """One kernel on the engine's path on the target, and what the image has for it."""

    part: str
    role: str
    backend: str
    what: str
    ref: str
    cite: str
    ok: bool
    where: str
    evidence: str


class ToolVerdict(Model):
    """A tool the engine calls at run time: found in the image, or not needed."""

    part: str
    tool: str
    by: str
    cite: str
    found: str
    built: str  # what it would build, already in the image
    needed: bool
    ok: bool
    lacking: list[str] = []  # files its job needs that the image does not hold
    would_build: str = ""  # what it builds at first start (declared built, not in the image)


class FirstStart(Model):
    """What still compiles on the device at the engine's first start."""

    flashinfer_jit: list[str]  # FlashInfer modules on the path not built ahead of time
    tool_builds: list[str]  # what run-time tools build at first start (an extension)
    triton_kernels: int  # @triton.jit functions in the declared sources
    tilelang_kernels: int
    ptx_only: list[str]  # libraries the driver compiles from PTX

    def line(self) -> str:
        return (f"FlashInfer JIT modules {len(self.flashinfer_jit)}"
                f"{' (' + ', '.join(self.flashinfer_jit) + ')' if self.flashinfer_jit else ''}; "
                f"tool builds {len(self.tool_builds)}"
                f"{' (' + '; '.join(self.tool_builds) + ')' if self.tool_builds else ''}; "
                f"Triton kernels {self.triton_kernels}; TileLang kernels "
                f"{self.tilelang_kernels}; PTX-only libraries {len(self.ptx_only)}")


class TargetReport(Model):
    """The image on its target device: every verdict with its evidence."""

    device: str
    family: str
    declared_by: list[str]
    unused: list[UnusedVerdict]
    dead: list[DeadCode]
    path: list[KernelVerdict]
    tools: list[ToolVerdict]
    first_start: FirstStart


class Cost(Model):
    """What the audit took: wall and CPU seconds, bytes and files read."""

    seconds: float
    cpu_seconds: float
    layers: int
    bytes: int
    files: int
    # layers whose entries the build read from the bytes it wrote (not read back here)
    read_in_build: int = 0
    # layers whose reading an earlier audit kept by digest (frank.audit.kept), not read again
    kept: int = 0
    # the verdict on the files was kept from an audit of the same layers held to the same
    # expectations (frank.audit.kept.verdict_key): only the config was checked again
    verdict_kept: bool = False


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
    target_report: TargetReport | None = None
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
