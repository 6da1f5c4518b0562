#!/usr/bin/env python3
"""The developer's loop on a built stack, side by side with a bare interpreter (issue 53).

On a scratch copy of the repo, with a cache that already holds the stack's layers (the
stat ledger's goals are about a warm loop, not downloads):

  python -c pass   a bare interpreter start: the anchor
  no-op            `frank compose` again, nothing changed (goal < 1 s)
  env part         an env part's value changed to one never composed before, each turn
                   (frank's lock layer is built anew each time; goal < 2 s)
  data part        a data part's file changed (its pin with it), new content each turn, so
                   its layer is built every time (goal < 3 s)
  first no-op      the no-op right after each data-part compose, which built a layer and
                   linked a new output (goal < 1 s too)

Each is its own process; medians of --n runs, wall and CPU seconds (user + sys of the child
and its children). CPU seconds are the figure that a busy shared machine leaves honest: on
2 cores with other work running, wall time is mostly waiting for a core. Bytecode caches
are on (PYTHONDONTWRITEBYTECODE is dropped: a user's interpreter writes them), and one
untimed compose first builds the scratch copy's output and warms them.

Usage: .venv/bin/python bench/noop_bench.py [--stack served] [--n 5] [--cache DIR]
       [--results bench/results/noop-served-DATE.md]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from bench.build_speed_bench import results_head, timed  # noqa: E402
from tests.spine_helpers import copy_repo  # noqa: E402

ENV_PART = "parts/cpu-experts-sched/2.toml"
ENV_LINE = re.compile(r'EXL3_CPU_EXPERTS_SCHED = "([^"]*)"')
DATA_PART = "parts/expert-plan/own-traffic.toml"
DATA_FILE = "parts/expert-plan/own-traffic.plan.json"


def environment(cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("SOURCE_DATE_EPOCH", "PYTHONDONTWRITEBYTECODE")}
    env["FRANK_CACHE"] = env["FRANK_CACHE_DIR"] = str(cache)
    return env


def compose(repo: Path, env: dict[str, str], stack: str) -> tuple[float, float, dict]:
    wall, _, cpu, out, _ = timed([sys.executable, "-m", "frank", "compose",
                                  f"stacks/{stack}.toml", "--json"], repo, env)
    return wall, cpu, json.loads(out)


def set_env(repo: Path, value: str) -> str:
    """The env part's value set to ``value``; the value it had."""
    path = repo / ENV_PART
    text = path.read_text()
    was = ENV_LINE.search(text)
    path.write_text(ENV_LINE.sub(f'EXL3_CPU_EXPERTS_SCHED = "{value}"', text))
    return was.group(1) if was else ""


_ORIGINAL: dict[Path, str] = {}


def toggle_data(repo: Path, turn: int, nonce: str = "") -> None:
    """The plan file with one more key, new each turn (a layer never built before), or as it
    was (``nonce`` empty); its sha256 pin follows."""
    data = repo / DATA_FILE
    text = _ORIGINAL.setdefault(data, data.read_text())
    if nonce:
        doc = json.loads(text)
        doc["bench_turn"] = f"{nonce}-{turn}"
        data.write_text(json.dumps(doc) + "\n")
    else:
        data.write_text(text)
    digest = hashlib.sha256(data.read_bytes()).hexdigest()
    part = repo / DATA_PART
    part.write_text(re.sub(r'(?m)^sha256 = "[0-9a-f]{64}"', f'sha256 = "{digest}"',
                           part.read_text()))


def series(n: int, run: Callable[[int], tuple[float, float, dict]]
           ) -> list[tuple[float, float, dict]]:
    return [run(i) for i in range(n)]


def row(name: str, runs: list[tuple[float, float, dict]], goal: str,
        anchor: float) -> tuple[str, str, str, str]:
    wall = statistics.median(w for w, _, _ in runs)
    cpu = statistics.median(c for _, c, _ in runs)
    built = sorted({d.get("image", {}).get("layers_built", 0) for _, _, d in runs})
    audits = [d["audit"] for _, _, d in runs if d.get("audit")]
    ran = [a["cpu_seconds"] for a in audits if not a.get("kept")]
    audit = (f"audit {statistics.median(ran):.2f} CPU s" if ran else
             "audit kept from the compose that built this digest")
    return (name, f"{wall:.2f} s ({wall / anchor:.0f}x)", f"{cpu:.2f} s",
            f"range {min(w for w, _, _ in runs):.2f}-{max(w for w, _, _ in runs):.2f} s; "
            f"layers built {built}; {audit}; {goal}")


def bench_args(doc: str, stack: str, n: int) -> argparse.Namespace:
    """--stack, --n, --cache (FRANK_CACHE by default; it must exist), --scratch, --results."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--stack", default=stack)
    ap.add_argument("--n", type=int, default=n)
    ap.add_argument("--cache", type=Path, default=Path(os.environ.get("FRANK_CACHE", "")))
    ap.add_argument("--scratch", type=Path, default=None)
    ap.add_argument("--results", type=Path, default=None)
    args = ap.parse_args()
    if not str(args.cache) or not args.cache.is_dir():
        raise SystemExit("--cache (or FRANK_CACHE) must name a cache that holds the stack")
    return args


def main() -> None:
    args = bench_args(__doc__ or "", "served", 5)
    scratch = Path(tempfile.mkdtemp(prefix="noop-bench-", dir=args.scratch))
    env = environment(args.cache)
    try:
        repo = copy_repo(scratch / "repo")
        first = compose(repo, env, args.stack)  # the scratch output, bytecode caches
        digest = first[2]["image"]["digest"]
        compose(repo, env, args.stack)

        def bare(_: int) -> tuple[float, float, dict]:
            wall, _, cpu, _, _ = timed([sys.executable, "-c", "pass"], repo, env)
            return wall, cpu, {}

        passes = series(args.n, bare)
        anchor = statistics.median(w for w, _, _ in passes)
        rows = [("python -c pass (the anchor)", f"{anchor:.3f} s (1x)",
                 f"{statistics.median(c for _, c, _ in passes):.3f} s", "")]
        noop = series(args.n, lambda _: compose(repo, env, args.stack))
        rows.append(row(f"no-op recompose (median of {args.n})", noop, "goal < 1 s", anchor))
        print(rows[-1], flush=True)

        fresh = str(time.time_ns())
        original = set_env(repo, "")
        set_env(repo, original)

        def env_turn(i: int) -> tuple[float, float, dict]:
            set_env(repo, f"{fresh}-{i}")  # a value no compose has seen
            return compose(repo, env, args.stack)

        envs = series(args.n, env_turn)
        rows.append(row(f"one env part changed (median of {args.n})", envs, "goal < 2 s",
                        anchor))
        print(rows[-1], flush=True)
        set_env(repo, original)
        compose(repo, env, args.stack)
        datas, after = [], []
        nonce = str(time.time_ns())
        for i in range(args.n):
            toggle_data(repo, i, nonce)
            datas.append(compose(repo, env, args.stack))
            after.append(compose(repo, env, args.stack))
        rows.append(row(f"one data part changed (median of {args.n})", datas, "goal < 3 s",
                        anchor))
        rows.append(row(f"first no-op after that build (median of {args.n})", after,
                        "goal < 1 s", anchor))
        print(rows[-2:], flush=True)
        toggle_data(repo, 0)
        last = compose(repo, env, args.stack)
        same = last[2]["image"]["digest"] == digest
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    write_table(results_head(f"The developer's loop on {args.stack}", "noop_bench.py")
                + f"Image digest: `{digest}` (again after every change was taken back: "
                f"{same})\n\n", rows, args.results)


def write_table(head: str, rows: list[tuple[str, str, str, str]], results: Path | None
                ) -> None:
    """Print the results table (step, wall, CPU, notes) under ``head``; write it to
    ``results`` if given."""
    table = head + "| step | wall (x the anchor) | CPU | notes |\n|---|---|---|---|\n" + \
        "".join(f"| {a} | {b} | {c} | {d} |\n" for a, b, c, d in rows)
    print(table)
    if results:
        results.write_text(table)


if __name__ == "__main__":
    main()
