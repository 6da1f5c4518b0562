"""CUDA target archs, in every spelling the tools take, converted in one place.

A part may name an arch as nvcc does (``sm_120``, ``sm_120a``, ``sm_120f``) or as
TORCH_CUDA_ARCH_LIST and FlashInfer do (``12.0``, ``12.0a``, ``12.0f``); frank reads either
into one value and writes the form each consumer wants:

===============  ======================================  ==========================
form             sm_120f becomes                         list joined by
===============  ======================================  ==========================
``sm``           ``sm_120f``                             space
``nvcc``         ``120f`` (-gencode's number)            space
``gencode``      ``-gencode=arch=compute_120f,code=sm_120f``  space
``cmake``        ``120f`` (CMAKE_CUDA_ARCHITECTURES)     ``;``
``torch``        ``12.0f`` (TORCH_CUDA_ARCH_LIST)        ``;``
``flashinfer``   ``12.0f`` (FLASHINFER_CUDA_ARCH_LIST)   space
===============  ======================================  ==========================

The suffix is kept as it is: ``a`` is code for exactly that chip (sm_90a, sm_120a), ``f``
is code for the family (CUDA 12.9+: sm_120f runs on every 12.x chip); no suffix is
plain code for that compute capability and later.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import AfterValidator

ArchForm = Literal["sm", "nvcc", "gencode", "cmake", "torch", "flashinfer"]
ARCH_FORMS: tuple[ArchForm, ...] = ("sm", "nvcc", "gencode", "cmake", "torch", "flashinfer")

_SM = re.compile(r"sm_([1-9][0-9]?)([0-9])([af]?)")
_DOTTED = re.compile(r"([1-9][0-9]?)\.([0-9])([af]?)")


@dataclass(frozen=True, order=True)
class CudaTarget:
    """One target: compute capability major.minor and its suffix (``""``, ``a``, ``f``)."""

    major: int
    minor: int
    suffix: str = ""

    @property
    def number(self) -> str:
        """``120f``: nvcc's and CMake's number."""
        return f"{self.major}{self.minor}{self.suffix}"

    def spell(self, form: ArchForm) -> str:
        """This target written as ``form`` wants it."""
        if form == "sm":
            return f"sm_{self.number}"
        if form in ("nvcc", "cmake"):
            return self.number
        if form == "gencode":
            return f"-gencode=arch=compute_{self.number},code=sm_{self.number}"
        return f"{self.major}.{self.minor}{self.suffix}"  # torch, flashinfer


# The compute capabilities NVIDIA has shipped (CUDA 13's list, and the older ones frank may
# meet in a prebuilt library): a name outside it is a typo (``sm_12`` reads as 1.2, not 12.0).
KNOWN: frozenset[tuple[int, int]] = frozenset({
    (3, 0), (3, 2), (3, 5), (3, 7), (5, 0), (5, 2), (5, 3), (6, 0), (6, 1), (6, 2), (7, 0),
    (7, 2), (7, 5), (8, 0), (8, 6), (8, 7), (8, 8), (8, 9), (9, 0), (10, 0), (10, 1),
    (10, 3), (11, 0), (12, 0), (12, 1)})
# ``a`` (this chip only) exists from Hopper on, ``f`` (the family) from Blackwell on
SUFFIX_FROM = {"a": 9, "f": 10}


def parse_arch(value: str) -> CudaTarget:
    """``sm_120f`` or ``12.0f`` (and the plain and ``a`` forms) -> a target; else ValueError
    (a name of no real compute capability, or a suffix that chip does not have, too)."""
    for pattern in (_SM, _DOTTED):
        m = pattern.fullmatch(value)
        if m:
            target = CudaTarget(int(m.group(1)), int(m.group(2)), m.group(3))
            if (target.major, target.minor) not in KNOWN:
                raise ValueError(
                    f"{value!r} names compute capability {target.major}.{target.minor}, "
                    "which no NVIDIA GPU has (sm_<major><minor>: sm_120 is 12.0, sm_90 is "
                    "9.0)")
            if target.suffix and target.major < SUFFIX_FROM[target.suffix]:
                raise ValueError(
                    f"{value!r}: the {target.suffix!r} suffix exists from compute capability "
                    f"{SUFFIX_FROM[target.suffix]}.0 on")
            return target
    raise ValueError(f"{value!r} is not a CUDA arch (sm_120, sm_120a, sm_120f, 12.0, 12.0a "
                     "or 12.0f)")


def check_arch(value: str) -> str:
    """Validator: an arch in either spelling, kept as written (the lock shows what the
    manifest says)."""
    parse_arch(value)
    return value


Arch = Annotated[str, AfterValidator(check_arch)]

_SEPARATOR: dict[ArchForm, str] = {"sm": " ", "nvcc": " ", "gencode": " ", "cmake": ";",
                                   "torch": ";", "flashinfer": " "}


def spell_archs(archs: list[str], form: ArchForm) -> str:
    """A list of archs as one value of ``form`` (duplicates dropped, order kept)."""
    out: list[str] = []
    for arch in archs:
        word = parse_arch(arch).spell(form)
        if word not in out:
            out.append(word)
    return _SEPARATOR[form].join(out)


def runs_on(code: CudaTarget, device: CudaTarget, *, ptx: bool) -> bool:
    """Whether code built for ``code`` runs on a ``device`` of that compute capability.

    The rules CUDA applies: SASS (a cubin) runs on the same major version at the same or a
    later minor one (sm_120 on 12.0 and 12.1); ``a`` SASS or PTX runs on exactly its chip
    (sm_120a on 12.0 only); ``f`` code runs on its family (sm_120f on every 12.x from 12.0);
    plain PTX is compiled by the driver for any later device (compute_90 JITs on 12.0).
    """
    same_major_later = device.major == code.major and device.minor >= code.minor
    if code.suffix == "a":
        return (device.major, device.minor) == (code.major, code.minor)
    if code.suffix == "f" or not ptx:
        return same_major_later
    return (device.major, device.minor) >= (code.major, code.minor)
