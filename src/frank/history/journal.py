"""All-or-nothing writes of several repo files (a stack, its lock, its history, manifests).

Why a journal: each file alone is written atomically, but a revert or an adopt is several
files, and a kill between two renames used to leave a reverted stack with a stale lock and
no history line. Here every new file is written in full beside its target first; then one
journal naming them all is renamed into place; then the staged files are renamed over their
targets. A kill before the journal changes nothing (the staged files are cleaned up later);
a kill after it is finished by the next command that takes the repo lock (``recover``):
every staged file still present is renamed in, so the change lands whole, exactly once.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from frank.errors import FrankError
from frank.fsutil import write_atomic

JOURNAL = ".frank-journal.json"
STAGED_MARK = ".txn-"


def journal_path(root: Path) -> Path:
    """Where the repo's journal lives while a change is being put in place."""
    return root / "stacks" / JOURNAL


def _fsync_write(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


class Transaction:
    """Files to change together; nothing is written until ``commit``."""

    def __init__(self, root: Path):
        self.root = root.resolve()
        self.writes: dict[Path, bytes] = {}
        self.relock: list[Path] = []

    def write(self, path: Path, data: str | bytes) -> None:
        """Stage ``path``'s new content (replacing anything staged for it before)."""
        full = path.resolve()
        if not full.is_relative_to(self.root):
            raise FrankError("a change may only write inside the repo", file=path)
        self.writes[full] = data.encode() if isinstance(data, str) else data

    def relock_dependents_of(self, stack_file: Path) -> None:
        """After the files are in, relock every stack that extends ``stack_file``."""
        self.relock.append(stack_file.resolve())

    def commit(self) -> list[tuple[str, str]]:
        """Stage, journal, rename; returns what relocking the dependents did."""
        files: list[list[str]] = []
        try:
            for target, data in self.writes.items():
                staged = target.with_name(f".{target.name}{STAGED_MARK}{os.urandom(16).hex()}.tmp")
                _fsync_write(staged, data)
                files.append([self._rel(target), self._rel(staged)])
        except BaseException:
            for _, rel in files:
                (self.root / rel).unlink(missing_ok=True)
            raise
        doc = {"version": 1, "files": files, "relock": [self._rel(p) for p in self.relock]}
        write_atomic(journal_path(self.root), json.dumps(doc, indent=1) + "\n")
        return _finish(self.root, doc)

    def _rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()


def _inside(root: Path, rel: Any) -> Path:
    if not isinstance(rel, str):
        raise FrankError("corrupt journal: a path is not a string", file=journal_path(root))
    full = (root / rel).resolve()
    if not full.is_relative_to(root):
        raise FrankError(f"corrupt journal: {rel!r} is outside the repo",
                         file=journal_path(root))
    return full


def _finish(root: Path, doc: dict[str, Any]) -> list[tuple[str, str]]:
    """Rename every staged file still present over its target, relock, drop the journal.

    Idempotent: a kill anywhere in here is finished by running it again.
    """
    from frank.history.relock import relock_dependents

    pairs = [(_inside(root, t), _inside(root, s)) for t, s in doc.get("files", [])]
    for target, staged in pairs:
        if staged.exists():
            os.replace(staged, target)
    done: list[tuple[str, str]] = []
    for rel in doc.get("relock", []):
        stack = _inside(root, rel)
        if stack.is_file():
            done += relock_dependents(stack, root)
    journal_path(root).unlink(missing_ok=True)
    return done


def recover(root: Path) -> bool:
    """Finish a change a killed command left journaled; True if there was one.

    Call only with the repo lock held (``repolock.repo_lock`` does).
    """
    path = journal_path(root)
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return False
    try:
        doc = json.loads(raw)
    except (json.JSONDecodeError, RecursionError):
        raise FrankError("corrupt journal (not JSON); the files it named are as the "
                         "interrupted command left them: check them and delete it",
                         file=path) from None
    if not isinstance(doc, dict) or doc.get("version") != 1 \
            or not isinstance(doc.get("files"), list):
        raise FrankError("corrupt journal (unknown format); check the files it names and "
                         "delete it", file=path)
    for pair in doc["files"]:
        if not (isinstance(pair, list) and len(pair) == 2):
            raise FrankError("corrupt journal: files must be [target, staged] pairs",
                             file=path)
    _finish(root.resolve(), doc)
    return True
