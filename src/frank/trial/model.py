"""The trial file (``trials/NAME.toml``): what is fixed before any engine starts.

Everything but ``[seal]`` is the sealed part: the two stacks' lock digests, the metric and
its direction, the design with its rule, alpha and seed, and the run order. Unknown fields
are refused (a typo must not silently change a pre-registered rule).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import tomlkit
from pydantic import Field, ValidationError, model_validator

from frank.errors import FrankError
from frank.fsutil import find_repo_root, write_atomic
from frank.model.kinds.base import Slug, Strict
from frank.model.tomlio import read_toml, validation_to_error
from frank.trial.design import (
    MAX_BALANCED_PER_ARM,
    MAX_PERMUTATION_BLOCKS,
    Start,
    minimum_p,
    needed,
)


class ArmSpec(Strict):
    """One arm: the stack file (repo-relative) and its lock digest when the plan was made."""

    stack: str
    digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")


class Arms(Strict):
    """A is the current stack, B the candidate."""

    A: ArmSpec
    B: ArmSpec


class MetricSpec(Strict):
    """What one start measures: an expression over Prometheus deltas and/or ``json:KEY``."""

    expr: str
    label: str
    direction: Literal["lower", "higher"]


class DesignSpec(Strict):
    """The design, its rule in words, and what drew the order."""

    kind: Literal["blocks", "balanced", "permutation"]
    blocks: int = Field(ge=1)
    starts_per_arm: int = Field(ge=1)  # per block; all starts for the balanced design
    alpha: float = Field(gt=0, lt=1)
    seed: int = Field(ge=0)
    rule: str

    @model_validator(mode="after")
    def _can_pass(self) -> DesignSpec:
        if self.kind == "balanced":
            if self.blocks != 1:
                raise ValueError("a balanced design is one block of n + n starts (blocks = 1)")
            if self.starts_per_arm > MAX_BALANCED_PER_ARM:
                raise ValueError(f"at most {MAX_BALANCED_PER_ARM} starts per arm are enumerated")
        else:
            if self.starts_per_arm != 1:
                raise ValueError(f"a {self.kind} design has one start per arm per block")
            if self.kind == "permutation" and self.blocks > MAX_PERMUTATION_BLOCKS:
                raise ValueError(f"at most {MAX_PERMUTATION_BLOCKS} blocks are enumerated")
        p = minimum_p(self.kind, self.blocks, self.starts_per_arm)
        if float(p) > self.alpha:
            what = "starts per arm" if self.kind == "balanced" else "blocks"
            count = self.starts_per_arm if self.kind == "balanced" else self.blocks
            raise ValueError(
                f"too few {what} for the rule to ever pass: {count} {what} give at best "
                f"p = {p.numerator}/{p.denominator} = {float(p):.4g} > alpha {self.alpha:g}; "
                f"need at least {needed(self.kind, self.alpha)}")
        return self


class SubjectSpec(Strict):
    """What the trial is about: the one part B changes, and how. ``adopt`` touches that part
    and nothing else; sealing it means no later reading of the arms can change it."""

    part: Slug
    change: Literal["add", "remove", "version"]
    a: Slug | None = None  # the part's version in arm A (none when B adds it)
    b: Slug | None = None  # the part's version in arm B (none when B removes it)

    @model_validator(mode="after")
    def _versions_fit_change(self) -> SubjectSpec:
        want = {"add": (False, True), "remove": (True, False), "version": (True, True)}
        if ((self.a is not None), (self.b is not None)) != want[self.change]:
            raise ValueError({"add": "an add has b (B's version) and no a",
                              "remove": "a remove has a (A's version) and no b",
                              "version": "a version change has both a and b"}[self.change])
        if self.change == "version" and self.a == self.b:
            raise ValueError(f"a and b are both {self.a!r}: that is no change")
        return self

    def describe(self) -> str:
        """``add region-cache 1``, ``remove rs8 1``, ``expert-plan published -> own-traffic``."""
        if self.change == "version":
            return f"{self.part} {self.a} -> {self.b}"
        return f"{self.change} {self.part} {self.b if self.change == 'add' else self.a}"


class StartSpec(Strict):
    """One start of the sealed order."""

    start: int = Field(ge=1)
    block: int = Field(ge=1)
    arm: Literal["A", "B"]


class SealSpec(Strict):
    """The content hash of the sealed part, per-field hashes (to name what changed), time."""

    hash: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    time: str
    fields: dict[str, str]


class Trial(Strict):
    """A trial file's content."""

    name: Slug
    arms: Arms
    subject: SubjectSpec | None = None  # None only in plans sealed before subjects were
    metric: MetricSpec
    design: DesignSpec
    order: list[StartSpec]
    seal: SealSpec | None = None

    @model_validator(mode="after")
    def _order_fits_design(self) -> Trial:
        d = self.design
        expected = 2 * d.starts_per_arm * d.blocks
        if len(self.order) != expected:
            raise ValueError(f"order has {len(self.order)} starts; the design needs {expected}")
        for i, s in enumerate(self.order, start=1):
            if s.start != i:
                raise ValueError(f"order[{i - 1}] is start {s.start}; starts count 1, 2, ...")
            if s.block > d.blocks:
                raise ValueError(f"start {i} is in block {s.block} of {d.blocks}")
        for block in range(1, d.blocks + 1):
            arms = [s.arm for s in self.order if s.block == block]
            if arms.count("A") != d.starts_per_arm or arms.count("B") != d.starts_per_arm:
                raise ValueError(f"block {block} must hold {d.starts_per_arm} start(s) per arm")
        return self

    def starts(self) -> list[Start]:
        """The order as design starts."""
        return [Start(s.start, s.block, s.arm) for s in self.order]


def trial_path(name_or_path: str, root: Path | None = None) -> Path:
    """``NAME`` -> ``<repo>/trials/NAME.toml``; a path ending in .toml is taken as is."""
    if name_or_path.endswith(".toml"):
        return Path(name_or_path).resolve()
    base = root if root is not None else find_repo_root(Path.cwd())
    return base / "trials" / f"{name_or_path}.toml"


def results_path(trial_file: Path) -> Path:
    """Results live beside the trial: ``trials/NAME.results.jsonl``."""
    return trial_file.with_name(f"{trial_file.stem}.results.jsonl")


def repo_of(trial_file: Path) -> Path:
    """The repo a trial file belongs to (stack paths in it are relative to that)."""
    return find_repo_root(trial_file.parent)


def read_trial(path: Path) -> Trial:
    """Parse and validate a trial file (the seal is checked by ``seal.verify``)."""
    if not path.is_file():
        raise FrankError("trial file not found (make it with `frank trial plan`)", file=path)
    return validate_trial(read_toml(path), path)


def validate_trial(raw: dict[str, Any], path: Path) -> Trial:
    """Validate trial content; "too few blocks" names the count that is too small."""
    try:
        return Trial.model_validate(raw)
    except ValidationError as exc:
        err = validation_to_error(exc, path)
        if err.field == "design" and err.message.startswith("too few"):
            balanced = raw.get("design", {}).get("kind") == "balanced"
            err.field = "design.starts_per_arm" if balanced else "design.blocks"
        raise err from None


def render_trial(trial: Trial, header: str | None = None) -> str:
    """The trial as TOML: comments for people, one start per line in the order."""
    doc = tomlkit.document()
    for line in (header or "").splitlines():
        doc.add(tomlkit.comment(line))
    data: dict[str, Any] = trial.model_dump(mode="json", exclude_none=True)
    doc["name"] = data["name"]
    arms = tomlkit.table()
    for key in ("A", "B"):
        arm = tomlkit.table()
        arm.update(data["arms"][key])
        arm.comment("current" if key == "A" else "candidate")
        arms[key] = arm
    doc["arms"] = arms
    if "subject" in data:
        subject = tomlkit.table()
        subject.update(data["subject"])
        subject.comment("what B changes: the one part `frank trial adopt` may touch")
        doc["subject"] = subject
    for section in ("metric", "design"):
        table = tomlkit.table()
        table.update(data[section])
        doc[section] = table
    order = tomlkit.array()
    order.multiline(True)
    for s in data["order"]:
        item = tomlkit.inline_table()
        item.update(s)
        order.append(item)
    doc["order"] = order
    if "seal" in data:
        seal = tomlkit.table()
        seal["hash"] = data["seal"]["hash"]
        seal["time"] = data["seal"]["time"]
        fields = tomlkit.table()
        fields.update(data["seal"]["fields"])
        seal["fields"] = fields
        doc["seal"] = seal
    return tomlkit.dumps(doc)


def write_trial(path: Path, trial: Trial, header: str | None = None) -> None:
    """Write the trial file atomically."""
    write_atomic(path, render_trial(trial, header))
