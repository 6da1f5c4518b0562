"""Progress on slow steps: rich's spinner on a terminal, plain lines in a log.

Why not the spinner alone: rich shows nothing when stderr is not a terminal, so a cold
compose was silent for minutes in a CI log. Off a terminal a step that is still running
after ``FIRST_S`` prints ``frank: <step> ...`` and then a line every ``EVERY_S`` with the time
so far, and ``done`` when it ends; a step quicker than that prints nothing, so a command that
fails at once still says one line. ``FRANK_PROGRESS_AFTER`` (seconds) moves that threshold
(the test suite sets it high: a cold cache there makes slow steps of commands under test).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator

from rich.console import Console


def _after() -> float:
    try:
        value = float(os.environ.get("FRANK_PROGRESS_AFTER", "3"))
    except ValueError:
        return 3.0
    return value if value > 0 and value != float("inf") else 3.0


FIRST_S = _after()
EVERY_S = 30.0


@contextlib.contextmanager
def status(console: Console, text: str) -> Iterator[None]:
    """``console.status(text)`` on a terminal; timed plain lines elsewhere (see above)."""
    if console.is_terminal or console.quiet:
        with console.status(text):
            yield
        return
    start = time.monotonic()
    said = threading.Event()
    stop = threading.Event()

    def tick() -> None:
        wait = FIRST_S
        while not stop.wait(wait):
            elapsed = time.monotonic() - start
            line = f"frank: {text} ..." if not said.is_set() else \
                f"frank: {text} ({elapsed:.0f} s so far)"
            console.file.write(line + "\n")
            console.file.flush()
            said.set()
            wait = EVERY_S

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        stop.set()
        ticker.join()
    if said.is_set():
        console.file.write(f"frank: {text}: done ({time.monotonic() - start:.0f} s)\n")
        console.file.flush()
