#!/usr/bin/env python3
"""frank's own cost before an engine starts, and the cost of a push (issue 53).

On a scratch copy of the repo whose stack is composed from a cache that already holds its
layers (one untimed compose first):

  python -c pass              a bare interpreter start: the anchor
  run --print                 `frank run STACK --print`: everything `frank run` does before
                              it calls the container engine (find the layout, verify its
                              blobs, audit it against the stack's lock in the repo, plan the
                              container), then it prints the plan instead
  push                        `frank push STACK --to 127.0.0.1:PORT/bench`: release mode
                              (the audit reading every layer, the image derived again from
                              the lock's pins in a scratch store), then the registry
  push --trust-cache          the same without release mode's check

The registry is Debian's docker-registry on 127.0.0.1, a fresh one for the run. Each step is
its own process; medians of --n runs, wall and CPU seconds (user + sys, children included:
on a shared 2-core machine wall time is mostly waiting for a core).

Usage: .venv/bin/python bench/start_push_bench.py [--stack smoke-cpu] [--n 3]
       [--cache DIR] [--results bench/results/start-push-smoke-cpu-DATE.md]
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from bench.build_speed_bench import results_head, timed  # noqa: E402
from bench.noop_bench import bench_args, environment, write_table  # noqa: E402
from tests.image.conftest import start_registry, stop  # noqa: E402
from tests.spine_helpers import copy_repo  # noqa: E402


def frank(repo: Path, env: dict[str, str], *args: str) -> tuple[float, float, str]:
    wall, _, cpu, out, _ = timed([sys.executable, "-m", "frank", *args], repo, env)
    return wall, cpu, out


def series(n: int, run: Callable[[], tuple[float, float, str]]) -> list[tuple[float, float]]:
    return [run()[:2] for _ in range(n)]


def row(name: str, runs: list[tuple[float, float]], anchor: float, note: str = ""
        ) -> tuple[str, str, str, str]:
    wall = statistics.median(w for w, _ in runs)
    cpu = statistics.median(c for _, c in runs)
    return (name, f"{wall:.2f} s ({wall / anchor:.0f}x)", f"{cpu:.2f} s",
            f"range {min(w for w, _ in runs):.2f}-{max(w for w, _ in runs):.2f} s wall, "
            f"{min(c for _, c in runs):.2f}-{max(c for _, c in runs):.2f} s CPU" +
            (f"; {note}" if note else ""))


def main() -> None:
    args = bench_args(__doc__ or "", "smoke-cpu", 3)
    scratch = Path(tempfile.mkdtemp(prefix="start-push-bench-", dir=args.scratch))
    env = environment(args.cache)
    proc, addr = start_registry(scratch / "registry")
    try:
        repo = copy_repo(scratch / "repo")
        composed = json.loads(frank(repo, env, "compose", f"stacks/{args.stack}.toml",
                                    "--json")[2])
        digest, lock = composed["image"]["digest"], composed["digest"]
        def bare() -> tuple[float, float, str]:
            wall, _, cpu, _, _ = timed([sys.executable, "-c", "pass"], repo, env)
            return wall, cpu, ""

        passes = series(args.n, bare)
        anchor = statistics.median(w for w, _ in passes)
        rows = [("python -c pass (the anchor)", f"{anchor:.3f} s (1x)",
                 f"{statistics.median(c for _, c in passes):.3f} s", "")]
        runs = series(args.n, lambda: frank(repo, env, "run", args.stack, "--print"))
        rows.append(row(f"frank run --print (median of {args.n})", runs, anchor,
                        "verify + audit against the stack's lock + plan"))
        print(rows[-1], flush=True)
        to = f"{addr}/bench"
        pushes = series(args.n, lambda: frank(repo, env, "push", args.stack, "--to", to))
        rows.append(row(f"frank push, release mode (median of {args.n})", pushes, anchor,
                        "full audit + image derived again + send"))
        print(rows[-1], flush=True)
        trusted = series(args.n, lambda: frank(repo, env, "push", args.stack, "--to", to,
                                               "--trust-cache"))
        rows.append(row(f"frank push --trust-cache (median of {args.n})", trusted, anchor,
                        "audit (kept readings) + send"))
        print(rows[-1], flush=True)
    finally:
        stop(proc)
        shutil.rmtree(scratch, ignore_errors=True)
    write_table(results_head(f"frank run's start and frank push on {args.stack}",
                             "start_push_bench.py")
                + f"Image digest: `{digest}`, lock digest `{lock}`\n\n", rows, args.results)


if __name__ == "__main__":
    main()
