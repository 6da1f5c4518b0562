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
from frank.kinds.base import check_slug
from frank.project import lock_stack
from frank.tomlio import validation_to_error
from frank.trial.design import Direction, Kind, draw_order, rule_text
from frank.trial.metric import MetricError, parse
from frank.trial.model import DesignSpec, trial_path, validate_trial, write_trial
from frank.trial.seal import seal_file


def plan(a: str, b: str, *, name: str, metric: str, label: str | None, direction: Direction,
         kind: Kind, blocks: int | None, alpha: float, seed: int | None,
         starts_per_arm: int | None, seal: bool, root: Path | None = None) -> Path:
    """Write ``trials/NAME.toml`` (and seal it when asked); returns its path."""
    try:
        check_slug(name)
    except ValueError as exc:
        raise FrankError(str(exc), field="--name") from None
    path = trial_path(name, root)
    if path.exists():
        raise FrankError("trial file already exists; a plan is written once (pick a new name)",
                         file=path)
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
    if seed is None:
        seed = secrets.randbits(32)
    text = label or metric
    order = draw_order(kind, blocks, per_arm, seed)
    raw = {
        "name": name,
        "arms": {arm: {"stack": _rel(lk.resolved.stack.path), "digest": lk.lock.digest}
                 for arm, lk in locked.items()},
        "metric": {"expr": metric, "label": text, "direction": direction},
        "design": {"kind": kind, "blocks": blocks, "starts_per_arm": per_arm, "alpha": alpha,
                   "seed": seed,
                   "rule": rule_text(kind, blocks, per_arm, alpha, direction, text)},
        "order": [{"start": s.index, "block": s.block, "arm": s.arm} for s in order],
    }
    trial = validate_trial(raw, path)
    header = (f"Trial {name}: A (current) = {a}, B (candidate) = {b}.\n"
              "Written by `frank trial plan` before any start; `frank trial seal` fixes it.")
    write_trial(path, trial, header)
    if seal:
        seal_file(path)
    return path


def _rel(stack: Path) -> str:
    """A stack path as the trial stores it: relative to its repo root."""
    return stack.resolve().relative_to(find_repo_root(stack.parent)).as_posix()
