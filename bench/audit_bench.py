#!/usr/bin/env python3
"""What `frank audit` costs, side by side with the least any content check can cost.

For each image: `frank audit LAYOUT --json` as a user runs it (a whole process, in the repo
that built it), n times, against the anchor `sha256sum` of the same layer blobs (coreutils,
one hash per byte, one core: reading and hashing every byte once, nothing else). Wall and CPU
seconds are both printed: on a shared machine wall time measures the neighbours; CPU seconds
divided by the cores is what an idle machine of that many cores would take. Goal: served's
9.7 GB audited in <= 30 s on 2 cores.

Without --image, served-cpu is composed in a scratch copy of this repo (its cache: FRANK_CACHE).
Usage: .venv/bin/python bench/audit_bench.py [-n 3] [--image NAME=REPO:LAYOUT[:CACHE] ...]
       [--results bench/results/audit-DATE.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from tests.spine_helpers import copy_repo  # noqa: E402


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def timed(argv: list[str], cwd: Path, env: dict[str, str] | None = None
          ) -> tuple[float, float, str]:
    """(wall s, CPU s of the process, its stdout)."""
    cpu, start = _children_cpu(), time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False,
                          env=env)
    wall = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(argv)}: {proc.stderr.strip()[-2000:]}")
    return wall, _children_cpu() - cpu, proc.stdout


def layer_blobs(layout: Path) -> list[Path]:
    index = json.loads((layout / "index.json").read_text())
    blobs = layout / "blobs" / "sha256"
    manifest = json.loads((blobs / index["manifests"][0]["digest"].split(":")[1]).read_text())
    return [blobs / d["digest"].split(":")[1] for d in manifest["layers"]]


def bench(name: str, repo: Path, layout: Path, cache: str, n: int) -> dict[str, object]:
    audit = [sys.executable, "-m", "frank", "audit", str(layout), "--json"]
    anchor = ["sha256sum", *map(str, layer_blobs(layout))]
    timed(anchor, repo)  # the page cache holds what it can for both, alike
    rows: dict[str, list[tuple[float, float]]] = {"audit": [], "anchor": []}
    report: dict[str, object] = {}
    for _ in range(n):
        wall, cpu, out = timed(audit, repo, {**os.environ, "FRANK_CACHE": cache}
                               if cache else None)
        report = json.loads(out)
        rows["audit"].append((wall, cpu))
        wall, cpu, _ = timed(anchor, repo)
        rows["anchor"].append((wall, cpu))
    cost = report["cost"]
    assert isinstance(cost, dict)
    return {"name": name, "digest": report["digest"], "ok": report["ok"],
            "differences": len(report["differences"]),  # type: ignore[arg-type]
            "gb": cost["bytes"] / 1e9, "files": cost["files"], "cuda": report["cuda"],
            "audit_wall": statistics.median(w for w, _ in rows["audit"]),
            "audit_cpu": statistics.median(c for _, c in rows["audit"]),
            "anchor_wall": statistics.median(w for w, _ in rows["anchor"]),
            "anchor_cpu": statistics.median(c for _, c in rows["anchor"]),
            "load": os.getloadavg()[0]}


def compose_served_cpu(tmp: Path) -> tuple[Path, Path]:
    repo = copy_repo(tmp / "repo")
    subprocess.run([sys.executable, "-m", "frank", "compose", "stacks/served-cpu.toml",
                    "--json"], cwd=repo, check=True, capture_output=True)
    return repo, repo / "out" / "served-cpu" / "image"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=3)
    parser.add_argument("--image", action="append", default=[],
                        help="NAME=REPO:LAYOUT[:CACHE], an image, the repo that built it "
                             "and its FRANK_CACHE (the pinned wheels' RECORDs are read there)")
    parser.add_argument("--results", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        images = []
        for spec in args.image:
            name, _, rest = spec.partition("=")
            repo, layout, cache = [*rest.split(":"), ""][:3]
            images.append((name, Path(repo), Path(layout), cache))
        if not images:
            repo, layout = compose_served_cpu(Path(tmp))
            images.append(("served-cpu", repo, layout, ""))
        results = [bench(name, repo, layout, cache, args.n)
                   for name, repo, layout, cache in images]
    cores = os.cpu_count() or 1
    lines = [f"# `frank audit` cost, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC", "",
             f"Command: `python bench/audit_bench.py {' '.join(sys.argv[1:])}`  ",
             f"Machine: {platform.node()} ({platform.machine()}, {cores} cores, shared), "
             f"python {platform.python_version()}, n={args.n} (medians)", "",
             "| image | digest | GB | files | audit wall s | audit CPU s | CPU s / cores | "
             "anchor sha256sum wall s | anchor CPU s | CPU ratio | load (1 min) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(
            f"| {r['name']} | `{str(r['digest'])[:19]}…` | {r['gb']:.2f} | {r['files']} | "
            f"{r['audit_wall']:.1f} | {r['audit_cpu']:.1f} | "
            f"{float(r['audit_cpu']) / cores:.1f} | {r['anchor_wall']:.1f} | "  # type: ignore[arg-type]
            f"{r['anchor_cpu']:.1f} | "
            f"{float(r['audit_cpu']) / max(float(r['anchor_cpu']), 1e-9):.2f}x | "  # type: ignore[arg-type]
            f"{r['load']:.1f} |")
    for r in results:
        lines += ["", f"GPU code in {r['name']} ({r['differences']} differences, ok: {r['ok']}):",
                  ""]
        for owner in r["cuda"]:  # type: ignore[attr-defined]
            lines.append(f"- {owner['owner']}: {owner['files']} files; SASS "
                         f"{' '.join(owner['sass']) or '-'}; PTX {' '.join(owner['ptx']) or '-'}"
                         f"; runs as SASS {owner['runs_as_sass']}, PTX JIT only "
                         f"{owner['runs_as_ptx']}, neither {owner['runs_not']}")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.results:
        args.results.write_text(text)


if __name__ == "__main__":
    main()
