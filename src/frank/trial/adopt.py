"""`frank trial adopt`: the decision goes into the part's manifest and, if adopted, the stack.

Why the checks before writing: adopting must give the served stack exactly the variant the
trial measured (when the served stack was arm A, the result must lock to arm B's digest),
and the part's one-step revert must still take the stack back to where it was. Files are
edited with tomlkit so the comments people wrote stay; nothing is written unless all of it
checks out.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomlkit
from pydantic import ValidationError

from frank.catalog import Catalog
from frank.errors import FrankError
from frank.fsutil import write_atomic
from frank.journal import Transaction
from frank.kinds import PART_ADAPTER
from frank.lock import Lock, build_lock, lock_path
from frank.project import stack_path
from frank.repolock import repo_lock
from frank.resolve import resolve
from frank.revert import edit_stack, history_entry, plan_revert, stage_stack_change
from frank.stack import load_stack
from frank.stackfiles import TEMP_MARK, stack_files
from frank.tomlio import validation_to_error
from frank.trial.decide import Decision, decide_file
from frank.trial.model import Trial, repo_of
from frank.trial.run import current_locks
from frank.trial.seal import load_sealed


@dataclass(frozen=True)
class Change:
    """The one part the candidate changes: added, removed, or moved to another version."""

    part: str
    action: str  # "add" | "remove" | "version"
    old: str | None
    new: str | None


def candidate_change(trial: Trial, trial_file: Path) -> Change:
    """The single part in which B differs from A (from the arms' current, sealed locks)."""
    locks = current_locks(trial, trial_file)
    a = {p["name"]: p["version"] for p in locks["A"]["parts"]}
    b = {p["name"]: p["version"] for p in locks["B"]["parts"]}
    changes = [Change(n, "add", None, b[n]) for n in sorted(set(b) - set(a))]
    changes += [Change(n, "remove", a[n], None) for n in sorted(set(a) - set(b))]
    changes += [Change(n, "version", a[n], b[n]) for n in sorted(set(a) & set(b))
                if a[n] != b[n]]
    if len(changes) != 1:
        what = ", ".join(f"{c.action} {c.part}" for c in changes) or "no part"
        raise FrankError(f"a candidate is the current stack with one part added, removed or "
                         f"changed; B differs from A by {what}", file=trial_file, field="arms")
    return changes[0]


def _manifest_text(path: Path, status: str, decision: Decision) -> str:
    doc = tomlkit.parse(path.read_text(encoding="utf-8"))
    doc["status"] = status
    evidence = tomlkit.table()
    evidence["rule"] = decision.rule
    evidence["result"] = decision.summary()
    evidence["design"] = decision.design
    evidence["trial"] = f"{decision.trial} {decision.digest}"
    doc["evidence"] = evidence
    text = tomlkit.dumps(doc)
    try:
        PART_ADAPTER.validate_python(tomllib.loads(text))
    except ValidationError as exc:
        raise validation_to_error(exc, path) from None
    return text


def _add_to_stack(text: str, stack_file: Path, part: str, version: str) -> str:
    """The stack file's text with ``part`` added at ``version`` (root or child stack)."""
    doc = tomlkit.parse(text)
    stack = load_stack(stack_file)
    if "extends" not in doc:
        doc["parts"][part] = version
        return tomlkit.dumps(doc)
    removed = doc.get("remove")
    parent = load_stack(stack.chain[-2])
    if removed is not None and part in removed:
        removed.remove(part)
        if not removed:
            del doc["remove"]
        if parent.parts.get(part) != version:
            doc.setdefault("replace", tomlkit.table())[part] = version
    else:
        doc.setdefault("add", tomlkit.table())[part] = version
    return tomlkit.dumps(doc)


def _new_stack(stack_file: Path, change: Change, root: Path) -> str:
    text = stack_file.read_text(encoding="utf-8")
    stack = load_stack(stack_file)
    if change.action == "add":
        assert change.new is not None
        if change.part in stack.parts:
            if stack.parts[change.part] == change.new:
                raise FrankError(f"{change.part} {change.new} is already in the stack",
                                 file=stack_file, field="parts")
            return _version(text, stack, change.part, change.new)
        return _add_to_stack(text, stack.path, change.part, change.new)
    if change.part not in stack.parts:
        raise FrankError(f"the stack has no part {change.part!r} to {change.action}",
                         file=stack_file, field="parts")
    if change.action == "remove":
        return edit_stack(text, stack.path, change.part, stack.origin[change.part], "remove",
                          None, None)
    assert change.new is not None
    return _version(text, stack, change.part, change.new)


def _version(text: str, stack: Any, part: str, version: str) -> str:
    parent_version = None
    if len(stack.chain) > 1:
        parent_version = load_stack(stack.chain[-2]).parts.get(part)
    return edit_stack(text, stack.path, part, stack.origin[part], "version", version,
                      parent_version)


def _served_file(into: str, root: Path) -> Path:
    """``--into`` as a path (repo-relative or absolute) or a stack name."""
    if into.endswith(".toml") or "/" in into:
        path = Path(into) if Path(into).is_absolute() else root / into
        return stack_path(str(path), root)
    return stack_path(into, root)


def adopt(trial_file: Path, into: str, *, rejected: bool = False) -> str:
    """Record the decision; if adopted, change the served stack. Returns a one-line report."""
    trial, digest = load_sealed(trial_file)
    decision = decide_file(trial_file)
    root = repo_of(trial_file)
    change = candidate_change(trial, trial_file)
    catalog = Catalog(root)
    version = change.old if change.action == "remove" else change.new
    assert version is not None
    manifest = catalog.manifest_path(change.part, version)
    adopted = decision.outcome.passed
    if change.action == "remove":
        status = "parked" if adopted else None
    else:
        status = "served" if adopted else ("rejected" if rejected else "parked")
    writes: list[tuple[Path, str]] = []
    if status is not None:
        writes.append((manifest, _manifest_text(manifest, status, decision)))
    if not adopted:
        for path, text in writes:
            write_atomic(path, text)
        where = f"; {manifest.relative_to(root)} is {status}" if status else ""
        return f"{trial.name}: do not adopt ({decision.outcome.statistic}, p = " \
               f"{decision.outcome.p_exact}){where}"

    stack_file = _served_file(into, root)
    with repo_lock(root):  # read the stack and write it back in one turn
        new_lock, new_text, old_lock = _checked_adoption(stack_file, change, trial, root,
                                                         catalog, manifest)
        entry = history_entry(f"adopt:{change.action}", change.part, change.old, change.new,
                              f"trial {trial.name} {digest}: {decision.summary()}", old_lock,
                              new_lock, stack_file.read_text(encoding="utf-8"))
        txn = Transaction(root)
        for path, text in writes:
            txn.write(path, text)
        stage_stack_change(txn, stack_file, new_text, new_lock, entry)
        txn.commit()
    stale = _stale_locks(root, change.part, stack_file)
    note = (f"; {len(stale)} other lock(s) list {change.part} with its old manifest "
            f"({', '.join(stale)}): run `frank lock` on them (digests are unchanged)"
            if stale else "")
    return (f"{trial.name}: adopt ({decision.outcome.statistic}, p = "
            f"{decision.outcome.p_exact}); {change.part} {change.action} into "
            f"{stack_file.relative_to(root)}; digest {old_lock.digest[:19]} -> "
            f"{new_lock.digest[:19]}{note}")


def _checked_adoption(stack_file: Path, change: Change, trial: Trial, root: Path,
                      catalog: Catalog, manifest: Path) -> tuple[Lock, str, Lock]:
    """(new lock, new stack text, old lock) once adopting is known to be exactly arm B
    and the part's revert still leads back."""
    old_lock = build_lock(resolve(stack_file, root, catalog))
    new_text = _new_stack(stack_file, change, root)
    tmp = stack_file.with_name(f"{stack_file.stem}{TEMP_MARK}adopt.toml")
    try:
        tmp.write_text(new_text, encoding="utf-8")
        new_lock = build_lock(resolve(tmp, root, catalog))
        if change.action != "remove":  # the one-step revert must lead back exactly
            try:
                back = plan_revert(tmp, change.part, root)
            except FrankError as exc:
                raise FrankError(f"after adopting, `frank revert {change.part}` would fail "
                                 f"({exc.message}); the one-step revert must stay intact",
                                 file=stack_file, field="revert") from None
            if back.lock.digest != old_lock.digest:
                raise FrankError(
                    f"the part's revert ({back.action}"
                    f"{' to ' + str(back.new_version) if back.new_version else ''}) would not "
                    f"return {stack_file.name} to {old_lock.digest}; fix its [revert] first",
                    file=manifest, field="revert")
    finally:
        tmp.unlink(missing_ok=True)
    new_lock = new_lock.model_copy(update={"stack": stack_file.stem})
    if old_lock.digest == trial.arms.A.digest and new_lock.digest != trial.arms.B.digest:
        raise FrankError(f"{stack_file.name} is arm A, but adopting would lock it to "
                         f"{new_lock.digest}, not the measured arm B {trial.arms.B.digest}",
                         file=stack_file)
    return new_lock, new_text, old_lock


def _stale_locks(root: Path, part: str, served: Path) -> list[str]:
    """Lock files (other than the served stack's) that hold ``part``: their manifest hash
    and status are now out of date, though the status is not in any digest."""
    out = []
    for lock in stack_files(root, ".lock"):
        if lock == lock_path(served):
            continue
        try:
            data = json.loads(lock.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        if any(p.get("name") == part for p in data.get("parts", [])):
            out.append(lock.relative_to(root).as_posix())
    return out
