"""Hook/plugin: a Python package in this repo that vLLM loads through an entry point."""

from __future__ import annotations

from typing import ClassVar, Literal

from frank.model.kinds.base import (
    LayerContribution,
    PartBase,
    PartContext,
    PythonNeeds,
    Strict,
)
from frank.model.kinds.env import EnvName, EnvValue
from frank.model.pins import EntryPointName, OneLine

PluginGroup = Literal[
    "vllm.general_plugins",
    "vllm.platform_plugins",
    "vllm.io_processor_plugins",
    "vllm.stat_logger_plugins",
    "vllm.endpoint_plugins",
]


class EntryPoint(Strict):
    """The package that vLLM loads and the entry point it is registered under."""

    package: OneLine  # repo-relative folder holding the package's pyproject.toml
    group: PluginGroup = "vllm.general_plugins"
    name: EntryPointName


def check_entry_point(ctx: PartContext, entry: EntryPoint, field_name: str) -> None:
    """``entry``'s package must be a package folder that declares ``entry.name`` in
    ``entry.group``: the name goes into VLLM_PLUGINS, and one the package does not declare
    would be loaded by no one, silently."""
    from frank.errors import FrankError
    from frank.model.pyproject import read_project

    folder = ctx.path(entry.package, f"{field_name}.package")
    pyproject = folder / "pyproject.toml"
    if not pyproject.is_file():
        raise FrankError(f"{entry.package!r} has no pyproject.toml", file=ctx.manifest,
                         field=f"{field_name}.package")
    declared = read_project(folder).entry_points.get(entry.group, {})
    if entry.name not in declared:
        have = ", ".join(sorted(declared)) or "none"
        raise FrankError(f"{entry.name!r} is not an entry point of {entry.group} in "
                         f"{entry.package}/pyproject.toml (it declares: {have})",
                         file=ctx.manifest, field=f"{field_name}.name")


def package_needs(ctx: PartContext, package: str, field_name: str) -> PythonNeeds:
    """A repo package's dependencies, from its static pyproject metadata."""
    from frank.model.pyproject import read_project

    return PythonNeeds(requirements=read_project(ctx.path(package, field_name)).dependencies)


def package_dest(part_name: str) -> str:
    """Where a part's package source lands in the image before it is installed."""
    return f"/opt/frank/src/{part_name}"


class Plugin(PartBase):
    """A vLLM plugin; its settings are environment variables the plugin reads."""

    layer_rank: ClassVar[int] = 70
    artifact_fields: ClassVar[tuple[str, ...]] = ("entry_point",)

    kind: Literal["plugin"]
    entry_point: EntryPoint | None = None
    settings: dict[EnvName, EnvValue] = {}

    def inputs(self, ctx: PartContext) -> dict[str, str]:
        assert self.entry_point is not None
        check_entry_point(ctx, self.entry_point, "entry_point")
        path = self.entry_point.package
        return {path: ctx.tree_hash(path, "entry_point.package")}

    def layer(self, ctx: PartContext) -> LayerContribution | None:
        assert self.entry_point is not None
        return LayerContribution(
            build_wheels=(self.entry_point.package,),
            why=f"wheel built from repo source (static metadata), installed with its "
                f"{self.entry_point.group} entry point",
        )

    def python_needs(self, ctx: PartContext) -> PythonNeeds:
        assert self.entry_point is not None
        return package_needs(ctx, self.entry_point.package, "entry_point.package")

    def env(self) -> dict[str, str]:
        return dict(self.settings)

    def plugin_names(self) -> list[str]:
        assert self.entry_point is not None
        return [self.entry_point.name]
