"""`frank trial plan`: write the trial file before anything runs.

Why lock both stacks now: the trial is about two exact variants; their lock digests go into
the sealed part, and every start is later checked against them.
"""

from __future__ import annotations

import secrets
from pathlib import Path

from pydantic import ValidationError

from frank.errors import FrankError
from frank.fsutil import find_repo_root
from frank.model.kinds.base import check_slug
from frank.model.tomlio import validation_to_error
from frank.resolve.project import lock_stack
from frank.trial.design import Direction, Kind, draw_order, rule_text
from frank.trial.metric import MetricError, parse
from frank.trial.model import (
    DesignSpec,
    SubjectSpec,
    trial_path,
    validate_trial,
    write_trial,
)
from frank.trial.seal import seal_file


def plan(a: str, b: str, *, name: str, metric: str, label: str | None, direction: Direction,
         kind: Kind, blocks: int | None, alpha: float, seed: int | None,
         starts_per_arm: int | None, seal: bool, root: Path | None = None,
         subject: str | None = None) -> Path:
    """Write ``trials/NAME.toml`` (and seal it when asked); returns its path.

    ``subject``, if given, is the part the caller means the trial to be about; it must be
    the one part in which B differs from A (the plan records that part and its change).
    """
    try:
        check_slug(name)
    except ValueError as exc:
        raise FrankError(str(exc), field="--name") from None
    path = trial_path(name, root)
    if path.exists():
        raise FrankError(f"trial file already exists; a plan is written once: run it with "
                         f"`frank trial run {name} --workload CMD`, or plan a new one with "
                         f"another --name", file=path)
    try:
        parse(metric)
    except MetricError as exc:
        raise FrankError(str(exc), field="--metric") from None
    if kind == "balanced":
        if blocks not in (None, 1):
            raise FrankError("a balanced design is one block of n + n starts; use "
                             "--starts-per-arm, not --blocks", field="--blocks")
        blocks, per_arm = 1, starts_per_arm or 4
    else:
        if blocks is None:
            raise FrankError(f"the {kind} design needs --blocks N", field="--blocks")
        if starts_per_arm not in (None, 1):
            raise FrankError(f"the {kind} design has one start per arm per block",
                             field="--starts-per-arm")
        per_arm = 1
    try:  # the design is checked before any stack is locked: a rule that cannot pass is moot
        DesignSpec(kind=kind, blocks=blocks, starts_per_arm=per_arm, alpha=alpha, seed=0,
                   rule="")
    except ValidationError as exc:
        err = validation_to_error(exc, path)
        option = "--starts-per-arm" if kind == "balanced" else "--blocks"
        raise FrankError(err.message, field=option) from None
    locked = {arm: lock_stack(stack) for arm, stack in (("A", a), ("B", b))}
    if locked["A"].lock.digest == locked["B"].lock.digest:
        raise FrankError(f"{a} and {b} lock to the same digest {locked['A'].lock.digest}: "
                         "there is nothing to compare", field="B")
    found = subject_between(*({p.name: p.version for p in locked[arm].lock.parts}
                               for arm in ("A", "B")))
    if isinstance(found, str):
        raise FrankError(f"a trial is about one part: B must be A with one part added, removed "
                         f"or at another version; {b} differs from {a} by {found}", field="B")
    if subject is not None and subject != found.part:
        raise FrankError(f"B differs from A in {found.part} ({found.describe()}), not in "
                         f"{subject}", field="--subject")
    if seed is None:
        seed = secrets.randbits(32)
    text = label or metric
    order = draw_order(kind, blocks, per_arm, seed)
    raw = {
        "name": name,
        "arms": {arm: {"stack": _rel(lk.resolved.stack.path), "digest": lk.lock.digest}
                 for arm, lk in locked.items()},
        "subject": found.model_dump(mode="json", exclude_none=True),
        "metric": {"expr": metric, "label": text, "direction": direction},
        "design": {"kind": kind, "blocks": blocks, "starts_per_arm": per_arm, "alpha": alpha,
                   "seed": seed,
                   "rule": rule_text(kind, blocks, per_arm, alpha, direction, text)},
        "order": [{"start": s.index, "block": s.block, "arm": s.arm} for s in order],
    }
    trial = validate_trial(raw, path)
    header = (f"Trial {name}: A (current) = {a}, B (candidate) = {b}: "
              f"{found.describe()}.\n"
              "Written by `frank trial plan` before any start; `frank trial seal` fixes it.")
    write_trial(path, trial, header)
    if seal:
        seal_file(path)
    return path


def _rel(stack: Path) -> str:
    """A stack path as the trial stores it: relative to its repo root."""
    return stack.resolve().relative_to(find_repo_root(stack.parent)).as_posix()


def subject_between(a: dict[str, str], b: dict[str, str]) -> SubjectSpec | str:
    """The one part (name -> version maps of the two arms) in which B differs from A, or,
    when there is not exactly one, the differences in words."""
    changes = [SubjectSpec(part=n, change="add", b=b[n]) for n in sorted(set(b) - set(a))]
    changes += [SubjectSpec(part=n, change="remove", a=a[n]) for n in sorted(set(a) - set(b))]
    changes += [SubjectSpec(part=n, change="version", a=a[n], b=b[n])
                for n in sorted(set(a) & set(b)) if a[n] != b[n]]
    if len(changes) == 1:
        return changes[0]
    return ", ".join(c.describe() for c in changes) or "no part (only flags, env or model)"
