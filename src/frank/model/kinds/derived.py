"""Derived file: a data file computed at lock time by a program in the repo from pinned inputs.

Nix and Bazel treat a generated file as a derivation: declared inputs, a pinned program, a
hashed output. A derived part is that, for a file the engine reads (an expert plan built
from routing traces). Its manifest declares:

- ``program``: a folder of the repo (hashed as a tree, like a plugin's source) and the
  ``main`` file in it. The program runs on CPython's standard library alone, with the
  interpreter that runs frank (its ``major.minor`` is part of the key): a program that
  imports anything else is refused when locked. No third-party closure means nothing to
  lock with uv and nothing to fetch; a program that needs numpy is not a derived part.
- ``inputs``: repo files, or hub files pinned by sha256 (a repo file may state its sha256
  too, checked like a data part's).
- ``params``: scalar parameters (the budget), passed as ``--name value``.
- ``output``: the file name it writes; ``dest`` and ``env_var`` or ``flag`` place it and point
  the engine at it, exactly as for a data part.

The output is made by ``frank lock`` (``resolve.derive``), hashed and recorded in the lock
beside every input's hash; the same key reuses the kept output without running. This
module only declares the part; it imports no runner.
"""

from __future__ import annotations

import sys
from pathlib import PurePosixPath
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, ConfigDict, Field, model_validator

from frank.errors import FrankError
from frank.model.kinds.base import FlagName, FlagValue, PartBase, PartContext, Strict
from frank.model.kinds.data import HubFile
from frank.model.kinds.env import EnvName
from frank.model.pins import ImagePath, OneLine, RelativePath, Sha256, matching

# Bump when the same program and inputs would be run differently (argv, environment).
RUNNER = "frank-derive-1"
ParamName = Annotated[str, AfterValidator(matching(
    r"[a-z][a-z0-9_-]*", "a parameter name (lower-case letters, digits, '_', '-')"))]
ParamValue = int | float | bool | OneLine


def _file_name(value: str) -> str:
    if "/" in value or value in (".", ".."):
        raise ValueError("a file name, not a path")
    return value


FileName = Annotated[RelativePath, AfterValidator(_file_name)]


class Program(Strict):
    """The program: a repo folder, hashed as a tree, and its main file inside it."""

    path: str
    main: RelativePath


class DerivedInput(Strict):
    """One input file: a repo path or a hub file (exactly one); a hub file needs sha256."""

    path: str | None = None
    hub: HubFile | None = None
    sha256: Sha256 | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> DerivedInput:
        if (self.path is None) == (self.hub is None):
            raise ValueError("give exactly one of path or hub")
        if self.hub is not None and self.sha256 is None:
            raise ValueError("a hub input is pinned by sha256")
        return self

    @property
    def label(self) -> str:
        """The input's name in the lock (a repo path, or hub:REPO@REV/FILE)."""
        if self.path is not None:
            return self.path
        assert self.hub is not None
        return f"hub:{self.hub.repo_id}@{self.hub.revision}/{self.hub.filename}"

    @property
    def file_name(self) -> str:
        """The name the program sees it under (``in/<name>``)."""
        return PurePosixPath(self.path if self.path is not None else
                             self.hub.filename if self.hub else "").name


def python_tag() -> str:
    """The interpreter a derived program runs on, as far as its output may depend on it:
    the implementation and ``major.minor`` (the standard library's version)."""
    return f"{sys.implementation.name}-{sys.version_info[0]}.{sys.version_info[1]}"


class Derived(PartBase):
    """A file computed from pinned inputs by a pinned program (module docstring)."""

    # `inputs` is also the protocol's method: the field is `inputs_`, spelled `inputs`
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True,
                              validate_by_name=True, validate_by_alias=True,
                              serialize_by_alias=True)
    layer_rank: ClassVar[int] = 80  # with data files
    artifact_fields: ClassVar[tuple[str, ...]] = ()

    kind: Literal["derived"]
    program: Program
    inputs_: list[DerivedInput] = Field(alias="inputs", min_length=1)
    params: dict[ParamName, ParamValue] = {}
    output: FileName
    dest: ImagePath
    env_var: EnvName | None = None
    flag: FlagName | None = None

    @model_validator(mode="after")
    def _check(self) -> Derived:
        if (self.env_var is None) == (self.flag is None):
            raise ValueError("give exactly one of env_var or flag (how the engine finds it)")
        names = [i.file_name for i in self.inputs_]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"two inputs are named {twice[0]!r}: the program sees each "
                             "input as in/<file name>, which must differ")
        return self

    def inputs(self, ctx: PartContext) -> dict[str, str]:
        out = {f"{self.program.path.rstrip('/')}/": ctx.tree_hash(self.program.path,
                                                                  "program.path")}
        main = f"{self.program.path.rstrip('/')}/{self.program.main}"
        if not ctx.path(main, "program.main").is_file():
            raise FrankError(f"{main!r} is not a file", file=ctx.manifest, field="program.main")
        for i, item in enumerate(self.inputs_):
            if item.path is not None:
                out[item.label] = ctx.file_hash(item.path, f"inputs[{i}].path", item.sha256,
                                                hash_field=f"inputs[{i}].sha256")
            else:
                assert item.sha256 is not None
                out[item.label] = item.sha256
        return out

    def derivation(self, inputs: dict[str, str]) -> dict[str, Any]:
        """What the output is a function of (its key hashes this): the program's tree and
        main file, every input's hash in order, the parameters, the output's name, the
        interpreter and the runner's version."""
        return {"program": {"tree": inputs[f"{self.program.path.rstrip('/')}/"],
                            "main": self.program.main},
                "inputs": [[i.file_name, inputs[i.label]] for i in self.inputs_],
                "params": dict(sorted(self.params.items())), "output": self.output,
                "python": python_tag(), "runner": RUNNER}

    def env(self) -> dict[str, str]:
        return {self.env_var: self.dest} if self.env_var else {}

    def flags(self) -> dict[str, FlagValue]:
        return {self.flag: self.dest} if self.flag else {}
