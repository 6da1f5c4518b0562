"""A blob file written around the page cache (``O_DIRECT``) where the filesystem allows it.

Why: on the VM this project builds and benchmarks on (2 cores), memory the guest gave back to
the host costs 1.3-2.7 CPU s per GB the first time it is touched again, and new page-cache
pages are such memory: writing 2 GB into a new file took 2.8 CPU s, the same 2 GB with
``O_DIRECT`` from one reused aligned buffer 0.08 (bench/results/profile-build-2026-12-04.md).
A cold build of served writes 9.7 GB of layer blobs that nothing in that build reads again
(the audit reads a streamed layer as it passes): about 12 of its 70 CPU seconds went to
filling the page cache with them.

The bytes are gathered into one page-aligned 4 MiB buffer and written a whole buffer at a
time; the tail (less than a buffer) goes through the page cache as usual, with ``O_DIRECT``
switched off for it. A filesystem that refuses ``O_DIRECT`` gets plain writes throughout, and
one that takes the flag but refuses a write (``EINVAL``) gets the rest of the file plainly.
The file is the same bytes either way; only where they pass differs.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os

BLOCK = 4 << 20  # bytes per direct write: a multiple of any logical block size
_ALIGN = 4096


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        view = view[os.write(fd, view):]


def _write_direct(fd: int, view: memoryview) -> bool:
    """Write ``view`` whole with ``O_DIRECT`` on; a filesystem that took the flag but
    refuses the write (``EINVAL``) gets the rest through the page cache. Whether ``O_DIRECT``
    is still on."""
    while view:
        try:
            view = view[os.write(fd, view):]
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            _set_direct(fd, False)
            _write_all(fd, view)
            return False
    return True


class DirectFile:
    """Write-only file over ``fd`` (owned: ``close`` closes it); ``direct=False`` writes
    through the page cache, as a filesystem without ``O_DIRECT`` does."""

    def __init__(self, fd: int, *, direct: bool = True):
        self._fd = fd
        self._fill = 0
        self._direct = direct and _set_direct(fd, True)
        self._buf = mmap.mmap(-1, BLOCK) if self._direct else None
        self._view = memoryview(self._buf) if self._buf is not None else None

    @property
    def direct(self) -> bool:
        return self._direct

    def write(self, data: bytes | bytearray | memoryview) -> int:
        src = memoryview(data).cast("B")
        n = len(src)
        if self._view is None:
            _write_all(self._fd, src)
            return n
        pos = 0
        while pos < n:
            take = min(BLOCK - self._fill, n - pos)
            self._view[self._fill:self._fill + take] = src[pos:pos + take]
            self._fill += take
            pos += take
            if self._fill == BLOCK:
                self._direct = _write_direct(self._fd, self._view)
                self._fill = 0
                if not self._direct:  # the rest goes through the page cache
                    _write_all(self._fd, src[pos:])
                    self._release()
                    return n
        return n

    def flush(self) -> None:
        """Nothing to flush early: whole buffers are written as they fill, the tail at
        ``close``."""

    def close(self) -> None:
        if self._fd < 0:
            return
        try:
            if self._view is not None and self._fill:
                whole = self._fill - self._fill % _ALIGN
                if whole:
                    _write_direct(self._fd, self._view[:whole])
                _set_direct(self._fd, False)  # the tail is not a whole block
                _write_all(self._fd, self._view[whole:self._fill])
        finally:
            os.close(self._fd)
            self._fd = -1
            self._release()

    def _release(self) -> None:
        if self._view is not None:
            self._view.release()
            self._view = None
        if self._buf is not None:
            self._buf.close()
            self._buf = None

    def __enter__(self) -> DirectFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _set_direct(fd: int, on: bool) -> bool:
    """Switch ``O_DIRECT`` on or off for ``fd``; False where the filesystem refuses it."""
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    want = flags | os.O_DIRECT if on else flags & ~os.O_DIRECT
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, fcntl.F_SETFL, want)
        return True
    return False
