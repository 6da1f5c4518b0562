"""Ahead-of-time modules: kernels a library would JIT-compile on the target, built by frank.

FlashInfer compiles each kernel family ("module") the first time it is used, unless it finds
``<AOT_DIR>/<name>/<name>.so``; the image then needs nvcc, a host compiler and minutes per
module at first start. An ``aot`` part builds the modules the engine loads, on the host,
offline, from pinned inputs, and puts them where the library looks first:

- ``wheel``: the library's wheel, by sha256: the one the stack's closure installs (the
  build refuses another), since the modules are built from its sources;
- ``builder``: the program that builds (a repo folder, hashed as a tree, like a derived
  part's ``program``), and ``modules``: its input file (``[[module]]`` tables: ``name``,
  ``generator``, ``args``), hashed;
- ``archs``: the target archs (one file holds every arch);
- ``toolchain``: NVIDIA's CUDA wheels of one release (checked when locked,
  ``frank.model.cuda``), and ``python``: the wheels the builder imports (a CPU torch, ninja,
  apache-tvm-ffi, ...), all unpacked once into one folder by content;
- ``dest``: the library's AOT folder under site-packages (FlashInfer: ``flashinfer/data/aot``);
- ``env``: variables the engine needs once the modules are there (vLLM checks for nvcc or
  flashinfer-cubin before it uses FlashInfer at all: MODULES.md in the builder's folder);
- ``output_sha256``: optional, what the build makes, pinned (as Nix's fixed-output
  derivations): ``sha256_tree`` of the folder the layer places at ``dest``. Not in any
  module's build key; a build or kept output that is not it fails the compose, and release
  mode takes a kept output hashed equal to it instead of building again (docs/trust.md).

Each module is built once per content key (``frank.assemble.aot``): a change to one input
rebuilds only the modules it reaches.
"""

from __future__ import annotations

import re
import tomllib
from typing import Annotated, Any, ClassVar, Literal

from pydantic import ConfigDict, Field

from frank.errors import FrankError
from frank.model.archs import Arch, spell_archs
from frank.model.cuda import check_one_release
from frank.model.kinds.base import LayerContribution, PartBase, PartContext, Strict
from frank.model.kinds.derived import Program
from frank.model.kinds.engine import LocalWheelFile, PinnedWheel
from frank.model.kinds.env import EnvName
from frank.model.pins import Distribution, OneLine, RelativePath, Sha256, wheel_filename

_MODULE_NAME = re.compile(r"[A-Za-z0-9_]+")
_GENERATOR = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*")
# A host build's output pinned by digest (aot, extension): left out of the spec when absent,
# so an unpinned part keeps its key; never in the build's own key (frank.assemble.aot,
# frank.assemble.extension), so pinning builds nothing again.
OutputPin = Annotated[Sha256 | None, Field(default=None, exclude_if=lambda v: v is None)]


class AotModule(Strict):
    """One module of the builder's input file."""

    name: str
    generator: str
    args: list[str | int | float | bool] = []


def read_modules(text: str, *, label: str, manifest: Any) -> list[AotModule]:
    """The ``[[module]]`` tables of an input file, checked: a file name FlashInfer can look
    up, a ``module:function`` generator, each name once."""
    from pydantic import ValidationError

    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise FrankError(f"{label}: {exc}", file=manifest, field="modules") from None
    extra = sorted(set(doc) - {"module"})
    if extra:
        raise FrankError(f"{label}: unknown table {extra[0]!r} (only [[module]])",
                         file=manifest, field="modules")
    out: list[AotModule] = []
    for i, raw in enumerate(doc.get("module", [])):
        try:
            module = AotModule.model_validate(raw)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            raise FrankError(f"{label}: module[{i}].{where}: {err['msg']}", file=manifest,
                             field="modules") from None
        if not _MODULE_NAME.fullmatch(module.name):
            raise FrankError(f"{label}: module[{i}].name {module.name!r} is not a module "
                             "name (letters, digits, '_')", file=manifest, field="modules")
        if not _GENERATOR.fullmatch(module.generator):
            raise FrankError(f"{label}: module[{i}].generator {module.generator!r} is not "
                             "'package.module:function'", file=manifest, field="modules")
        if any(m.name == module.name for m in out):
            raise FrankError(f"{label}: module {module.name!r} is listed twice",
                             file=manifest, field="modules")
        out.append(module)
    if not out:
        raise FrankError(f"{label}: no [[module]] to build", file=manifest, field="modules")
    return out


def builder_inputs(builder: Program, toolchain: list[PinnedWheel], ctx: PartContext
                   ) -> dict[str, str]:
    """A host build's program (its folder's tree hash), its main file checked, and its
    toolchain checked to be one CUDA release with an nvcc (``frank.model.cuda``)."""
    release = check_one_release([wheel_filename(str(w.url)) for w in toolchain],
                                file=ctx.manifest, field="toolchain")
    if release is None:
        raise FrankError("no nvidia-cuda-nvcc among the toolchain wheels",
                         file=ctx.manifest, field="toolchain")
    path = builder.path.rstrip("/")
    out = {f"{path}/": ctx.tree_hash(builder.path, "builder.path")}
    if not ctx.path(f"{path}/{builder.main}", "builder.main").is_file():
        raise FrankError(f"{path}/{builder.main!r} is not a file",
                         file=ctx.manifest, field="builder.main")
    return out


class Aot(PartBase):
    """Modules a library would JIT-compile, built ahead of time on the host (module
    docstring)."""

    # `env` is also the protocol's method: the field is `env_`, spelled `env`
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True,
                              validate_by_name=True, validate_by_alias=True,
                              serialize_by_alias=True)
    layer_rank: ClassVar[int] = 60  # with kernels
    artifact_fields: ClassVar[tuple[str, ...]] = ("wheel", "toolchain")

    kind: Literal["aot"]
    distribution: Distribution  # the library whose wheel the closure installs
    wheel: PinnedWheel | None = None
    builder: Program
    modules: RelativePath
    archs: Annotated[list[Arch], Field(min_length=1)]
    toolchain: Annotated[list[PinnedWheel], Field(min_length=1)] | None = None
    python: list[PinnedWheel | LocalWheelFile] = []
    dest: RelativePath  # under site-packages
    env_: dict[EnvName, OneLine] = Field(default={}, alias="env")
    output_sha256: OutputPin = None

    def inputs(self, ctx: PartContext) -> dict[str, str]:
        assert self.wheel is not None and self.toolchain is not None
        out = builder_inputs(self.builder, self.toolchain, ctx)
        digest = ctx.file_hash(self.modules, "modules")
        read_modules(ctx.path(self.modules, "modules").read_text(encoding="utf-8"),
                     label=self.modules, manifest=ctx.manifest)
        out[self.modules] = digest
        out[str(self.wheel.url)] = self.wheel.sha256
        for w in self.toolchain:
            out[str(w.url)] = w.sha256
        for p in self.python:
            out[f"file:{p.filename}" if isinstance(p, LocalWheelFile) else str(p.url)] = \
                p.sha256
        return out

    def layer(self, ctx: PartContext) -> LayerContribution | None:
        return LayerContribution(
            why=f"{self.distribution} modules built on the host for "
                f"{spell_archs(self.archs, 'flashinfer')} by the pinned toolchain, one "
                f"content key per module, placed in <site-packages>/{self.dest}")

    def env(self) -> dict[str, str]:
        return dict(self.env_)
