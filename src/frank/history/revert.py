"""One step back for a part, as its manifest's ``revert`` says, written into the stack file.

The stack file is edited with tomlkit so the person's comments and order stay. Where the
part was set decides the edit: a part this file adds or lists is dropped or re-versioned
in place; a part inherited from the parent is taken out with ``remove`` or moved with
``replace``. The new stack is resolved before anything is written; then the stack file,
its lock, a history entry and the locks of the stacks that extend it are written as one
journaled change (``journal.Transaction``), so a kill leaves all of it old or all new. The
caller holds the repo lock (``repolock.repo_lock``) from planning to writing, so two
reverts at once take turns and neither is lost.
"""

from __future__ import annotations

import datetime as dt
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomlkit
from tomlkit.items import Array, Table

from frank.errors import FrankError, as_real_file
from frank.history.journal import Transaction
from frank.model.catalog import Catalog
from frank.model.stack import load_stack
from frank.model.stackfiles import TEMP_MARK
from frank.resolve.lock import Lock, lock_path, render_lock
from frank.resolve.project import lock_resolved
from frank.resolve.resolver import resolve


@dataclass
class RevertResult:
    """What a revert did (or would do)."""

    part: str
    action: str
    old_version: str
    new_version: str | None
    stack_text: str
    old_text: str
    lock: Lock
    old_lock: Lock
    closure: bytes | None = None  # the Python closure's text the new lock names
    dependents: list[tuple[str, str]] = field(default_factory=list)  # (name, version)
    mappings: list[str] = field(default_factory=list)  # [from_index] entries taken with it


def _drop(doc: Any, table: str, name: str) -> None:
    tbl = doc[table]
    del tbl[name]
    if isinstance(tbl, Table) and not tbl:
        del doc[table]


def _append_remove(doc: Any, name: str) -> None:
    if "remove" not in doc:
        arr = tomlkit.array()
        arr.append(name)
        doc["remove"] = arr
    else:
        arr = doc["remove"]
        assert isinstance(arr, Array)
        arr.append(name)


def _set_in_table(doc: Any, table: str, name: str, version: str) -> None:
    if table not in doc:
        doc[table] = tomlkit.table()
    doc[table][name] = version


def edit_stack(text: str, stack_path: Path, part: str, origin: tuple[Path, str],
               action: str, to: str | None, parent_version: str | None) -> str:
    """The stack file's new text after reverting ``part``."""
    doc = tomlkit.parse(text)
    file, field = origin
    table = field.split(".", 1)[0]
    own = file == stack_path
    if action == "remove":
        if own and table in ("add", "parts"):
            _drop(doc, table, part)
        else:
            if own and table == "replace":
                _drop(doc, "replace", part)
            _append_remove(doc, part)
    else:
        assert to is not None
        if own and table in ("add", "parts"):
            doc[table][part] = to
        elif own and table == "replace" and parent_version == to:
            _drop(doc, "replace", part)
        else:
            _set_in_table(doc, "replace", part, to)
    return tomlkit.dumps(doc)


def dependents_of(part: str, requires: dict[str, list[str]]) -> list[str]:
    """Every part of the stack that requires ``part``, directly or through another
    dependent, in the order found (nearest first)."""
    out: list[str] = []
    todo = [part]
    while todo:
        current = todo.pop(0)
        for name in sorted(requires):
            if current in requires[name] and name != part and name not in out:
                out.append(name)
                todo.append(name)
    return out


def plan_revert(stack_file: Path, part: str, root: Path,
                with_dependents: bool = False) -> RevertResult:
    """Work out the revert and resolve the result, writing nothing.

    A part that others in the stack require is refused with every dependent named, unless
    ``with_dependents``: then each dependent takes its own step back too (one edit, one
    history entry). A part whose manifest says ``revert.action = "none"`` has no step back,
    and the error says so with the manifest's reason.
    """
    stack = load_stack(stack_file)
    if part not in stack.parts:
        raise FrankError(f"the stack has no part {part!r} to revert", file=stack_file,
                         field="parts")
    catalog = Catalog(root)
    manifests = {name: catalog.get(name, version, file=stack.origin[name][0],
                                   field=stack.origin[name][1])
                 for name, version in stack.parts.items()}
    requires = {name: list(m.part.requires) for name, m in manifests.items()}
    dependents = dependents_of(part, requires)
    origin = stack.origin[part]
    if dependents and not with_dependents and manifests[part].part.revert.action != "none":
        via = {d: [r for r in requires[d] if r == part or r in dependents] for d in dependents}
        said = ", ".join(f"{d} (requires {', '.join(via[d])})" for d in dependents)
        raise FrankError(f"{part} is required by {said}: revert them together with "
                         "--with-dependents (one step back, one history entry)",
                         file=stack_file, field=origin[1])
    chain = [part, *dependents] if with_dependents else [part]
    parent_parts = load_stack(stack.chain[-2]).parts if len(stack.chain) > 1 else {}
    old_text = stack_file.read_text(encoding="utf-8")
    new_text = old_text
    for name in chain:
        manifest = manifests[name]
        revert = manifest.part.revert
        if revert.action == "none":
            raise FrankError(f"{name} {stack.parts[name]} cannot be reverted: "
                             f"{revert.rule}", file=manifest.path, field="revert.action")
        if revert.action == "version":
            assert revert.to is not None
            catalog.get(name, revert.to, file=manifest.path, field="revert.to")
        new_text = edit_stack(new_text, stack.path, name, stack.origin[name], revert.action,
                              revert.to, parent_parts.get(name))
    revert = manifests[part].part.revert
    old_lock = lock_resolved(resolve(stack_file, root, catalog), stack_file, root).lock
    new_text, new_lock, closure, mappings = _lock_taking_mappings(
        stack_file, new_text, root, catalog, len(stack.from_index))
    new_lock = new_lock.model_copy(update={"stack": stack.name})
    return RevertResult(part=part, action=revert.action, old_version=stack.parts[part],
                        new_version=revert.to, stack_text=new_text, old_text=old_text,
                        lock=new_lock, old_lock=old_lock, closure=closure,
                        dependents=[(d, stack.parts[d]) for d in dependents
                                    if with_dependents], mappings=mappings)


def _lock_taking_mappings(stack_file: Path, text: str, root: Path, catalog: Catalog,
                          most: int) -> tuple[str, Lock, bytes | None, list[str]]:
    """Lock the reverted text; a ``[from_index]`` mapping of this file that nothing asks for
    any more (the reverted part brought what asked for it) is taken out with the part, and
    its index with it when nothing else comes from it (issue 54: the revert was refused)."""
    here = FrankError("", file=stack_file).file
    taken: list[str] = []
    for _ in range(most + 1):
        try:
            lock, closure = lock_text(stack_file, text, root, catalog, "revert")
            return text, lock, closure, taken
        except FrankError as exc:
            field_name = exc.field or ""
            if exc.file != here or not field_name.startswith("from_index.") or \
                    "is not in the stack's Python closure" not in exc.message:
                raise
            edited = _without_mapping(text, field_name.split(".", 1)[1])
            if edited is None:
                raise
            text = edited
            taken.append(field_name.split(".", 1)[1])
    raise AssertionError("more mappings taken than the stack has")


def _without_mapping(text: str, dist: str) -> str | None:
    """``text`` without its ``[from_index]`` entry for ``dist`` (and the ``[indexes]`` entry
    nothing of this file maps to any more); None when this file has no such entry."""
    from packaging.utils import canonicalize_name

    doc = tomlkit.parse(text)
    table = doc.get("from_index")
    key = next((k for k in (table or {}) if canonicalize_name(k) == canonicalize_name(dist)),
               None)
    if table is None or key is None:
        return None
    index = table[key]
    del table[key]
    if not table:
        del doc["from_index"]
    indexes = doc.get("indexes")
    if indexes is not None and index in indexes and index not in (
            doc.get("from_index") or {}).values():
        del indexes[index]
        if not indexes:
            del doc["indexes"]
    return tomlkit.dumps(doc)


def lock_text(stack_file: Path, text: str, root: Path, catalog: Catalog, why: str,
              known: list[dict[str, Any]] | None = None,
              closure_seed: bytes | None = None) -> tuple[Lock, bytes | None]:
    """Lock ``text`` as if it were ``stack_file``'s content, writing only temp files;
    returns the lock and the Python closure's text it names (None without a closure).

    The temp files sit beside the stack (its ``extends`` is relative) under names no
    command takes for a stack or a pylock (``stackfiles.TEMP_MARK``); one a kill leaves is
    removed under the repo lock. The closure is worked on in a copy of the real pylock:
    reused when the edit leaves it alone, re-resolved (or copied from a sibling asking the
    same) if not; the caller writes it with the stack, or never (a dry run, a refusal).
    ``closure_seed`` (an undo's earlier closure) stands in for the real pylock, so the text
    it belonged to gets it back exactly rather than what PyPI resolves to today.
    """
    from frank.resolve.closure import pylock_path

    real = pylock_path(stack_file)
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=stack_file.parent,
                                     prefix=f"{stack_file.stem}{TEMP_MARK}{why}-",
                                     suffix=".toml") as tmp, \
            tempfile.TemporaryDirectory(dir=stack_file.parent,
                                        prefix=f".{stack_file.stem}{TEMP_MARK}{why}-") as cdir:
        tmp.write(text)
        tmp.flush()
        copy = Path(cdir) / real.name
        if closure_seed is not None:
            copy.write_bytes(closure_seed)
        elif real.is_file():
            copy.write_bytes(real.read_bytes())
        try:
            resolved = resolve(Path(tmp.name), root, catalog)
            lock = lock_resolved(resolved, stack_file, root, "resolve", closure_out=copy,
                                 known=known).lock
        except FrankError as exc:  # name the stack the person edits, not the temp copy
            raise as_real_file(exc, tmp.name, stack_file) from None
        closure = copy.read_bytes() if lock.python_closure is not None and copy.is_file() \
            else None
        return lock, closure


def history_path(stack_file: Path) -> Path:
    """Where a stack's history lives: ``stacks/<name>.history.jsonl``."""
    return stack_file.with_name(f"{stack_file.stem}.history.jsonl")


def history_entry(action: str, part: str, old: str | None, new: str | None, why: str | None,
                  before: Lock, after: Lock, text_before: str) -> dict[str, Any]:
    """One history line; ``text_before`` is the stack's text before, for `revert --undo`."""
    return {
        "time": dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(),
        "action": action, "part": part, "from": old, "to": new, "why": why,
        "digest_before": before.digest, "digest_after": after.digest,
        "text_before": text_before,
        # checks made on fetched inputs (a URL patch's touches_compiled): the undo reuses
        # them, since no lock keeps one for a part the revert took out
        "verified_before": [{"name": p.name, "inputs": p.inputs, "verified": p.verified}
                            for p in before.parts if p.verified],
    }


def stage_stack_change(txn: Transaction, stack_file: Path, text: str, lock: Lock,
                       entry: dict[str, Any], closure: bytes | None = None) -> None:
    """Stage the stack's new text, its lock (and Python closure, when the change moved it),
    one history line and its dependents' relock."""
    from frank.resolve.closure import pylock_path

    hist = history_path(stack_file)
    old = hist.read_text(encoding="utf-8") if hist.is_file() else ""
    txn.write(stack_file, text)
    real = pylock_path(stack_file)
    if closure is not None and (not real.is_file() or real.read_bytes() != closure):
        if real.is_file():  # kept for `revert --undo`: the index moves on, the undo must not
            entry["closure_before"] = real.read_text(encoding="utf-8")
        txn.write(real, closure)
    txn.write(lock_path(stack_file), render_lock(lock))
    txn.write(hist, old + json.dumps(entry, sort_keys=True) + "\n")
    txn.relock_dependents_of(stack_file)


def apply_revert(stack_file: Path, result: RevertResult, why: str | None,
                 root: Path) -> list[tuple[str, str]]:
    """Write the stack file, its lock, one history line and the dependents' locks as one
    change; returns what relocking each dependent did."""
    entry = history_entry(f"revert:{result.action}", result.part, result.old_version,
                          result.new_version, why, result.old_lock, result.lock,
                          result.old_text)
    if result.dependents:  # one entry for the chain: --undo takes it all back at once
        entry["with_dependents"] = [f"{n}@{v}" for n, v in result.dependents]
    txn = Transaction(root)
    stage_stack_change(txn, stack_file, result.stack_text, result.lock, entry, result.closure)
    return txn.commit()
