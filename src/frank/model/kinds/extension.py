"""Torch extensions a library would compile at first import, built once by frank on the host.

exllamav3 (a py3-none-any wheel carrying its CUDA/C++ sources) imports a compiled
``exllamav3_ext`` when one is importable, else builds the whole extension with
``torch.utils.cpp_extension.load`` at first import: minutes to hours, nvcc, g++ and ninja in
the image. An ``extension`` part builds that module on the host, offline, from pinned inputs
(``frank.assemble.extension``), keyed by content so it is built once ever, and puts
``<module><suffix>`` at the top of site-packages, where ``import <module>`` finds it:

- ``wheel``: the library's wheel, by sha256, the one the closure installs (its sources);
- ``builder``: the program that builds (a repo folder, hashed as a tree);
- ``module``: the importable name the library looks for;
- ``archs``: the target archs (machine code for each, in one file);
- ``toolchain``: NVIDIA's CUDA compiler wheels of one release, unpacked whole;
- ``headers``: wheels of which only the ``include`` folders are used (torch's, cuBLAS's,
  ...); one of a distribution the closure installs must be the file it installs;
- ``python_headers``: the ``libpython3.X-dev`` .deb of the image's interpreter (its
  ``Python.h``), which also names the module's suffix (``.cpython-3X-x86_64-linux-gnu.so``);
- ``output_sha256``: optional, the module file's sha256, pinned (as ``aot``'s).
"""

from __future__ import annotations

import re
from typing import Annotated, ClassVar, Literal

from pydantic import Field

from frank.errors import FrankError
from frank.model.archs import Arch
from frank.model.kinds.aot import OutputPin, builder_inputs
from frank.model.kinds.base import LayerContribution, PartBase, PartContext, Strict
from frank.model.kinds.derived import Program
from frank.model.kinds.engine import PinnedWheel
from frank.model.pins import Distribution, SafeHttpUrl, Sha256

_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # an identifier, whole
# Debian's name for a CPython's headers: libpython3.11-dev_3.11.2-6+deb12u9_amd64.deb
_PY_DEB = re.compile(r"libpython(3\.[0-9]+)-dev_[^/_]+_amd64\.deb")


class PinnedDeb(Strict):
    """A Debian package at a URL, pinned by its sha256."""

    url: SafeHttpUrl
    sha256: Sha256

    @property
    def filename(self) -> str:
        return str(self.url).rsplit("/", 1)[-1]

    @property
    def package(self) -> str:
        return self.filename.split("_", 1)[0]


def python_version(deb: PinnedDeb) -> str:
    """``3.11`` for libpython3.11-dev's .deb; a ValueError for any other file."""
    m = _PY_DEB.fullmatch(deb.filename)
    if m is None:
        raise ValueError(f"{deb.filename!r} is not a libpython3.X-dev amd64 .deb")
    return m.group(1)


def ext_suffix(deb: PinnedDeb) -> str:
    """The file-name suffix CPython imports an extension of this interpreter by."""
    return f".cpython-{python_version(deb).replace('.', '')}-x86_64-linux-gnu.so"


class Extension(PartBase):
    """A torch extension built ahead of time on the host (module docstring)."""

    layer_rank: ClassVar[int] = 60  # with kernels and aot modules
    artifact_fields: ClassVar[tuple[str, ...]] = ("wheel", "toolchain")

    kind: Literal["extension"]
    distribution: Distribution  # the library that imports the module; its wheel has the sources
    module: Annotated[str, Field(pattern=_MODULE.pattern)]
    wheel: PinnedWheel | None = None
    builder: Program
    archs: Annotated[list[Arch], Field(min_length=1)]
    toolchain: Annotated[list[PinnedWheel], Field(min_length=1)] | None = None
    headers: list[PinnedWheel] = []
    python_headers: PinnedDeb
    output_sha256: OutputPin = None

    def inputs(self, ctx: PartContext) -> dict[str, str]:
        assert self.wheel is not None and self.toolchain is not None
        out = builder_inputs(self.builder, self.toolchain, ctx)
        try:
            python_version(self.python_headers)
        except ValueError as exc:
            raise FrankError(str(exc), file=ctx.manifest, field="python_headers.url") from None
        for w in [self.wheel, *self.toolchain, *self.headers]:
            out[str(w.url)] = w.sha256
        out[str(self.python_headers.url)] = self.python_headers.sha256
        return out

    def layer(self, ctx: PartContext) -> LayerContribution | None:
        return LayerContribution(
            why=f"{self.module}{ext_suffix(self.python_headers)} built on the host from "
                f"{self.distribution}'s sources for {' '.join(self.archs)} by the pinned "
                "toolchain, once per content key, placed at the top of site-packages")
