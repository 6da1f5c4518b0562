"""Kernel: our own CUDA source, compiled for the target archs against the image's torch."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from frank.model.archs import Arch, spell_archs
from frank.model.cuda import check_one_release
from frank.model.kinds.base import LayerContribution, PartBase, PartContext, PythonNeeds
from frank.model.kinds.engine import PinnedWheel
from frank.model.kinds.plugin import EntryPoint, check_entry_point, package_needs
from frank.model.pins import OneLine, wheel_filename

__all__ = ["Arch", "Kernel", "kernel_dest"]


def kernel_dest(part_name: str) -> str:
    """Where a kernel's source tree lands in the image to be built."""
    return f"/opt/frank/kernels/{part_name}"


class Kernel(PartBase):
    """A CUDA kernel that replaces one engine op, swapped in by its plugin."""

    layer_rank: ClassVar[int] = 60
    artifact_fields: ClassVar[tuple[str, ...]] = ("source", "toolchain")

    kind: Literal["kernel"]
    source: str | None = None
    archs: list[Arch]
    replaces_op: str
    build: OneLine  # run from the source folder; $CUDA_ARCHS holds the archs as nvcc numbers
    plugin: EntryPoint | None = None
    # The compiler, as wheels unpacked on the host (nvcc, its headers and static libs):
    # pinned like any other input, so the lock covers the toolchain. The host C++
    # compiler nvcc calls cannot be pinned this way; frank.assemble.kernel keys its cache on
    # its version line instead.
    toolchain: Annotated[list[PinnedWheel], Field(min_length=1)] | None = None

    def inputs(self, ctx: PartContext) -> dict[str, str]:
        assert self.source is not None
        out = {self.source: ctx.tree_hash(self.source, "source")}
        check_one_release([wheel_filename(str(w.url)) for w in self.toolchain or ()],
                          file=ctx.manifest, field="toolchain")
        for wheel in self.toolchain or ():
            out[str(wheel.url)] = wheel.sha256
        if self.plugin is not None:  # checked even inside the source tree it is hashed with
            check_entry_point(ctx, self.plugin, "plugin")
            if not self.plugin.package.startswith(self.source + "/"):
                out[self.plugin.package] = ctx.tree_hash(self.plugin.package, "plugin.package")
        return out

    def layer(self, ctx: PartContext) -> LayerContribution | None:
        assert self.source is not None
        # Compiled on the host by the pinned toolchain (frank.assemble.kernel); the layer holds
        # the built libraries at kernel_dest() and the plugin's wheel built from the tree.
        wheels = (self.plugin.package,) if self.plugin is not None else ()
        return LayerContribution(
            build_wheels=wheels,
            why=f"compiled on the host for {', '.join(self.archs)} by the pinned toolchain",
        )

    def python_needs(self, ctx: PartContext) -> PythonNeeds:
        if self.plugin is None:
            return PythonNeeds()
        return package_needs(ctx, self.plugin.package, "plugin.package")

    def nvcc_archs(self) -> str:
        """``sm_120 9.0a`` -> ``120 90a``: the form nvcc's -gencode takes."""
        return spell_archs(self.archs, "nvcc")

    def plugin_names(self) -> list[str]:
        return [self.plugin.name] if self.plugin is not None else []
