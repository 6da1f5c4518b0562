#!/usr/bin/env python3
"""Whole-process time of `frank lock --check` and `frank diff served candidate` in two checkouts.

Why: a change that moves code around (issue 39's layout) must not slow start-up. Each
command runs N times as a fresh process in each checkout, interleaved (A, B, A, B, ...) so
machine noise hits both alike; the table gives medians and B/A. Both modes: "kept" (the answer
memo holds) and "worked out" (FRANK_NO_ANSWER_CACHE=1). Each checkout uses its own venv.

    python3 bench/startup_ab_bench.py /path/to/before /path/to/after -n 11
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

COMMANDS = {"lock --check": ["lock", "--check"],
            "diff served candidate": ["diff", "served", "candidate"]}


def _run(tree: Path, args: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run([str(tree / ".venv/bin/python"), "-m", "frank", *args], cwd=tree, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("-n", type=int, default=11)
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("kept", "worked out"):
            for name, args in COMMANDS.items():
                times: dict[str, list[float]] = {"before": [], "after": []}
                envs = {}
                for label in times:
                    env = {**os.environ, "FRANK_CACHE_DIR": f"{tmp}/{label}"}
                    if mode == "worked out":
                        env["FRANK_NO_ANSWER_CACHE"] = "1"
                    envs[label] = env
                    _run(getattr(a, label), args, env)  # warm: bytecode, kept answer
                for _ in range(a.n):
                    for label in times:
                        times[label].append(_run(getattr(a, label), args, envs[label]))
                b, f = statistics.median(times["before"]), statistics.median(times["after"])
                rows.append(f"| {name} | {mode} | {b * 1000:.0f} ms | {f * 1000:.0f} ms | "
                            f"{f / b:.2f} |")
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.1f}, median of {a.n} interleaved runs each\n")
    print("| command | answer | before | after | after/before |\n|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
