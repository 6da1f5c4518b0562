"""Hook/plugin: a Python package in this repo that vLLM loads through an entry point."""

from __future__ import annotations

from typing import ClassVar, Literal

from frank.kinds.base import FileCopy, LayerContribution, PartBase, PartContext, Strict
from frank.kinds.env import EnvName

PluginGroup = Literal[
    "vllm.general_plugins",
    "vllm.platform_plugins",
    "vllm.io_processor_plugins",
    "vllm.stat_logger_plugins",
    "vllm.endpoint_plugins",
]


class EntryPoint(Strict):
    """The package that vLLM loads and the entry point it is registered under."""

    package: str  # repo-relative folder holding the package's pyproject.toml
    group: PluginGroup = "vllm.general_plugins"
    name: str


def package_dest(part_name: str) -> str:
    """Where a part's package source lands in the image before it is installed."""
    return f"/opt/frank/src/{part_name}"


class Plugin(PartBase):
    """A vLLM plugin; its settings are environment variables the plugin reads."""

    layer_rank: ClassVar[int] = 70
    artifact_fields: ClassVar[tuple[str, ...]] = ("entry_point",)

    kind: Literal["plugin"]
    entry_point: EntryPoint | None = None
    settings: dict[EnvName, str] = {}

    def inputs(self, ctx: PartContext) -> dict[str, str]:
        assert self.entry_point is not None
        path = self.entry_point.package
        if not ctx.path(path, "entry_point.package").joinpath("pyproject.toml").is_file():
            from frank.errors import FrankError

            raise FrankError(f"{path!r} has no pyproject.toml", file=ctx.manifest,
                             field="entry_point.package")
        return {path: ctx.tree_hash(path, "entry_point.package")}

    def layer(self, ctx: PartContext) -> LayerContribution | None:
        assert self.entry_point is not None
        dest = package_dest(self.name)
        return LayerContribution(
            files=(FileCopy(self.entry_point.package, dest),),
            pip_install=(dest,),
            why=f"plugin package installed with its {self.entry_point.group} entry point",
        )

    def env(self) -> dict[str, str]:
        return dict(self.settings)

    def plugin_names(self) -> list[str]:
        assert self.entry_point is not None
        return [self.entry_point.name]
