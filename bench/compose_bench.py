#!/usr/bin/env python3
"""`frank compose` as a user runs it: whole processes on a copy of the repo.

Measures, side by side in one run: a no-op recompose of a built stack (target < 1 s
median), a recompose after a one-part change, and revert + recompose back to the earlier
image (which must come back with its earlier digest and nothing built).
Usage: .venv/bin/python bench/compose_bench.py [-n 7]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.spine_helpers import copy_repo

CHILD = 'extends = "smoke-cpu.toml"\n'
WITH_PART = CHILD + '[add]\nexpert-plan = "published"\n'


def frank(repo: Path, *args: str) -> tuple[float, dict]:
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "frank", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        check=False,
    )
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"frank {' '.join(args)}: {proc.stderr.strip()}")
    return elapsed, json.loads(proc.stdout) if proc.stdout.startswith("{") else {}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=7)
    n = parser.parse_args().n
    with tempfile.TemporaryDirectory() as tmp:
        repo = copy_repo(Path(tmp) / "repo")
        stack = repo / "stacks/bench.toml"
        stack.write_text(CHILD)
        _, first = frank(repo, "compose", "stacks/bench.toml", "--json")
        noop, change, revert = [], [], []
        for _ in range(n):
            t, out = frank(repo, "compose", "stacks/bench.toml", "--json")
            assert out["image"]["layers_built"] == 0
            noop.append(t)
            stack.write_text(WITH_PART)
            t, out = frank(repo, "compose", "stacks/bench.toml", "--json")
            change.append(t)
            t1, _ = frank(repo, "revert", "expert-plan", "--stack", "stacks/bench.toml")
            t2, out = frank(repo, "compose", "stacks/bench.toml", "--json")
            assert out["image"]["digest"] == first["image"]["digest"]
            assert out["image"]["layers_built"] == 0
            revert.append(t1 + t2)
    print(
        f"# {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, {platform.machine()}, "
        f"python {platform.python_version()}, n={n}, stack: smoke-cpu child"
    )
    print(f"{'scenario':52s} {'median s':>9s} {'min s':>7s} {'max s':>7s}")
    for name, values in (
        ("no-op recompose (target < 1 s)", noop),
        ("recompose after adding one part", change),
        ("revert + recompose (earlier digest, 0 built)", revert),
    ):
        print(f"{name:52s} {statistics.median(values):9.3f} {min(values):7.3f} {max(values):7.3f}")


if __name__ == "__main__":
    main()
