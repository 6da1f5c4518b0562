"""One lock for everything that rewrites a repo's stacks, locks or history.

Why: revert, adopt and lock each read a stack and write it (or its lock) back; two at once
used to lose one of them. Holding ``stacks/.frank.lock`` (fcntl, dropped by the kernel when
the holder dies) makes each read-modify-write whole. Whoever takes the lock first finishes
a change that a killed command journaled (``journal.recover``) and removes the temp files
such a command left in stacks/ and parts/: while the lock is held nobody else is writing
them, so every one found is stale.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

from frank.history.journal import JOURNAL, STAGED_MARK, recover
from frank.model.stackfiles import is_temp
from frank.store.flock import held

LOCK = ".frank.lock"


def _stale(name: str) -> bool:
    """Temp names frank's writers use in stacks/ (never the lock or the journal)."""
    return is_temp(name) and name not in (LOCK, JOURNAL)


def _leftovers(root: Path) -> list[Path]:
    """Temp files in stacks/ and staged ones in parts/ (stale once the lock is held)."""
    stacks = root / "stacks"
    candidates = [p for p in stacks.iterdir() if _stale(p.name)] if stacks.is_dir() else []
    return candidates + [p for p in (root / "parts").glob("*/.*") if STAGED_MARK in p.name]


def clean_stale(root: Path) -> list[Path]:
    """Remove temp files a killed command left in stacks/ (and staged ones in parts/)."""
    gone = []
    for path in _leftovers(root):
        if path.is_dir() and not path.is_symlink():  # a revert's closure folder
            shutil.rmtree(path, ignore_errors=True)
            gone.append(path)
            continue
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            path.unlink()
            gone.append(path)
    return gone


@contextlib.contextmanager
def repo_lock(root: Path) -> Iterator[None]:
    """Hold the repo's stacks lock, first finishing or cleaning what a kill left."""
    with held(root / "stacks" / LOCK):
        if recover(root):
            print("frank: finished a change an interrupted command had started "
                  f"(stacks/{JOURNAL})", file=sys.stderr)
        clean_stale(root)
        yield


@contextlib.contextmanager
def repo_read_lock(root: Path) -> Iterator[None]:
    """For a command that writes nothing (``lock --check``): wait out a writer by holding
    the stacks lock shared, but never create it (a first check would change the stacks
    folder, which the kept answer depends on). A change a killed command journaled is
    finished first, and temp files a killed one left are removed, as a writer would."""
    lock = root / "stacks" / LOCK
    if (root / "stacks" / JOURNAL).exists() or _leftovers(root):
        with repo_lock(root):
            pass
    if not lock.exists():
        yield
        return
    with held(lock, shared=True):
        yield
