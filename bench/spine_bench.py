#!/usr/bin/env python3
"""Whole-process wall time of the read commands a user runs most (target < 0.5 s each).

Runs each command N times as a fresh process, side by side in one run, and prints the
median, min and max; `python -X importtime` style laziness is what keeps these low.
Usage: .venv/bin/python bench/spine_bench.py [-n 15]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COMMANDS = {
    "frank lock --check stacks/served.toml": ["lock", "--check", "stacks/served.toml"],
    "frank diff served candidate": ["diff", "served", "candidate"],
    "frank diff served candidate --json": ["diff", "served", "candidate", "--json"],
    "frank --help (floor: interpreter + click)": ["--help"],
}


def time_once(args: list[str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "frank", *args], cwd=REPO, capture_output=True, check=False
    )
    elapsed = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{args} failed: {proc.stderr.decode()}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=15)
    n = parser.parse_args().n
    samples: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(n):  # interleaved, so machine noise hits every command alike
        for name, args in COMMANDS.items():
            samples[name].append(time_once(args))
    print(
        f"# {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
        f"{platform.processor() or platform.machine()}, python {platform.python_version()}, "
        f"n={n}"
    )
    print(f"{'command':44s} {'median s':>9s} {'min s':>7s} {'max s':>7s} {'vs 0.5 s':>9s}")
    for name, values in samples.items():
        med = statistics.median(values)
        print(f"{name:44s} {med:9.3f} {min(values):7.3f} {max(values):7.3f} {med / 0.5:8.2f}x")


if __name__ == "__main__":
    main()
