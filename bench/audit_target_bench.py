#!/usr/bin/env python3
"""`frank audit --require-target` of served: this tree against an earlier one, side by side.

Two source trees (A: an earlier commit's worktree, B: this one), each with served composed
in its own out/ from one shared store (the layers are the same files: one page cache). Each
round audits with A, then B, alternating, n rounds; wall and CPU seconds (the process and
its children) per run, medians, and B/A. The anchor is A: the audit as it was. A also
prints what each side says of nvidia-cufft (A's reader read .nv_fatbin only).

Usage: .venv/bin/python bench/audit_target_bench.py --a /work/old-audit -n 3
       [--results bench/results/audit-target-DATE.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent


def audit(tree: Path, cache: str) -> tuple[float, float, dict]:  # type: ignore[type-arg]
    env = {**os.environ, "FRANK_CACHE": cache, "PYTHONPATH": str(tree / "src")}
    cmd = [sys.executable, "-m", "frank", "audit", "stacks/served.toml", "--require-target",
           "--json"]
    wall, _, cpu, out, _ = _run(cmd, tree, env)
    return wall, cpu, json.loads(out)


def _run(cmd: list[str], cwd: Path, env: dict[str, str]
         ) -> tuple[float, int, float, str, str]:
    """As build_speed_bench.timed, but exit 1 (the audit's finding) is a result."""
    import subprocess
    import tempfile
    import time

    with tempfile.TemporaryFile() as out:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        code = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read().decode()
    if code not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} in {cwd}: exit {code}")
    return wall, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime, text, ""


def cufft(report: dict) -> str:  # type: ignore[type-arg]
    row = next((o for o in report.get("cuda", []) if o["owner"] == "closure:nvidia-cufft"),
               None)
    return "-" if row is None else f"SASS {' '.join(row['sass'])}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", type=Path, required=True, help="the earlier tree (its out/served)")
    ap.add_argument("--b", type=Path, default=HERE.parent)
    ap.add_argument("-n", type=int, default=3)
    ap.add_argument("--cache", default=os.environ.get("FRANK_CACHE", ""))
    ap.add_argument("--results", type=Path)
    args = ap.parse_args()
    rows: dict[str, list[tuple[float, float]]] = {"A": [], "B": []}
    last: dict[str, dict] = {}  # type: ignore[type-arg]
    for _ in range(args.n):
        for side, tree in (("A", args.a), ("B", args.b)):
            wall, cpu, report = audit(tree.resolve(), args.cache)
            rows[side].append((wall, cpu))
            last[side] = report
            print(f"{side}: {wall:.1f} s wall, {cpu:.1f} s CPU, "
                  f"{len(report['differences'])} differences", flush=True)
    med = {s: (statistics.median(w for w, _ in r), statistics.median(c for _, c in r))
           for s, r in rows.items()}
    lines = [
        f"# audit --require-target of served: A/B ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC)",
        "",
        f"Command: `{' '.join(sys.argv)}`; machine: {platform.node()}, {os.cpu_count()} "
        f"cores, load at the end {os.getloadavg()[0]:.1f}; image A "
        f"{last['A']['digest'][:19]}, B {last['B']['digest'][:19]}",
        "",
        "| side | tree | wall s (median) | CPU s (median) | differences | nvidia-cufft |",
        "|---|---|---|---|---|---|",
    ]
    for side, tree in (("A", args.a), ("B", args.b)):
        lines.append(f"| {side} | {tree} | {med[side][0]:.1f} | {med[side][1]:.1f} | "
                     f"{len(last[side]['differences'])} | {cufft(last[side])} |")
    lines += ["", f"B/A: wall {med['B'][0] / med['A'][0]:.2f}x, CPU "
                  f"{med['B'][1] / med['A'][1]:.2f}x (goal: within 1.2x)",
              "", "Runs (wall, CPU): " + "; ".join(
                  f"{s} {w:.1f}/{c:.1f}" for s in ("A", "B") for w, c in rows[s])]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.results:
        args.results.write_text(text)


if __name__ == "__main__":
    main()
