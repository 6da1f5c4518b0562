"""This machine's identity as an engine's compiled caches see it: what a warm cache must match.

Why these fields: what the engines compile is specific to them. On a GPU, Triton, Inductor,
FlashInfer and the CUDA graphs are built for one architecture (compute capability) and
loaded by one driver, and the driver's CUDA version bounds which PTX it can JIT; the GPU's
name separates cards of one capability whose autotuned choices differ (an RTX PRO 6000 and
an RTX 5090 are both SM120). The CUDA runtime the engine links is in the image, so the image
digest already pins it. On the CPU, Inductor's C++ code is compiled for the vector ISA
torch detects (``torch._inductor.cpu_vec_isa``: AVX2, AVX-512, AMX, NEON, SVE) and oneDNN
picks kernels by the same flags; the model name separates microarchitectures with the same
flags. Nothing else of the host (hostname, memory, core count) is part of the identity: a
cache made on one node of a pool serves every node of the same card.
"""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# The /proc/cpuinfo flags that decide what Inductor's C++ backend and oneDNN generate.
ISA_FLAGS = frozenset({
    "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512cd",
    "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx512_vbmi",
    "avx512_vbmi2", "avx512ifma", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8",
    "amx_fp16", "asimd", "asimdhp", "asimddp", "sve", "sve2", "bf16", "i8mm", "vsx", "vxe",
})


@dataclass(frozen=True)
class Gpu:
    """One GPU as nvidia-smi reports it."""

    name: str
    compute_capability: str
    driver: str
    cuda: str  # the highest CUDA version the driver runs (nvidia-smi's "CUDA Version")


@dataclass(frozen=True)
class Device:
    """What a warm cache is keyed by, besides the image digest."""

    kind: str  # "gpu" or "cpu"
    cpu_model: str = ""
    isa: tuple[str, ...] = ()
    gpus: tuple[Gpu, ...] = ()

    def as_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["isa"] = list(self.isa)
        doc["gpus"] = [asdict(g) for g in self.gpus]
        if self.kind == "gpu":  # the host CPU is no part of a GPU cache's key
            doc.pop("cpu_model")
            doc.pop("isa")
        else:
            doc.pop("gpus")
        return doc

    def canonical(self) -> str:
        return json.dumps(self.as_json(), sort_keys=True, separators=(",", ":"))

    @property
    def key(self) -> str:
        """A short stable name of the identity (a file name in the store's warm index)."""
        return hashlib.sha256(self.canonical().encode()).hexdigest()[:24]

    def describe(self) -> str:
        """For a person: ``NVIDIA GeForce RTX 5090 (sm_120, driver 580.65, CUDA 13.0) x2``."""
        if self.kind == "gpu" and self.gpus:
            g = self.gpus[0]
            cc = "sm_" + g.compute_capability.replace(".", "")
            many = f" x{len(self.gpus)}" if len(self.gpus) > 1 else ""
            return f"{g.name} ({cc}, driver {g.driver}, CUDA {g.cuda}){many}"
        best = next((f for f in ("amx_tile", "avx512f", "avx2", "sve", "asimd")
                     if f in self.isa), "base ISA")
        return f"{self.cpu_model or platform.machine()} ({best.replace('_tile', '')})"

    @classmethod
    def from_json(cls, doc: Any) -> Device:
        """The identity an artifact's annotation names; ValueError when it is not one."""
        if not isinstance(doc, dict) or doc.get("kind") not in ("cpu", "gpu"):
            raise ValueError("not a device identity")
        if doc["kind"] == "gpu":
            gpus = tuple(Gpu(**g) for g in doc.get("gpus") or [])
            return cls("gpu", gpus=gpus)
        return cls("cpu", cpu_model=str(doc.get("cpu_model", "")),
                   isa=tuple(str(f) for f in doc.get("isa") or []))


def cpu_identity(cpuinfo: str | None = None) -> Device:
    """The CPU's model name and the ISA flags of ``ISA_FLAGS`` it has (first processor)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            cpuinfo = ""
    model, flags = "", set[str]()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("model name", "Model", "cpu model") and not model:
            model = " ".join(value.split())
        elif key in ("flags", "Features") and not flags:
            flags = set(value.split())
    return Device("cpu", cpu_model=model or platform.processor() or platform.machine(),
                  isa=tuple(sorted(flags & ISA_FLAGS)))


def gpu_identity() -> Device | None:
    """Every GPU nvidia-smi lists, or None when there is no nvidia-smi or no GPU."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        rows = subprocess.run([exe, "--query-gpu=name,compute_cap,driver_version",
                               "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=30, check=True).stdout
        head = subprocess.run([exe], capture_output=True, text=True, timeout=30,
                              check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    cuda = ""
    if "CUDA Version:" in head:
        cuda = head.split("CUDA Version:", 1)[1].split()[0].strip("|")
    gpus = []
    for row in rows.splitlines():
        cells = [c.strip() for c in row.split(",")]
        if len(cells) == 3 and all(cells):
            gpus.append(Gpu(cells[0], cells[1], cells[2], cuda))
    return Device("gpu", gpus=tuple(gpus)) if gpus else None


def this_device(gpus: int) -> Device | None:
    """The identity a stack with ``gpus`` GPUs runs on here (None: it needs GPUs and none
    are visible). A GPU stack's cache is keyed by the first ``gpus`` GPUs."""
    if gpus <= 0:
        return cpu_identity()
    found = gpu_identity()
    if found is None or len(found.gpus) < gpus:
        return None
    return Device("gpu", gpus=found.gpus[:gpus])
