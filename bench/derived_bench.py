#!/usr/bin/env python3
"""Derived parts (issue 43): the expert-plan builder on campaign-size traces, and
`frank lock --check` with a derived part present (it checks keys, it never runs a program).

Rows, each a whole process run n times interleaved with a bare interpreter start (the
unit), medians:

- the builder alone (`plan.py`) on four replays of 40 layers x 384 experts, counts of the
  campaign's order (about a million routed tokens x 8 experts per layer per replay), budget
  5,296 CPU experts: what a derivation costs;
- `frank lock` of a stack whose derived part must be made (a fresh key each time: frank
  runs the builder twice in its sandbox, compares, keeps the output): the whole derivation;
- `frank lock --check stacks/served-cpu-plan.toml`, kept answer and worked out
  (FRANK_NO_ANSWER_CACHE=1), beside the same for served-cpu (no derived part): a derived
  part adds no run; `$FRANK_CACHE/derived/runs.jsonl` must not grow during the check rows.

Everything runs in a temporary copy of the repo's parts/stacks/images with a temporary
FRANK_CACHE and FRANK_CACHE_DIR.

Usage: .venv/bin/python bench/derived_bench.py [-n 11] [--write]
  --write  also write bench/results/derived-<date>.md (table, command, machine)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from spine_bench import machine  # noqa: E402  (the bench folder is not a package)

LAYERS, EXPERTS, REPLAYS, TOKENS, TOP_K, BUDGET = 40, 384, 4, 1_000_000, 8, 5296


def campaign_traces(out: Path) -> list[Path]:
    """Four replays at the campaign's geometry and scale (fixed seed)."""
    rng = random.Random(43)
    out.mkdir(parents=True, exist_ok=True)
    ranks = []
    for _ in range(LAYERS):
        order = list(range(EXPERTS))
        rng.shuffle(order)
        w = [0.0] * EXPERTS
        for r, e in enumerate(order):
            w[e] = 1.0 / (r + 1) ** 0.9
        ranks.append(w)
    paths = []
    for n in range(1, REPLAYS + 1):
        counts = {}
        for layer, w in enumerate(ranks):
            noisy = [x * rng.lognormvariate(0.0, 0.3) for x in w]
            total = sum(noisy)
            counts[str(layer)] = [round(TOKENS * TOP_K * x / total) for x in noisy]
        path = out / f"replay-{n}.json"
        path.write_text(json.dumps({"format": "frank-routing-counts/1", "counts": counts}))
        paths.append(path)
    return paths


def timed(argv: list[str], cwd: Path, env: dict[str, str], ok: tuple[int, ...] = (0,)
          ) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode not in ok:
        raise SystemExit(f"{argv} failed ({proc.returncode}): {proc.stderr.decode()[-500:]}")
    return elapsed


def runs(cache: Path) -> int:
    path = cache / "derived" / "runs.jsonl"
    return len(path.read_text().splitlines()) if path.is_file() else 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=11)
    parser.add_argument("--write", action="store_true")
    opts = parser.parse_args()
    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="frank-derived-bench-") as tmp_:
        tmp = Path(tmp_)
        repo = tmp / "repo"
        for name in ("parts", "stacks", "images", "plugins", "kernels"):
            shutil.copytree(REPO / name, repo / name)
        traces = campaign_traces(repo / "parts/expert-plan/campaign-traces")
        size = sum(p.stat().st_size for p in traces)
        # a derived version on the campaign-size traces, and a stack that adds it to smoke
        text = (repo / "parts/expert-plan/from-traces.toml").read_text()
        text = text.replace('version = "from-traces"', 'version = "campaign"')
        text = text.split("[[inputs]]")[0] + "".join(
            f'[[inputs]]\npath = "parts/expert-plan/campaign-traces/{p.name}"\n\n'
            for p in traces) + "[params]" + text.split("[params]")[1]
        (repo / "parts/expert-plan/campaign.toml").write_text(text)
        stack = repo / "stacks/derive-bench.toml"
        cache = tmp / "cache"
        env = {**os.environ, "FRANK_CACHE": str(cache), "FRANK_CACHE_DIR": str(tmp / "memo"),
               "COLUMNS": "120"}
        env.pop("FRANK_NO_ANSWER_CACHE", None)
        worked = {**env, "FRANK_NO_ANSWER_CACHE": "1"}
        builder = [py, str(repo / "builders/expert-plan/plan.py"), "--out",
                   str(tmp / "plan.json"), "--layers", str(LAYERS), "--experts", str(EXPERTS),
                   "--cpu-experts", str(BUDGET), *map(str, traces)]
        frank = [py, "-m", "frank"]
        for s in ("served-cpu-plan", "served-cpu"):  # locks as committed, outputs kept
            timed([*frank, "lock", s], repo, env)
        rows: dict[str, list[float]] = {}
        names = {
            "python -c pass (the unit)": lambda: timed([py, "-c", "pass"], repo, env),
            "builder plan.py, 4 x 40 x 384 traces": lambda: timed(builder, repo, env),
        }
        for s in ("served-cpu-plan", "served-cpu"):
            names[f"lock --check {s} (kept)"] = \
                lambda s=s: timed([*frank, "lock", "--check", s], repo, env)
            names[f"lock --check {s} (worked out)"] = \
                lambda s=s: timed([*frank, "lock", "--check", s], repo, worked)
        for fn in names.values():  # warm: bytecode, kept answers
            fn()
        before = runs(cache)
        for _ in range(opts.n):
            for name, fn in names.items():
                rows.setdefault(name, []).append(fn())
        check_runs = runs(cache) - before
        # the whole derivation through frank: a new budget each time, so a new key
        derive: list[float] = []
        for i in range(max(3, opts.n // 3)):
            path = repo / "parts/expert-plan/campaign.toml"
            path.write_text(path.read_text().replace(
                f"cpu-experts = {BUDGET + i - 1 if i else BUDGET}",
                f"cpu-experts = {BUDGET + i}"))
            stack.write_text('extends = "smoke-cpu.toml"\n\n[add]\nexpert-plan = "campaign"\n')
            n0 = runs(cache)
            derive.append(timed([*frank, "lock", "derive-bench"], repo, env))
            assert runs(cache) == n0 + 1, "frank lock did not derive"
        rows["frank lock, derived part made (2 sandboxed runs)"] = derive
    unit = statistics.median(rows["python -c pass (the unit)"])
    when = datetime.now(UTC)
    lines = [f"# {when:%Y-%m-%d %H:%M} UTC, n={opts.n} (derivation rows: {len(derive)}), "
             f"traces {REPLAYS} x {LAYERS} x {EXPERTS}, {size / 1e6:.2f} MB of JSON",
             f"{'row':52s} {'median s':>9s} {'min s':>7s} {'max s':>7s} {'x bare':>7s}"]
    for name, values in rows.items():
        med = statistics.median(values)
        lines.append(f"{name:52s} {med:9.3f} {min(values):7.3f} {max(values):7.3f} "
                     f"{med / unit:6.1f}x")
    lines.append(f"program runs during the {opts.n * 4} lock --check runs: {check_runs}")
    print("\n".join(lines))
    if opts.write:
        command = " ".join(shlex.quote(a) for a in [
            os.path.relpath(sys.executable, REPO), "bench/derived_bench.py", *sys.argv[1:]])
        out = REPO / "bench" / "results" / f"derived-{when:%Y-%m-%d}.md"
        out.write_text(
            f"# Derived parts: builder and lock --check, {when:%Y-%m-%d %H:%M} UTC\n\n"
            f"Command: `{command}` (from the repo root)\n\nMachine: {machine()}\n\n"
            "Whole processes, interleaved with `python -c pass` (the unit); medians. "
            "\"kept\": the answer frank.store.memo keeps holds; \"worked out\": "
            "FRANK_NO_ANSWER_CACHE=1, every input hashed again and every key checked "
            "against the lock (no program runs either way: the last line counts them).\n\n"
            "```\n" + "\n".join(lines) + "\n```\n")
        print(f"wrote {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
