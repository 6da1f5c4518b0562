"""The part kinds, one module each, chosen from a manifest by its ``kind`` field."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, TypeAdapter

from frank.kinds.base import PartBase
from frank.kinds.binary import Binary
from frank.kinds.data import Data
from frank.kinds.engine import EngineBase
from frank.kinds.env import EnvSwitch
from frank.kinds.kernel import Kernel
from frank.kinds.package import Package
from frank.kinds.patch import Patch
from frank.kinds.plugin import Plugin
from frank.kinds.step import Step
from frank.kinds.weights import Weights

KINDS: tuple[type[PartBase], ...] = (
    EngineBase, Patch, Package, Binary, Kernel, Plugin, Data, Weights, EnvSwitch, Step,
)

AnyPart = Annotated[
    EngineBase | Patch | Package | Binary | Kernel | Plugin | Data | Weights | EnvSwitch | Step,
    Field(discriminator="kind"),
]
PART_ADAPTER: TypeAdapter[AnyPart] = TypeAdapter(AnyPart)

__all__ = ["KINDS", "PART_ADAPTER", "AnyPart", "PartBase"]
