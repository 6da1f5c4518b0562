"""Folders frank makes in /tmp, each held by the processes using it, so that what a killed
process left is told from what a live one uses.

Why: a process killed by SIGKILL runs no cleanup, and /tmp is shared by every frank command
and cache on the machine (engines take image views and run roots there: their paths must be
short and tame). Each folder of frank's naming is held with ``flock`` on the folder itself
while it is used (the kernel drops the lock when the holder dies, however it dies); a
per-process folder also names its owner (``frank-<kind>-p<pid>-<hex>``), which covers the
moment between ``mkdir`` and the lock. ``reap`` removes each folder of that naming that
nobody holds and whose owner is gone (mounts below it unmounted first); a folder shared
between processes (a run's view of one image, ``frank-oci-<digest prefix>``) when nobody
holds it. The holder checks, once it has the lock, that the path is still its folder (a reap
may have removed it just before), and makes it again when not.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

from frank.store.flock import try_exclusive

TMP = Path("/tmp")
_OWNED = re.compile(r"frank-[a-z]+-p(\d+)-[0-9a-f]{12}")
_SHARED = re.compile(r"frank-oci-[0-9a-f]{24}")


def owned_name(kind: str, pid: int | None = None) -> Path:
    """A fresh per-process folder path (not made): ``/tmp/frank-<kind>-p<pid>-<hex>``."""
    return TMP / f"frank-{kind}-p{os.getpid() if pid is None else pid}-{uuid.uuid4().hex[:12]}"


def hold(path: Path) -> int:
    """Make ``path`` (if need be) and hold it shared; the fd to ``release``."""
    while True:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:  # reaped between the two: again
            continue
        fcntl.flock(fd, fcntl.LOCK_SH)
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        os.close(fd)


def release(fd: int) -> None:
    """Stop holding a folder (it stays; ``owned`` removes its own)."""
    with contextlib.suppress(OSError):
        os.close(fd)


@contextlib.contextmanager
def owned(kind: str) -> Iterator[Path]:
    """A per-process folder (``owned_name``) held for the block and removed after it."""
    path = owned_name(kind)
    fd = hold(path)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        release(fd)


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists (in this pid namespace)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def mount_points() -> list[str]:
    """Every mount point this process sees (none when /proc cannot be read)."""
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return []
    return [ln.split()[1].replace("\\040", " ") for ln in lines if len(ln.split()) > 1]


def unmount_under(top: Path) -> None:
    """Unmount whatever is mounted at or below ``top``, deepest first."""
    here = str(top)
    points = mount_points()
    for point in sorted((p for p in points if p == here or p.startswith(here + "/")),
                        key=len, reverse=True):
        subprocess.run(["umount", point], capture_output=True, check=False)


@contextlib.contextmanager
def _taken(path: Path) -> Iterator[bool]:
    """Whether ``path`` could be taken exclusively (nobody holds it); held for the block."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        yield False
        return
    if not try_exclusive(fd):
        os.close(fd)
        yield False
        return
    try:
        yield True
    finally:
        os.close(fd)


def stale(top: Path = TMP) -> list[Path]:
    """Folders of frank's naming in ``top`` that nobody holds and whose owner is gone."""
    found = []
    for path in sorted(top.glob("frank-*")):
        owner = _OWNED.fullmatch(path.name)
        if owner is None and not _SHARED.fullmatch(path.name):
            continue
        if path.is_symlink() or not path.is_dir() or (owner and alive(int(owner[1]))):
            continue
        with _taken(path) as free:
            if free:
                found.append(path)
    return found


def drop(path: Path) -> bool:
    """Remove ``path`` (mounts below it first) unless someone holds it; whether it went."""
    with _taken(path) as free:
        if free:
            unmount_under(path)
            shutil.rmtree(path, ignore_errors=True)
    return not path.exists()


def reap(top: Path = TMP, *, dry_run: bool = False) -> list[Path]:
    """Remove the ``stale`` folders (each taken again, and held while it goes); the ones
    removed."""
    return [path for path in stale(top) if dry_run or drop(path)]
