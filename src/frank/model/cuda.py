"""One CUDA release per kernel build: the compiler wheels must agree, checked at lock time.

nvcc, its front end headers (crt), its back end (nvvm), the runtime headers and the CCCL
headers ship as separate PyPI wheels with separate version numbers. A mix of releases
compiles until it meets a check such as CCCL's "CUDA compiler and CUDA toolkit headers are
incompatible" (nvcc 13.2.86 with crt 13.5.37 and cudart 13.0.96, as stacks/pylock.served.toml
holds), minutes into a build. So the release (major.minor) of every compiler wheel is
compared with nvcc's when the stack is locked, and the first that differs is named.

Tools that only read what the compiler made (cuobjdump) and libraries pinned for their
headers (cublas, curand: their versions follow their own numbering) are not compared.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from frank.errors import FrankError

# the wheels that make up the compiler, by distribution name (canonical)
COMPILER = ("nvidia-cuda-nvcc", "nvidia-cuda-crt", "nvidia-nvvm", "nvidia-cuda-runtime",
            "nvidia-cuda-cccl")


def release(version: str) -> str:
    """``13.0.88`` -> ``13.0``."""
    return ".".join(version.split(".")[:2])


def wheel_name_version(filename: str) -> tuple[str, str]:
    """(canonical distribution, version) a wheel's file name gives."""
    from packaging.utils import parse_wheel_filename

    name, version, _, _ = parse_wheel_filename(filename)
    return str(name), str(version)


def check_one_release(filenames: Sequence[str], *, file: Path, field: str) -> str | None:
    """The CUDA release of the compiler wheels among ``filenames`` (None when there is no
    nvcc among them); a compiler wheel of another release than nvcc's, or one given twice,
    is a FrankError naming it."""
    seen: dict[str, str] = {}
    for filename in filenames:
        name, version = wheel_name_version(filename)
        if name not in COMPILER:
            continue
        if name in seen:
            raise FrankError(f"{name} is pinned twice ({seen[name]} and {version}): a build "
                             "has one toolchain", file=file, field=field)
        seen[name] = version
    nvcc = seen.get("nvidia-cuda-nvcc")
    if nvcc is None:
        return None
    for name in COMPILER:
        other = seen.get(name)
        if other is not None and release(other) != release(nvcc):
            raise FrankError(
                f"{name} {other} is CUDA {release(other)}, but nvidia-cuda-nvcc {nvcc} "
                f"is CUDA {release(nvcc)}: a kernel build's compiler wheels must be one "
                "CUDA release", file=file, field=field)
    return release(nvcc)
