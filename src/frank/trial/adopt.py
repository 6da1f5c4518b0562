"""`frank trial adopt`: the decision goes into the trial's subject part and, if adopted, the
served stack.

Why it works from the sealed ``[subject]`` and plans every write before making one: an adopt
that guessed its part from the arms once parked a served part on a trial about removing it,
replaced that part's stronger evidence, and left three locks stale. Now the part and its
change come from the sealed plan; only that part's manifest and that part's entry in the
served stack change; its evidence gains one entry (earlier ones stay); a status that would
leave a parked or rejected part in any stack is not written (the part keeps its status and
the report says which stack holds it); and every stack whose lock the change touches is
relocked. Nothing is written unless all of it checks out. Files are edited with tomlkit so
the comments people wrote stay.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomlkit
from pydantic import ValidationError
from tomlkit.items import AoT, Table

from frank.errors import FrankError, as_real_file
from frank.hashing import sha256_bytes
from frank.history.journal import Transaction
from frank.history.repolock import repo_lock
from frank.history.revert import edit_stack, history_entry, history_path, plan_revert
from frank.model.catalog import Catalog, Manifest
from frank.model.kinds import PART_ADAPTER
from frank.model.stack import load_stack
from frank.model.stackfiles import TEMP_MARK, stack_files
from frank.model.tomlio import validation_to_error
from frank.resolve.lock import Lock, lock_is_current, lock_path, render_lock
from frank.resolve.project import lock_resolved, stack_path
from frank.resolve.resolver import resolve
from frank.resolve.standing import SHELVED
from frank.trial.decide import Decision, decide_file
from frank.trial.model import SubjectSpec, Trial, repo_of
from frank.trial.plan import subject_between
from frank.trial.run import current_locks
from frank.trial.seal import load_sealed


def sealed_subject(trial: Trial, trial_file: Path) -> SubjectSpec:
    """The sealed subject, checked against the arms as they lock now (their digests are
    the sealed ones, or ``current_locks`` refuses)."""
    if trial.subject is None:
        raise FrankError("the sealed plan names no [subject] (it was planned before trials "
                         "had one), so adopt cannot know which part it is about; plan it "
                         "again under a new name", file=trial_file, field="subject")
    locks = current_locks(trial, trial_file)
    found = subject_between(*({p["name"]: p["version"] for p in locks[arm]["parts"]}
                              for arm in ("A", "B")))
    if found != trial.subject:
        now = found if isinstance(found, str) else found.describe()
        raise FrankError(f"the sealed subject is {trial.subject.describe()}, but B differs "
                         f"from A by {now}", file=trial_file, field="subject")
    return trial.subject


@dataclass(frozen=True)
class StackEdit:
    """The served stack's new text and its locks before and after."""

    file: Path
    text: str
    old: Lock
    new: Lock


class _Staged(Catalog):
    """The catalog with one manifest as it will be written (for the locks it will give)."""

    def __init__(self, root: Path, staged: Manifest):
        super().__init__(root)
        self.staged = staged

    def get(self, name: str, version: str, *, file: Path, field: str) -> Manifest:
        if (name, version) == (self.staged.part.name, self.staged.part.version):
            return self.staged
        return super().get(name, version, file=file, field=field)


@dataclass(frozen=True)
class _StagedManifest(Manifest):
    text: str = ""

    @property
    def sha256(self) -> str:
        return sha256_bytes(self.text.encode("utf-8"))


def _evidence_entry(decision: Decision) -> dict[str, str]:
    return {"rule": decision.rule, "result": decision.summary(), "design": decision.design,
            "trial": f"{decision.trial} {decision.digest}"}


def _manifest_text(path: Path, status: str | None, decision: Decision) -> str:
    """The manifest with the trial's evidence appended (a lone ``[evidence]`` table becomes
    the first of ``[[evidence]]``) and, if given, its new status."""
    doc = tomlkit.parse(path.read_text(encoding="utf-8"))
    entry = _evidence_entry(decision)
    old = doc.get("evidence")
    entries: list[Any] = [] if old is None else list(old) if isinstance(old, AoT | list) \
        else [old]
    if any(e.get("trial") == entry["trial"] for e in entries):
        raise FrankError(f"trial {entry['trial']} is already in its evidence: it was adopted "
                         "before", file=path, field="evidence")
    if status is not None:
        doc["status"] = status
    aot = tomlkit.aot()
    for e in entries:
        if isinstance(e, Table):
            aot.append(e)
        else:
            table = tomlkit.table()
            table.update(e)
            aot.append(table)
    new = tomlkit.table()
    new.update(entry)
    aot.append(new)
    if old is not None:
        del doc["evidence"]
    doc.append("evidence", aot)
    text = tomlkit.dumps(doc).replace("\n\n\n[[evidence]]", "\n\n[[evidence]]")
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


def _new_stack(stack_file: Path, subject: SubjectSpec) -> str:
    """The served stack's text with the subject's change made, and only that."""
    text = stack_file.read_text(encoding="utf-8")
    stack = load_stack(stack_file)
    part = subject.part
    if subject.change == "remove":
        if part not in stack.parts:
            raise FrankError(f"the stack has no part {part!r} to remove", file=stack_file,
                             field="parts")
        return edit_stack(text, stack.path, part, stack.origin[part], "remove", None, None)
    assert subject.b is not None
    if stack.parts.get(part) == subject.b:
        raise FrankError(f"{part} {subject.b} is already in the stack", file=stack_file,
                         field="parts")
    if part in stack.parts:
        return _version(text, stack, part, subject.b)
    if subject.change == "version":
        raise FrankError(f"the stack has no part {part!r} to move to {subject.b}",
                         file=stack_file, field="parts")
    return _add_to_stack(text, stack.path, part, subject.b)


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


def _checked_edit(stack_file: Path, subject: SubjectSpec, trial: Trial, root: Path,
                  catalog: Catalog, manifest: Path) -> StackEdit:
    """The served stack's change, once it is known to change only the subject, to give
    exactly arm B when the stack is arm A, and to keep the part's one-step revert."""
    old_lock = _lock(stack_file, stack_file, root, catalog)
    new_text = _new_stack(stack_file, subject)
    tmp = stack_file.with_name(f"{stack_file.stem}{TEMP_MARK}adopt.toml")
    try:
        tmp.write_text(new_text, encoding="utf-8")
        try:
            new_lock = _lock(tmp, stack_file, root, catalog)
        except FrankError as exc:  # name the served stack, not its staged copy
            raise as_real_file(exc, tmp, stack_file) from None
        if subject.change != "remove":  # the one-step revert must lead back exactly
            try:
                back = plan_revert(tmp, subject.part, root)
            except FrankError as exc:
                raise FrankError(f"after adopting, `frank revert {subject.part}` would fail "
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
    before = {p.name: p.version for p in old_lock.parts}
    after = {p.name: p.version for p in new_lock.parts}
    if subject_between(before, after) != subject:  # belt and braces: only that part moved
        raise FrankError(f"adopting would change more than {subject.describe()}",
                         file=stack_file)
    if old_lock.digest == trial.arms.A.digest and new_lock.digest != trial.arms.B.digest:
        raise FrankError(f"{stack_file.name} is arm A, but adopting would lock it to "
                         f"{new_lock.digest}, not the measured arm B {trial.arms.B.digest}",
                         file=stack_file)
    return StackEdit(stack_file.resolve(), new_text, old_lock, new_lock)


def _lock(source: Path, stack_file: Path, root: Path, catalog: Catalog) -> Lock:
    """The lock ``stack_file`` gets when its text is ``source``'s (a staged copy)."""
    return lock_resolved(resolve(source, root, catalog), stack_file, root).lock.model_copy(
        update={"stack": stack_file.stem})


def _resolve_all(root: Path, catalog: Catalog, edit: StackEdit | None
                 ) -> dict[Path, Lock | FrankError]:
    """Every stack's lock with the served stack's edit in place (resolved from a scratch copy
    of stacks/, so a child of the served stack sees its parent's new text); a stack that does
    not resolve maps to its error."""
    out: dict[Path, Lock | FrankError] = {}
    # inside stacks/ (a stack must be in its repo), under a temp name nothing reads as a stack
    with tempfile.TemporaryDirectory(prefix=f"{TEMP_MARK}adopt-", dir=root / "stacks") as tmp:
        scratch = Path(tmp)
        shutil.copytree(root / "stacks", scratch, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("*.lock", "*.jsonl", ".*", "pylock.*"))
        if edit is not None:
            (scratch / edit.file.name).write_text(edit.text, encoding="utf-8")
        for real in stack_files(root):
            try:
                out[real.resolve()] = _lock(scratch / real.name, real, root, catalog)
            except FrankError as exc:
                out[real.resolve()] = exc
    return out


def _holders(locks: dict[Path, Lock | FrankError], part: str, version: str) -> list[Path]:
    return [p for p, lk in locks.items() if isinstance(lk, Lock)
            and any(x.name == part and x.version == version for x in lk.parts)]


def _status(subject: SubjectSpec, adopted: bool, rejected: bool) -> str | None:
    """The status the rule asks for, before asking whether any stack still holds the part."""
    if subject.change == "remove":
        return "parked" if adopted else None
    return "served" if adopted else ("rejected" if rejected else "parked")


def _rel(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)


def adopt(trial_file: Path, into: str, *, rejected: bool = False) -> str:
    """Record the decision in the subject part; if adopted, change the served stack; relock
    what that touches. Returns a one-line report."""
    trial, digest = load_sealed(trial_file)
    subject = sealed_subject(trial, trial_file)
    decision = decide_file(trial_file)
    root = repo_of(trial_file)
    with repo_lock(root):  # read the stacks and write them back in one turn
        return _adopt(trial, digest, subject, decision, root, into, rejected)


def _adopt(trial: Trial, digest: str, subject: SubjectSpec, decision: Decision, root: Path,
           into: str, rejected: bool) -> str:
    catalog = Catalog(root)
    version = subject.a if subject.change == "remove" else subject.b
    assert version is not None
    manifest_file = catalog.manifest_path(subject.part, version)
    current = catalog.get(subject.part, version, file=manifest_file, field="subject")
    edit = None
    if decision.outcome.passed:
        edit = _checked_edit(_served_file(into, root), subject, trial, root, catalog,
                             manifest_file)
    before = _resolve_all(root, catalog, None)
    after = _resolve_all(root, catalog, edit)
    for path, lk in after.items():
        if isinstance(lk, FrankError) and isinstance(before[path], Lock):
            raise FrankError(f"adopting would break {path.name}: {lk.one_line()}",
                             file=edit.file if edit else manifest_file)
    status = _status(subject, edit is not None, rejected)
    holders = _holders(after, subject.part, version)
    kept = ""
    if status in SHELVED and holders:  # no parked or rejected part in any stack
        names = ", ".join(_rel(p, root) for p in holders)
        verb = "holds" if len(holders) == 1 else "hold"
        kept = (f"; {subject.part} {version} stays {current.part.status}: {names} {verb} it "
                "(a stack may not hold a parked or rejected part)")
        status = None
    text = _manifest_text(manifest_file, status, decision)
    staged = _StagedManifest(part=PART_ADAPTER.validate_python(tomllib.loads(text)),
                             path=current.path, rel=current.rel, text=text)
    locks = _resolve_all(root, _Staged(root, staged), edit)
    if edit is not None:
        served = locks[edit.file]
        if not isinstance(served, Lock) or served.digest != edit.new.digest:
            raise FrankError(f"{edit.file.name} does not lock alike when staged beside the "
                             f"other stacks ({served}); nothing written", file=edit.file)
    touched = set(_holders(locks, subject.part, version)) | set(holders) | \
        set(_holders(before, subject.part, version))
    if edit is not None:
        touched |= {p for p in locks if edit.file in _chain(p)}
    txn = Transaction(root)
    txn.write(manifest_file, text)
    relocked = []
    for path in sorted(touched):
        lk = locks[path]
        if isinstance(lk, Lock) and not lock_is_current(lock_path(path), render_lock(lk)):
            txn.write(lock_path(path), render_lock(lk))
            relocked.append(path.stem)
    if edit is not None:
        old_text = edit.file.read_text(encoding="utf-8")
        entry = history_entry(f"adopt:{subject.change}", subject.part, subject.a, subject.b,
                              f"trial {trial.name} {digest}: {decision.summary()}", edit.old,
                              edit.new, old_text)
        hist = history_path(edit.file)
        old_hist = hist.read_text(encoding="utf-8") if hist.is_file() else ""
        txn.write(edit.file, edit.text)
        txn.write(hist, old_hist + json.dumps(entry, sort_keys=True) + "\n")
    txn.commit()
    shown = f"; {_rel(manifest_file, root)} is {status}" if status else \
        f"; evidence added to {_rel(manifest_file, root)}"
    locked = f"; relocked {', '.join(relocked)}" if relocked else ""
    outcome = f"({decision.outcome.statistic}, p = {decision.outcome.p_exact})"
    if edit is None:
        return f"{trial.name}: do not adopt {outcome}{shown}{kept}{locked}"
    return (f"{trial.name}: adopt {outcome}; {subject.describe()} into "
            f"{_rel(edit.file, root)}; digest {edit.old.digest[:19]} -> "
            f"{edit.new.digest[:19]}{shown}{kept}{locked}")


def _chain(stack_file: Path) -> list[Path]:
    try:
        return load_stack(stack_file).chain
    except FrankError:
        return []
