"""Env switch: variables and their values, set in the image config and at serve time."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import AfterValidator, field_validator

from frank.model.kinds.base import PartBase, refuse_case_clash
from frank.model.pins import OneLine, matching

check_env_name = matching(r"[A-Za-z_][A-Za-z0-9_]*", "an environment variable name")


EnvName = Annotated[str, AfterValidator(check_env_name)]
# A value the image config and the launcher pass on as it is: one line, no NUL.
EnvValue = OneLine


class EnvSwitch(PartBase):
    """A switch the engine or a runtime reads from its environment."""

    layer_rank: ClassVar[int] = 95
    artifact_fields: ClassVar[tuple[str, ...]] = ("variables",)

    kind: Literal["env"]
    variables: dict[EnvName, EnvValue] | None = None

    @field_validator("variables")
    @classmethod
    def _not_empty(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is not None and not value:
            raise ValueError("an env switch needs at least one variable")
        refuse_case_clash(value or {}, "variables")
        return value

    def env(self) -> dict[str, str]:
        return dict(self.variables or {})
