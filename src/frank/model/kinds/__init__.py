"""The part kinds, one module each, chosen from a manifest by its ``kind`` field.

A kind's module is imported (and its models built) only when a manifest of that kind is
read: a read command on a stack pays for the kinds it uses, not for all of them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Annotated, Any

from frank.model.kinds.base import PartBase

if TYPE_CHECKING:
    from pydantic import TypeAdapter

    from frank.model.kinds.aot import Aot
    from frank.model.kinds.binary import Binary
    from frank.model.kinds.data import Data
    from frank.model.kinds.derived import Derived
    from frank.model.kinds.engine import EngineBase
    from frank.model.kinds.env import EnvSwitch
    from frank.model.kinds.extension import Extension
    from frank.model.kinds.kernel import Kernel
    from frank.model.kinds.package import Package
    from frank.model.kinds.patch import Patch
    from frank.model.kinds.plugin import Plugin
    from frank.model.kinds.step import Step
    from frank.model.kinds.weights import Weights

    AnyPart = Annotated[
        EngineBase | Patch | Package | Binary | Kernel | Aot | Extension | Plugin | Data
        | Derived | Weights | EnvSwitch | Step, "discriminated by kind"]

# kind -> (module, class), in the order errors list the kinds
_KINDS: dict[str, tuple[str, str]] = {
    "engine": ("frank.model.kinds.engine", "EngineBase"),
    "patch": ("frank.model.kinds.patch", "Patch"),
    "package": ("frank.model.kinds.package", "Package"),
    "binary": ("frank.model.kinds.binary", "Binary"),
    "kernel": ("frank.model.kinds.kernel", "Kernel"),
    "aot": ("frank.model.kinds.aot", "Aot"),
    "extension": ("frank.model.kinds.extension", "Extension"),
    "plugin": ("frank.model.kinds.plugin", "Plugin"),
    "data": ("frank.model.kinds.data", "Data"),
    "derived": ("frank.model.kinds.derived", "Derived"),
    "weights": ("frank.model.kinds.weights", "Weights"),
    "env": ("frank.model.kinds.env", "EnvSwitch"),
    "step": ("frank.model.kinds.step", "Step"),
}


def kind_class(kind: str) -> type[PartBase]:
    """The model of one kind, its module imported on first use."""
    module, name = _KINDS[kind]
    cls: type[PartBase] = getattr(importlib.import_module(module), name)
    return cls


def all_kinds() -> tuple[type[PartBase], ...]:
    """Every kind's model (imports them all)."""
    return tuple(kind_class(k) for k in _KINDS)


class _PartAdapter:
    """``validate_python`` of the union of all kinds, discriminated by ``kind``: a known kind
    is validated by its own model alone; anything else by the whole union, built once, so a
    missing or unknown kind is refused in pydantic's own words."""

    _union: TypeAdapter[Any] | None = None

    def validate_python(self, raw: Any) -> AnyPart:
        kind = raw.get("kind") if isinstance(raw, dict) else None
        if isinstance(kind, str) and kind in _KINDS:
            # its errors' locations lack the union's tag, which validation_to_error drops
            return kind_class(kind).model_validate(raw)  # type: ignore[return-value]
        return self._whole().validate_python(raw)  # type: ignore[no-any-return]

    def _whole(self) -> TypeAdapter[Any]:
        if self._union is None:
            from typing import Union

            from pydantic import Field, TypeAdapter

            members = all_kinds()
            union = Union[members]  # type: ignore[valid-type]  # noqa: UP007  (a tuple of types)
            self._union = TypeAdapter(Annotated[union, Field(discriminator="kind")])
        return self._union


PART_ADAPTER = _PartAdapter()

__all__ = ["PART_ADAPTER", "PartBase", "all_kinds", "kind_class"]
