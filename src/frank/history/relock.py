"""Relock every stack that extends a changed one: what a finished revert, undo or journal
replay does last. Apart from revert so the journal (which replays it) needs no revert."""

from __future__ import annotations

from pathlib import Path

from frank.errors import FrankError
from frank.model.stack import load_stack
from frank.model.stackfiles import stack_files
from frank.resolve.lock import lock_path, write_lock
from frank.resolve.project import lock_resolved
from frank.resolve.resolver import resolve


def relock_dependents(stack_file: Path, root: Path) -> list[tuple[str, str]]:
    """Relock every stack that extends ``stack_file`` (directly or not).

    Returns (stack file name, "relocked" or the one-line reason it no longer resolves):
    a child that now fails keeps its old lock, so `frank lock --check` points at it.
    """
    out = []
    target = stack_file.resolve()
    for other in stack_files(root):
        if other.resolve() == target:
            continue
        try:
            chain = load_stack(other).chain
        except FrankError:
            continue
        if target not in chain:
            continue
        try:
            write_lock(lock_resolved(resolve(other, root), other, root, "resolve").lock,
                       lock_path(other))
            out.append((other.name, "relocked"))
        except FrankError as exc:
            out.append((other.name, exc.one_line()))
    return out
