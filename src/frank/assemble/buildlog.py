"""A build's output into its log, and the one line a failed build is reported in.

Shared by every engine: a subprocess's output (``engines.run_logged``) and the Docker
daemon's build stream (``dockerbuild.build``) are logged and quoted the same way.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from pathlib import Path

from frank.errors import FrankError

_WHY = re.compile(r"CERTIFICATE_VERIFY_FAILED|No matching distribution|ERROR|[Ee]rror[: ]|"
                  r"[Ff]ailed|not found|No such file")


def stream_logged(lines: Iterable[str], what: str, *, log: Path, head: str,
                  timeout: float | None = None) -> list[str]:
    """Write a build's output ``lines`` to ``log`` after ``head``, with a progress line
    showing the latest; returns the last 200 (what a failure is quoted from)."""
    from rich.console import Console

    start = time.monotonic()
    tail: list[str] = []
    with log.open("a", encoding="utf-8") as out, Console(stderr=True).status(what) as status:
        out.write(head + "\n")
        for line in lines:
            out.write(line)
            tail = [*tail[-199:], line.rstrip()]
            status.update(f"{what}: {line.strip()[:100]}")
            if timeout is not None and time.monotonic() - start > timeout:
                raise FrankError(f"{what} timed out after {timeout} s (log {log})")
    return tail


def build_failed(what: str, how: str, tail: list[str], log: Path) -> FrankError:
    """One line for a failed build: the log's lines that say why, and the log."""
    why = [x.strip() for x in tail if _WHY.search(x)][-3:] or [x for x in tail if x][-1:]
    return FrankError(f"{what} failed ({how}): {' | '.join(why)} (log {log})")
