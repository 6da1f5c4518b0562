"""Answers of read-only commands, kept until anything they read changes.

`frank lock --check` and `frank diff` run in pre-commit hooks and CI, where most runs see
the same files as the run before. Working out an answer resolves stacks (pydantic models,
every manifest, every input hashed); checking a kept one only re-reads what that work read.
So an answer is stored with everything it depended on, recorded while it was computed:

- every file it opened for reading (Python's ``open`` audit event), by content sha256;
- every folder it listed, and the folder of every file it read (a file appearing beside
  one that was read, such as a ``setup.py`` next to a ``pyproject.toml``), by listing;
- every tree hashed (``hashing.sha256_tree``), which is computed again: which files
  belong to a tree is git's answer (ignore rules, the index), so only git can say it
  still holds;
- frank's own code, the Python running it and the installed distributions (``code_key``).

A kept answer is used only if all of these are as they were; otherwise it is worked out
again, with every check, and kept anew. Nothing that failed is kept (errors are always
worked out), nor anything whose work wrote a file, started a program other than git for
a tree, opened a network connection, or read a file changed while it ran.
``FRANK_NO_ANSWER_CACHE=1`` turns it off; answers live in ``$FRANK_CACHE_DIR`` (default
``$FRANK_CACHE``, else ``$XDG_CACHE_HOME/frank`` or ``~/.cache/frank``) under ``answers/``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from frank.hashing import observe_trees

FORMAT = "frank-answer-1"
_PACKAGE = Path(__file__).resolve().parent.parent  # the whole frank package
# A file changed this close to the start of the work may have changed while it was read
# (file times move in clock ticks of a few ms): such an answer is not kept.
RACY_NS = 50_000_000
KEEP = 512  # records kept before the oldest half is removed
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


@dataclass
class Reads:
    """What one piece of work depended on, as it ran."""

    start_ns: int
    files: set[str] = field(default_factory=set)
    dirs: set[str] = field(default_factory=set)
    trees: dict[str, str] = field(default_factory=dict)
    unsafe: str | None = None  # why the answer may not be kept
    in_tree: int = 0


# Work that changes files, starts programs or reaches out is never kept.
_UNSAFE_EVENTS = frozenset({
    "os.remove", "os.rename", "os.replace", "os.mkdir", "os.rmdir", "os.symlink", "os.link",
    "os.truncate", "os.chmod", "os.chown", "os.utime", "shutil.copyfile", "shutil.rmtree",
    "socket.connect", "socket.getaddrinfo", "urllib.Request",
})
# a program started while a tree is hashed is git listing it (hashing.tree_files)
_PROGRAM_EVENTS = frozenset({"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn",
                             "os.spawn", "os.fork", "os.forkpty"})
_ACTIVE: list[Reads] = []
_HOOKED = False


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if not _ACTIVE:
        return
    reads = _ACTIVE[-1]
    if event == "open":
        path, mode, flags = args
        if isinstance(path, int) or path is None:
            return
        writing = (flags or 0) & _WRITE_FLAGS if mode is None else \
            any(c in str(mode) for c in "wax+")
        name = os.path.abspath(os.fsdecode(path))
        if writing:
            reads.unsafe = reads.unsafe or f"wrote {name}"
        else:
            reads.files.add(name)
    elif event in ("os.listdir", "os.scandir"):
        path = args[0]
        if not isinstance(path, int):
            reads.dirs.add(os.path.abspath(os.fsdecode(path if path is not None else ".")))
    elif event in _PROGRAM_EVENTS and not reads.in_tree:
        reads.unsafe = reads.unsafe or f"{event} {args[0]}"
    elif event in _UNSAFE_EVENTS:
        reads.unsafe = reads.unsafe or event


def note_tree(root: Path, digest: str) -> None:
    """Told by ``hashing.sha256_tree``: the tree is checked by hashing it again."""
    if _ACTIVE:
        _ACTIVE[-1].trees[os.path.abspath(root)] = digest


class tree_scope:
    """While a tree is hashed, its git listing is part of the tree, not an unknown program."""

    def __enter__(self) -> None:
        if _ACTIVE:
            _ACTIVE[-1].in_tree += 1

    def __exit__(self, *exc: object) -> None:
        if _ACTIVE:
            _ACTIVE[-1].in_tree -= 1


class _TreeReads:
    """The memo's side of ``hashing.TreeObserver``."""

    def listing(self) -> tree_scope:
        return tree_scope()

    def hashed(self, root: Path, digest: str) -> None:
        note_tree(root, digest)


observe_trees(_TreeReads())


def enabled() -> bool:
    return os.environ.get("FRANK_NO_ANSWER_CACHE", "") in ("", "0")


def cache_dir() -> Path:
    """Where kept answers live: ``$FRANK_CACHE_DIR``, else frank's cache (``FRANK_CACHE``,
    so that naming the cache alone keeps frank out of the home folder), else the user's."""
    if os.environ.get("FRANK_CACHE_DIR"):
        return Path(os.environ["FRANK_CACHE_DIR"]) / "answers"
    if os.environ.get("FRANK_CACHE"):
        return Path(os.environ["FRANK_CACHE"]) / "answers"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "frank" / "answers"


_CODE_KEY: str | None = None


def code_key() -> str:
    """frank's code (every file of the package), the Python running it, and the names
    (with versions) of the installed distributions: a change to any is a new key.

    A package file counts by its stat (size, mtime and ctime in ns, inode): writing a file
    moves its ctime, which no tool sets back, so an edit is always a new key (and a
    checkout of the same bytes merely a miss)."""
    global _CODE_KEY
    if _CODE_KEY is None:
        digest = hashlib.sha256(f"{FORMAT}\0{sys.version}\0{sys.executable}\0".encode())
        for folder, dirs, names in os.walk(_PACKAGE):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(names):
                st = os.stat(os.path.join(folder, name))
                digest.update(f"{folder}/{name}\0{st.st_size} {st.st_mtime_ns} "
                              f"{st.st_ctime_ns} {st.st_ino}\0".encode())
        for entry in sys.path:
            if entry.endswith("-packages") and os.path.isdir(entry):
                names = sorted(n for n in os.listdir(entry) if n.endswith(".dist-info"))
                digest.update(f"{entry}\0{' '.join(names)}\0".encode())
        _CODE_KEY = digest.hexdigest()
    return _CODE_KEY


def _file_digest(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except FileNotFoundError:
        return "missing"
    except IsADirectoryError:
        return "folder"


def _listing(path: str) -> str:
    try:
        entries = sorted(f"{e.name}/" if e.is_dir() else e.name for e in os.scandir(path))
    except FileNotFoundError:
        return "missing"
    except NotADirectoryError:
        return "file"
    return hashlib.sha256("\0".join(entries).encode()).hexdigest()


def _changed_since(path: str, start_ns: int) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return max(st.st_mtime_ns, st.st_ctime_ns) >= start_ns - RACY_NS


def _code_paths() -> tuple[str, ...]:
    out = {str(_PACKAGE), sys.prefix, sys.base_prefix, sys.exec_prefix}
    out.update(p for p in sys.path if p.endswith("-packages"))
    return tuple(sorted(p.rstrip("/") + "/" for p in out))


def _depends(reads: Reads) -> dict[str, Any] | None:
    """What to check next time, or None when the answer may not be kept."""
    if reads.unsafe is not None:
        return None
    code = _code_paths()
    trees = tuple(t.rstrip("/") + "/" for t in reads.trees)
    files = sorted(f for f in reads.files if not f.startswith(code))
    dirs = {d for d in reads.dirs if not d.startswith(code)}
    dirs.update(os.path.dirname(f) for f in files)
    if any(_changed_since(p, reads.start_ns) for p in [*files, *dirs]):
        return None
    outside = [f for f in files if not f.startswith(trees)]
    return {
        "files": {f: _file_digest(f) for f in outside},
        "dirs": {d: _listing(d) for d in sorted(dirs) if not (d + "/").startswith(trees)},
        "trees": dict(sorted(reads.trees.items())),
    }


def _holds(depends: dict[str, Any]) -> bool:
    for path, digest in depends["files"].items():
        if _file_digest(path) != digest:
            return False
    for path, digest in depends["dirs"].items():
        if _listing(path) != digest:
            return False
    return all(_tree_now(root) == digest for root, digest in depends["trees"].items())


_TREES_NOW: dict[str, str | None] = {}


def _tree_now(root: str) -> str | None:
    """A tree's hash as it is now, worked out once per process (`frank lock --check` with
    every stack checks the same plugin tree for each; a non-kept run hashes it as often)."""
    if root not in _TREES_NOW:
        from frank.errors import FrankError
        from frank.hashing import sha256_tree

        try:
            _TREES_NOW[root] = sha256_tree(Path(root))
        except (FrankError, OSError):
            _TREES_NOW[root] = None
    return _TREES_NOW[root]


def _record_path(op: str, args: list[str]) -> Path:
    key = hashlib.sha256(json.dumps([code_key(), op, os.getcwd(), args]).encode()).hexdigest()
    return cache_dir() / f"{key}.json"


def answer(op: str, args: list[str], work: Callable[[], Any]) -> Any:
    """``work()``'s result (JSON data), kept from an earlier run while all it read holds."""
    if not enabled():
        return work()
    path = _record_path(op, args)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        if record.get("format") == FORMAT and record.get("op") == op \
                and record.get("args") == args and _holds(record["depends"]):
            return record["result"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass  # none kept, or unreadable: work it out
    global _HOOKED
    if not _HOOKED:
        sys.addaudithook(_audit)
        _HOOKED = True
    reads = Reads(start_ns=time.time_ns())
    _ACTIVE.append(reads)
    try:
        result = work()
    finally:
        _ACTIVE.pop()
    depends = _depends(reads)
    if depends is not None:
        _keep(path, {"format": FORMAT, "op": op, "args": args, "depends": depends,
                     "result": result})
    return result


def _keep(path: Path, record: dict[str, Any]) -> None:
    """Write a record atomically; a cache that cannot be written is no error."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(record, sort_keys=True), encoding="utf-8")
        os.replace(tmp, path)
        _prune(path.parent)
    except OSError:
        pass


def _prune(folder: Path) -> None:
    """Keep the folder small: past KEEP records (a new code key or folder makes new ones),
    the least recently written half goes."""
    records = list(folder.glob("*.json"))
    if len(records) <= KEEP:
        return
    records.sort(key=lambda p: p.stat().st_mtime_ns)
    for old in records[: len(records) // 2]:
        old.unlink(missing_ok=True)
