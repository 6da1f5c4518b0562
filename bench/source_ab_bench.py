#!/usr/bin/env python3
"""Two versions of frank's source, A and B, rebuilding the same stack in turns (issue 41).

A single timed build on a 2-core VM varies by 10-25% from one run to the next; a change worth
5% only shows when the two versions run back to back, several times, on the same caches.
This bench copies the repo once, composes the stack once from empty caches (downloads into
the store), then for each pair drops every layer blob and index entry (the downloads stay)
and composes with A's source, then again with B's, each its own process
(``PYTHONPATH=<src>``: the layer workers it spawns inherit it). It prints each run's wall and
CPU seconds (its children's included), the audit's seconds, and the digest, which must not
change between versions.

Usage: python bench/source_ab_bench.py --a /path/to/old/src --b src [--stack served] [--pairs 3]
(a git worktree of the commit to compare makes a good A: ``git worktree add /tmp/a HEAD~1``.)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from bench.build_speed_bench import timed  # noqa: E402
from bench.hermetic_build_bench import drop_layer_blobs  # noqa: E402
from tests.spine_helpers import copy_repo  # noqa: E402


def compose(repo: Path, env: dict[str, str], src: Path, out: Path, stack: str
            ) -> tuple[float, float, float, str]:
    """(wall s, CPU s, audit s, digest) of one compose with frank from ``src``."""
    cmd = [sys.executable, "-m", "frank", "compose", f"stacks/{stack}.toml", "--json",
           "--out", str(out)]
    wall, _, cpu, stdout, _ = timed(cmd, repo, {**env, "PYTHONPATH": str(src)})
    doc = json.loads(stdout)
    return wall, cpu, float(doc["audit"]["seconds"]), str(doc["image"]["digest"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", type=Path, required=True, help="src folder of version A")
    ap.add_argument("--b", type=Path, required=True, help="src folder of version B")
    ap.add_argument("--stack", default="served")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--scratch", type=Path, default=None, help="folder for caches (big)")
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="source-ab-", dir=args.scratch))
    try:
        repo = copy_repo(scratch / "repo")
        env = {k: v for k, v in os.environ.items() if k != "SOURCE_DATE_EPOCH"}
        env["FRANK_CACHE"] = env["FRANK_CACHE_DIR"] = str(scratch / "cache")
        if args.stack == "served":  # mhc-overlap's URL is unreachable here
            subprocess.run([sys.executable, "-m", "frank", "revert", "mhc-overlap", "--stack",
                            "stacks/served.toml"], cwd=repo, env=env, check=True,
                           capture_output=True)
        first = compose(repo, env, args.b.resolve(), scratch / "out", args.stack)
        print(f"cold (B): {first[0]:.1f} s, {first[1]:.1f} CPU s, {first[3]}", flush=True)
        runs: dict[str, list[tuple[float, float, float, str]]] = {"A": [], "B": []}
        for _ in range(args.pairs):
            for name, src in (("A", args.a), ("B", args.b)):
                drop_layer_blobs(Path(env["FRANK_CACHE"]))
                runs[name].append(compose(repo, env, src.resolve(), scratch / "out",
                                          args.stack))
                w, c, a, d = runs[name][-1]
                print(f"{name}: {w:.1f} s, {c:.1f} CPU s, audit {a:.1f} s, {d}", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print("| version | wall s (median) | CPU s (median) | audit s | runs |\n|---|---|---|---|---|")
    for name, rs in runs.items():
        print(f"| {name} | {statistics.median(r[0] for r in rs):.1f} | "
              f"{statistics.median(r[1] for r in rs):.1f} | "
              f"{statistics.median(r[2] for r in rs):.1f} | "
              f"{' / '.join(f'{r[0]:.1f}' for r in rs)} |")
    digests = {r[3] for rs in runs.values() for r in rs} | {first[3]}
    print(f"digests: {', '.join(sorted(digests))}" + ("" if len(digests) == 1 else
                                                      "  <- DIFFERENT"))


if __name__ == "__main__":
    main()
