"""Advisory file locks (fcntl.flock) as context managers.

Why flock: the kernel drops it when its holder dies, kill -9 included, so a lock can never
be left behind, and "can I take it exclusively?" tells whether anyone else is still at work.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def opened(path: Path) -> Iterator[int]:
    """The lock file's fd for the block, no lock taken yet (closing it drops any lock)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def held(path: Path, *, shared: bool = False) -> Iterator[int]:
    """Hold ``path``'s lock (exclusive unless ``shared``) for the block; yields the fd."""
    with opened(path) as fd:
        relock(fd, shared=shared)
        yield fd


def try_exclusive(fd: int) -> bool:
    """Take ``fd``'s lock exclusively if nobody else holds it; never waits.

    Call it on an fd that holds no lock: converting a held lock with LOCK_NB drops the lock
    held when it fails (Linux removes the old lock before trying the new one).
    """
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def relock(fd: int, *, shared: bool) -> None:
    """Change the lock held on ``fd`` (not atomic: it is released, then taken again)."""
    fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
