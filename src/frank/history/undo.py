"""`frank revert --undo`: take back a stack's last revert, from its history file.

Why from the history: each revert line keeps the stack's text from before it
(``text_before``), so undoing is putting that text back, exactly, comments and all. It is
refused when the stack moved on since (its digest is not the one the revert left), since
putting the old text back would then also drop the later change. An undo is itself a
history line (``undo:...`` with ``undoes``, the line number it takes back), so undoing
again takes back the revert before it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frank.errors import NESTED_TOO_DEEP, FrankError
from frank.history.journal import Transaction
from frank.history.revert import history_entry, history_path, lock_text, stage_stack_change
from frank.model.catalog import Catalog
from frank.model.stack import load_stack
from frank.resolve.lock import Lock
from frank.resolve.project import lock_resolved
from frank.resolve.resolver import resolve


@dataclass
class UndoResult:
    """What an undo does (or would do)."""

    seq: int
    entry: dict[str, Any]
    stack_text: str
    old_text: str
    lock: Lock
    old_lock: Lock
    closure: bytes | None = None  # the Python closure's text the new lock names


def read_history(stack_file: Path) -> list[dict[str, Any]]:
    """The stack's history lines, oldest first; a damaged line is a one-line error."""
    path = history_path(stack_file)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    out = []
    for n, line in enumerate(lines, 1):
        try:
            doc = json.loads(line)
        except json.JSONDecodeError:
            raise FrankError(f"line {n} is not JSON", file=path) from None
        except RecursionError:
            raise FrankError(NESTED_TOO_DEEP, file=path, field=f"line {n}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("action"), str):
            raise FrankError(f"line {n} has no action", file=path)
        out.append(doc)
    return out


def last_revert(stack_file: Path) -> tuple[int, dict[str, Any]]:
    """(line index, entry) of the last change not yet undone; it must be a revert."""
    hist = history_path(stack_file)
    live: list[tuple[int, dict[str, Any]]] = []
    for i, entry in enumerate(read_history(stack_file)):
        if entry["action"].startswith("undo:"):
            live = [(j, e) for j, e in live if j != entry.get("undoes")]
        else:
            live.append((i, entry))
    if not live:
        raise FrankError("nothing to undo: no revert in the history that is not undone",
                         file=hist)
    seq, entry = live[-1]
    if not entry["action"].startswith("revert:"):
        raise FrankError(f"the last change here was {entry['action']} of "
                         f"{entry.get('part')}, not a revert; undo takes back a revert only",
                         file=hist, field=f"line {seq + 1}")
    if not isinstance(entry.get("text_before"), str):
        raise FrankError("this revert was recorded without the stack's earlier text; "
                         "undo it by hand", file=hist, field=f"line {seq + 1}")
    return seq, entry


def plan_undo(stack_file: Path, root: Path) -> UndoResult:
    """Work out the undo and resolve its result, writing nothing."""
    seq, entry = last_revert(stack_file)
    catalog = Catalog(root)
    old_text = stack_file.read_text(encoding="utf-8")
    old_lock = lock_resolved(resolve(stack_file, root, catalog), stack_file, root).lock
    if old_lock.digest != entry.get("digest_after"):
        raise FrankError(f"the stack changed since the revert of {entry.get('part')} (it locks "
                         f"to {old_lock.digest[:19]}, the revert left "
                         f"{str(entry.get('digest_after'))[:19]}); undo it by hand",
                         file=stack_file)
    text = entry["text_before"]
    seed = entry.get("closure_before")
    lock, closure = lock_text(stack_file, text, root, catalog, "undo",
                              known=entry.get("verified_before"),
                              closure_seed=seed.encode() if isinstance(seed, str) else None)
    lock = lock.model_copy(update={"stack": load_stack(stack_file).name})
    if lock.digest != entry.get("digest_before"):
        raise FrankError(f"the stack's earlier text now locks to {lock.digest[:19]}, not the "
                         f"{str(entry.get('digest_before'))[:19]} it had (a part changed "
                         "since); undo it by hand", file=stack_file)
    return UndoResult(seq=seq, entry=entry, stack_text=text, old_text=old_text, lock=lock,
                      old_lock=old_lock, closure=closure)


def apply_undo(stack_file: Path, result: UndoResult, root: Path) -> list[tuple[str, str]]:
    """Put the earlier text back with its lock, one history line and the dependents' locks."""
    e = result.entry
    entry = history_entry("undo:" + e["action"], str(e.get("part")), e.get("to"),
                          e.get("from"), f"undo of the revert at {e.get('time')}",
                          result.old_lock, result.lock, result.old_text)
    entry["undoes"] = result.seq
    txn = Transaction(root)
    stage_stack_change(txn, stack_file, result.stack_text, result.lock, entry, result.closure)
    return txn.commit()
