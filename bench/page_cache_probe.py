#!/usr/bin/env python3
"""What writing and reading a big file costs in CPU on this machine, page cache or not (issue 41).

Why this exists: a profile of served's downloads showed half their CPU in the kernel's copy
into new page-cache pages (`copy_folio_from_iter_atomic`), at about 0.7 GB/s: on a VM whose
free memory goes back to the host (virtio-balloon free page reporting), the first touch of a
page the kernel hands out again is slow. This probe measures, side by side, for --gb GB:

  buffered write, new file     the page cache takes new pages (what a blob write did)
  buffered write, same pages   the same file written again: its pages are in the cache
  O_DIRECT write               one reused 4 MiB aligned buffer, no page cache (store.direct)
  O_DIRECT read                into the reused buffer
  buffered read, not cached    after O_DIRECT nothing is cached: new pages again
  buffered read, cached        the pages the read before left

Each row: wall seconds and CPU seconds (user + sys) of this process. On a machine where the
first touch is cheap, the "new file" and "same pages" rows come out close.

Usage: python bench/page_cache_probe.py [--dir /work/scratch] [--gb 2] [--pause 10]
"""

from __future__ import annotations

import argparse
import mmap
import os
import platform
import resource
import tempfile
import time
from pathlib import Path

BLOCK = 4 << 20


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _timed(label: str, work: object, rows: list[tuple[str, float, float]]) -> None:
    wall, cpu = time.perf_counter(), _cpu()
    work()  # type: ignore[operator]
    rows.append((label, time.perf_counter() - wall, _cpu() - cpu))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path, default=None, help="a folder on the disk to probe")
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--pause", type=float, default=10.0,
                    help="seconds between freeing the first file and the O_DIRECT rows")
    args = ap.parse_args()
    blocks = int(args.gb * (1 << 30)) // BLOCK
    buf = mmap.mmap(-1, BLOCK)
    buf.write(os.urandom(BLOCK))
    view = memoryview(buf)
    rows: list[tuple[str, float, float]] = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp) / "probe.bin"

        def write(flags: int) -> None:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | flags)
            for _ in range(blocks):
                os.write(fd, view)
            os.fsync(fd)
            os.close(fd)

        def read(flags: int) -> None:
            fd = os.open(path, os.O_RDONLY | flags)
            with os.fdopen(fd, "rb", buffering=0) as f:
                while f.readinto(view):
                    pass

        _timed("buffered write, new file", lambda: write(os.O_TRUNC), rows)
        _timed("buffered write, same pages", lambda: write(0), rows)
        path.unlink()
        time.sleep(args.pause)  # freed memory goes back to the host after a few seconds
        _timed("O_DIRECT write", lambda: write(os.O_TRUNC | os.O_DIRECT), rows)
        _timed("O_DIRECT read", lambda: read(os.O_DIRECT), rows)
        _timed("buffered read, not cached", lambda: read(0), rows)
        _timed("buffered read, cached", lambda: read(0), rows)
    gb = blocks * BLOCK / 1e9
    print(f"{gb:.2f} GB, {platform.node()} ({os.cpu_count()} cores), kernel {platform.release()}")
    print("| what | wall s | CPU s | CPU s per GB |\n|---|---|---|---|")
    for label, wall, cpu in rows:
        print(f"| {label} | {wall:.2f} | {cpu:.2f} | {cpu / gb:.2f} |")


if __name__ == "__main__":
    main()
