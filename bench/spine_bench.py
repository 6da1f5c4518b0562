#!/usr/bin/env python3
"""Whole-process start of the read commands a user runs in hooks and CI, as a multiple of a
bare interpreter start (issue 31, item 15: goal at most 12x `python -c pass`).

Each command runs N times as a fresh process, interleaved with the bare interpreter start
(`python -c pass`, the unit) so that machine noise hits all alike; the table gives
medians, min and max, and each median over the bare one. `frank lock --check` and
`frank diff` keep their answer until anything it read changes (frank.store.memo), so they are
measured both ways: "kept" (the usual run in a hook: nothing changed since the last one)
and "worked out" (FRANK_NO_ANSWER_CACHE=1: every stack resolved and hashed again).
The answers are kept in a temporary cache of this run, warmed by one untimed run each.

Usage: .venv/bin/python bench/spine_bench.py [-n 21] [--write]
  --write  also write bench/results/spine-<date>.md (table, command, machine)
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GOAL = 12.0
BARE = "python -c pass (the unit)"
# name -> (argv after the interpreter, extra environment)
COMMANDS: dict[str, tuple[list[str], dict[str, str]]] = {
    BARE: (["-c", "pass"], {}),
    "frank lock --check stacks/served.toml (kept)":
        (["-m", "frank", "lock", "--check", "stacks/served.toml"], {}),
    "frank diff served candidate (kept)": (["-m", "frank", "diff", "served", "candidate"], {}),
    "frank diff served candidate --json (kept)":
        (["-m", "frank", "diff", "served", "candidate", "--json"], {}),
    "frank --help": (["-m", "frank", "--help"], {}),
    # what any worked-out answer pays before frank does anything: the CLI and model libraries
    # frank is written with, and pydantic's first model (which loads importlib.metadata)
    "click + pydantic + one model (libraries' floor)":
        (["-c", "import click\nfrom pydantic import BaseModel\nclass M(BaseModel):\n"
                "    x: int\nM(x=1)"], {}),
    "frank lock --check stacks/served.toml (worked out)":
        (["-m", "frank", "lock", "--check", "stacks/served.toml"],
         {"FRANK_NO_ANSWER_CACHE": "1"}),
    "frank diff served candidate (worked out)":
        (["-m", "frank", "diff", "served", "candidate"], {"FRANK_NO_ANSWER_CACHE": "1"}),
}


def time_once(args: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True,
                          check=False, env=env)
    elapsed = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{args} failed: {proc.stderr.decode()}")
    return elapsed


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"{platform.node()}, {cpu}, {os.cpu_count()} CPUs (load average {load} at the "
            f"end), python {platform.python_version()} ({sys.executable})")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=21)
    parser.add_argument("--write", action="store_true")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="frank-bench-cache-") as cache:
        base = {**os.environ, "FRANK_CACHE_DIR": cache, "COLUMNS": "120"}
        base.pop("FRANK_NO_ANSWER_CACHE", None)
        # as installed: pip writes bytecode at install, and Python caches it on first import
        # (a sandbox that sets PYTHONDONTWRITEBYTECODE compiles all of frank every start)
        dont_write = base.pop("PYTHONDONTWRITEBYTECODE", None)
        envs = {name: {**base, **extra} for name, (_, extra) in COMMANDS.items()}
        for name, (args, _) in COMMANDS.items():  # warm: bytecode and the kept answers
            time_once(args, envs[name])
        samples: dict[str, list[float]] = {name: [] for name in COMMANDS}
        for _ in range(opts.n):  # interleaved, so machine noise hits every command alike
            for name, (args, _) in COMMANDS.items():
                samples[name].append(time_once(args, envs[name]))
    unit = statistics.median(samples[BARE])
    when = datetime.now(UTC)
    lines = [
        f"# {when:%Y-%m-%d %H:%M} UTC, n={opts.n} runs each, medians; goal <= {GOAL:.0f}x",
        f"{'command':52s} {'median s':>9s} {'min s':>7s} {'max s':>7s} {'x bare':>7s} "
        f"{'min/min':>8s}",
    ]
    floor = min(samples[BARE])
    for name, values in samples.items():
        med = statistics.median(values)
        mark = "" if med / unit <= GOAL or not name.startswith("frank") else "  OVER"
        lines.append(f"{name:52s} {med:9.3f} {min(values):7.3f} {max(values):7.3f} "
                     f"{med / unit:6.1f}x {min(values) / floor:7.1f}x{mark}")
    print("\n".join(lines))
    if opts.write:
        command = " ".join(shlex.quote(a) for a in [
            os.path.relpath(sys.executable, REPO), "bench/spine_bench.py", *sys.argv[1:]])
        out = REPO / "bench" / "results" / f"spine-{when:%Y-%m-%d}.md"
        unset = " (this shell set PYTHONDONTWRITEBYTECODE; the bench unsets it)" \
            if dont_write else ""
        out.write_text(
            f"# Read commands' start, {when:%Y-%m-%d %H:%M} UTC\n\n"
            f"Command: `{command}` (from the repo root)\n\n"
            f"Machine: {machine()}\n\n"
            "Each row is a whole process, run n times interleaved with the others; `x bare` "
            "is its median over the median of `python -c pass` (the goal's measure), "
            "`min/min` its fastest run over the fastest bare start (less hit by other "
            "work on a shared machine). \"kept\": the answer kept "
            "by frank.store.memo holds (nothing it read changed); \"worked out\": "
            "FRANK_NO_ANSWER_CACHE=1, every stack resolved, hashed and checked again. "
            f"Bytecode caching on, as for an installed package{unset}.\n\n"
            "```\n" + "\n".join(lines) + "\n```\n")
        print(f"wrote {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
