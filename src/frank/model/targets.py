"""What a part says about the engine on one target family, so the audit can hold the image
to it: libraries whose kernels the engine never runs there, the backends it selects and
the kernels they call, and the tools it calls at run time.

Each fact names the engine code it was read from (``file:function``), so a reviewer can
check it and the next engine bump knows what to read again. The audit
(``frank.audit.target``) holds every fact to the image: a declared file must be there, a
kernel on the path must have code the target runs (SASS, PTX, or a FlashInfer module built
ahead of time), a tool the engine would call must be in the image unless what it would
build already is. Where the engine decides with a pure function of the device capability,
``pure`` names it and the audit evaluates the image's own copy of it for the family.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator


class Strict(BaseModel):
    """As ``kinds.base.Strict`` (which imports this module for PartBase)."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

_CITE = re.compile(r"[A-Za-z0-9_./-]+\.(py|cu|cuh|cpp|h|hpp):[A-Za-z_][A-Za-z0-9_.]*")
_FAMILY = re.compile(r"([1-9][0-9]?)\.x")
_SITE_PATH = re.compile(r"[A-Za-z0-9_.*+-]+(/[A-Za-z0-9_.*+-]+)*")
_TOOL = re.compile(r"[A-Za-z0-9_.+-]+")


def _cite(value: str) -> str:
    if not _CITE.fullmatch(value):
        raise ValueError(f"{value!r} is not a code citation: write file:function "
                         "(vllm/platforms/cuda.py:_get_backend_priorities)")
    return value


def _site_path(value: str) -> str:
    if not _SITE_PATH.fullmatch(value.removeprefix("/")) or ".." in value.split("/"):
        raise ValueError(f"{value!r} is not a path in the image: relative to site-packages "
                         "(vllm/_C.abi3.so) or absolute (/opt/x.so); no '..'; '*' globs a "
                         "name")
    return value


def _family(value: str) -> str:
    if not _FAMILY.fullmatch(value):
        raise ValueError(f"{value!r} is not a target family: write the capability's major "
                         "number and .x (12.x: sm_120, sm_121)")
    return value


def _requirement(value: str) -> str:
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        req = Requirement(value)
    except InvalidRequirement as exc:
        raise ValueError(f"{value!r} is not a requirement ({exc})") from None
    if req.url or req.extras or req.marker:
        raise ValueError(f"{value!r}: only a name and versions (flashinfer-python<0.6.14)")
    return value


Cite = Annotated[str, AfterValidator(_cite)]
SitePath = Annotated[str, AfterValidator(_site_path)]
Family = Annotated[str, AfterValidator(_family)]
When = Annotated[str, AfterValidator(_requirement)]
ToolName = Annotated[str, Field(pattern=_TOOL.pattern)]
ImagePath = Annotated[str, Field(pattern=r"/[A-Za-z0-9_.+-]+(/[A-Za-z0-9_.+-]+)*")]


class UnusedLibrary(Strict):
    """Libraries (site-relative paths, ``*`` globs a name) whose kernels the engine never
    launches on the family, and the engine's rule that decides it."""

    path: SitePath
    rule: Cite
    why: str
    # a predicate of the device capability (``cls.fn(capability) -> bool``: may it run
    # here?) the audit evaluates from the image's copy: it must say no for the family
    pure: Cite | None = Field(default=None, exclude_if=lambda v: v is None)


class KernelRef(Strict):
    """One kernel a backend calls: a FlashInfer module (built ahead of time or compiled
    at first use), a library and symbol, or a folder of cubins the backend loads."""

    what: str
    cite: Cite
    flashinfer_module: str | None = Field(default=None, exclude_if=lambda v: v is None,
                                          pattern=r"[A-Za-z0-9_]+")
    library: SitePath | None = Field(default=None, exclude_if=lambda v: v is None)
    symbol: str | None = Field(default=None, exclude_if=lambda v: v is None,
                               pattern=r"[A-Za-z_][A-Za-z0-9_]*")
    cubins: SitePath | None = Field(default=None, exclude_if=lambda v: v is None)

    @model_validator(mode="after")
    def _one_source(self) -> KernelRef:
        given = [n for n in ("flashinfer_module", "library", "cubins") if getattr(self, n)]
        if len(given) != 1:
            raise ValueError("name exactly one of flashinfer_module, library, cubins "
                             f"(got {', '.join(given) or 'none'})")
        if self.symbol and not self.library:
            raise ValueError("symbol needs library")
        return self

    @property
    def ref(self) -> str:
        if self.flashinfer_module:
            return f"flashinfer module {self.flashinfer_module}"
        if self.library:
            return f"{self.library}" + (f" {self.symbol}" if self.symbol else "")
        return f"cubins {self.cubins}"


class EnginePath(Strict):
    """The backend the engine selects for one role (attention, moe, sampling...) and the
    kernels it calls, in call order; ``when``: only while the closure satisfies it."""

    role: str
    backend: str
    cite: Cite
    when: When | None = Field(default=None, exclude_if=lambda v: v is None)
    kernels: Annotated[list[KernelRef], Field(min_length=1)]


class RuntimeTool(Strict):
    """A program the engine calls at run time: needed unless one of ``built`` (what it
    would build, already built: a prebuilt extension, an AOT module) is in the image."""

    tool: ToolName
    by: str
    cite: Cite
    # besides the image's PATH: site-relative places the caller finds it (CUDA_HOME's bin)
    paths: list[SitePath] = Field(default=[], exclude_if=lambda v: not v)
    built: list[SitePath] = Field(default=[], exclude_if=lambda v: not v)
    # image files the tool's job needs besides the tool (Python.h for a launcher)
    needs: list[ImagePath] = Field(default=[], exclude_if=lambda v: not v)
    when: When | None = Field(default=None, exclude_if=lambda v: v is None)


class TargetFacts(Strict):
    """A part's facts about the engine on one target family."""

    family: Family
    unused: list[UnusedLibrary] = []
    path: list[EnginePath] = []
    tools: list[RuntimeTool] = []
    # distributions whose Triton and TileLang kernels the first start compiles (counted
    # from their sources in the image)
    jit_sources: list[str] = []

    def covers(self, major: int) -> bool:
        return int(self.family.split(".")[0]) == major


__all__ = ["EnginePath", "KernelRef", "RuntimeTool", "TargetFacts", "UnusedLibrary"]
