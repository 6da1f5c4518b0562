"""Off a terminal, slow steps print plain progress lines (rich's spinner shows nothing there);
quick ones print nothing, so a command that fails at once still says one line."""

from __future__ import annotations

import io
import time

import pytest
from rich.console import Console

from frank.image import progress


def test_a_slow_step_says_so_in_a_log_and_a_quick_one_says_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "FIRST_S", 0.2)
    monkeypatch.setattr(progress, "EVERY_S", 0.3)
    out = io.StringIO()
    console = Console(file=out, force_terminal=False)
    with progress.status(console, "layer 3: python:deps: writing the tar"):
        time.sleep(0.7)
    lines = out.getvalue().splitlines()
    assert lines[0] == "frank: layer 3: python:deps: writing the tar ..."
    assert any(x.endswith("s so far)") for x in lines[1:-1])
    assert lines[-1].startswith("frank: layer 3: python:deps: writing the tar: done (")
    quick = io.StringIO()
    with progress.status(Console(file=quick, force_terminal=False), "resolving"):
        pass
    assert quick.getvalue() == ""
    quiet = io.StringIO()  # --json: nothing on stderr either way
    with progress.status(Console(file=quiet, force_terminal=False, quiet=True), "slow"):
        time.sleep(0.4)
    assert quiet.getvalue() == ""
