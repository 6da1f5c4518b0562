#!/usr/bin/env python3
"""frank's embedded build against the fastest installer, side by side in one run (issue 41).

On a scratch copy of the repo (mhc-overlap taken back: its URL is unreachable here):

  uv cold    `uv pip install --target DIR -r stacks/pylock.<stack>.toml` from an empty uv
             cache: the same closure put on disk by the best installer (the anchor)
  cold       `frank compose` from an empty cache (downloads, every layer, the layout)
             goal: <= 1.5x uv cold. --cold N pairs (uv, then frank), alternating: the
             medians and the median of the pairs' ratios are quoted
  no-op      recompose of the built stack, median of --noop runs (goal < 1 s)
  one-part   the region-cache plugin's source changed (goal < 2 s)
  warm-dl    every layer blob and index entry dropped, the downloads kept (goal <= 40 s for
             served): must give the cold digest again
  audit      the audit's own seconds inside the cold and warm-dl composes (it reads every
             layer of the image once more and holds it to the lock)
  serve      served-cpu composed in the same scratch cache, then `frank run served-cpu` to
             /health of a tiny local model: with an empty engine storage (the image imported
             and checked first) and again warm (skip with --no-serve)

Each frank run is its own process; its peak memory is the child's max RSS (os.wait4), goal
<= 1 GB. uv's target and cache are removed before frank starts, so the disk holds one
closure at a time (served: about 10 GB for uv, 14 GB for frank). Both cold runs are
network-bound: run them on a quiet machine and quote the ratio, not the seconds.

Usage: .venv/bin/python bench/build_speed_bench.py [--stack served] [--noop 5] [--cold 3]
       [--expect sha256:...] [--no-serve] [--results bench/results/build-speed-DATE.md]
The served-cpu starts need buildah and port 8000 free.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from bench.hermetic_build_bench import drop_layer_blobs  # noqa: E402
from tests.spine_helpers import copy_repo  # noqa: E402

UV = Path(sys.executable).with_name("uv")
CA = "/etc/ssl/certs/ca-certificates.crt"


def timed(cmd: list[str], cwd: Path, env: dict[str, str]
          ) -> tuple[float, int, float, str, str]:
    """(wall seconds, peak RSS in bytes, CPU seconds (user + sys, its children's included),
    stdout, stderr) of one child process."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])}: exit {proc.returncode}: {stderr[-2000:]}")
    cpu = usage.ru_utime + usage.ru_stime
    return elapsed, usage.ru_maxrss * 1024, cpu, stdout, stderr


def results_head(title: str, script: str) -> str:
    """A results file's title, command and machine lines (with the load at the end)."""
    load = os.getloadavg()
    return (f"# {title}, {datetime.now(UTC).strftime('%Y-%m-%d %H:%M')} UTC\n\n"
            f"Command: `python bench/{script} {' '.join(sys.argv[1:])}`  \n"
            f"Machine: {platform.node()} ({platform.machine()}, {os.cpu_count()} cores, "
            f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB), "
            f"load average at the end {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}  \n")


def frank(repo: Path, cache: Path, *args: str) -> tuple[float, int, dict]:
    env = {k: v for k, v in os.environ.items() if k != "SOURCE_DATE_EPOCH"}
    env["FRANK_CACHE"] = env["FRANK_CACHE_DIR"] = str(cache)
    wall, rss, cpu, out, _ = timed([sys.executable, "-m", "frank", *args], repo, env)
    doc = json.loads(out) if out.startswith("{") else {}
    doc["_cpu"] = cpu
    return wall, rss, doc


def compose(repo: Path, cache: Path, out: Path, stack: str) -> tuple[float, int, dict]:
    return frank(repo, cache, "compose", f"stacks/{stack}.toml", "--json", "--out", str(out))


def uv_cold(repo: Path, stack: str, scratch: Path) -> tuple[float, int, float]:
    env = dict(os.environ)
    env.update({"UV_CACHE_DIR": str(scratch / "uv-cache"), "SSL_CERT_FILE": CA,
                "UV_NO_CONFIG": "1"})
    target = scratch / "uv-target"
    wall, _, cpu, _, _ = timed([str(UV), "pip", "install", "--target", str(target),
                               "--python", sys.executable,
                               "--python-platform", "x86_64-manylinux_2_36",
                               "-r", f"stacks/pylock.{stack}.toml", "-q"], repo, env)
    size = sum(p.stat().st_size for p in target.rglob("*") if p.is_file() and not p.is_symlink())
    shutil.rmtree(target)
    shutil.rmtree(scratch / "uv-cache")
    return wall, size, cpu


def serve_rows(repo: Path, cache: Path, scratch: Path) -> list[tuple[str, str, str]]:
    """served-cpu composed in the bench's cache, then started with an empty engine storage
    (its own FRANK_CACHE: the image is imported from the layout and checked) and again."""
    from bench.serve_image_bench import start_to_health
    from tests.fixtures.local_hub import publish
    from tests.fixtures.tiny_model import build_tiny_model

    hub = scratch / "hub"
    publish(build_tiny_model(scratch / "model"), hub, "frank-test/tiny-llama")
    t, _, doc = frank(repo, cache, "compose", "stacks/served-cpu.toml", "--json")
    rows = [("compose served-cpu (same cache)", f"{t:.1f} s",
             f"{doc['image']['layers_built']} layers built; digest {doc['image']['digest']}")]
    env = {k: v for k, v in os.environ.items() if k != "SOURCE_DATE_EPOCH"}
    env["FRANK_CACHE"] = env["FRANK_CACHE_DIR"] = str(scratch / "run-cache")
    cmd = [sys.executable, "-m", "frank", "run", "served-cpu", "--hub-cache", str(hub)]
    for what in ("empty engine storage", "warm"):
        took = start_to_health(cmd, env, 8000, scratch / f"run-{what[:4]}.log", cwd=repo)
        rows.append((f"frank run served-cpu to /health, {what}", f"{took:.1f} s",
                     "tiny local model on the CPU"))
    return rows


def free_gb(path: Path) -> float:
    return shutil.disk_usage(path).free / 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stack", default="served")
    ap.add_argument("--noop", type=int, default=5)
    ap.add_argument("--expect", default="", help="the digest the cold build must give")
    ap.add_argument("--scratch", type=Path, default=None, help="folder for caches (big)")
    ap.add_argument("--skip-uv", action="store_true")
    ap.add_argument("--cold", type=int, default=3,
                    help="cold pairs (uv, then frank, from empty caches), medians quoted")
    ap.add_argument("--min-free-gb", type=float, default=16.0,
                    help="refuse to start frank's cold build with less free disk (served "
                         "needs 14 GB: 4.3 GB of wheels and 9.7 GB of layer blobs)")
    ap.add_argument("--results", type=Path)
    ap.add_argument("--no-serve", action="store_true", help="skip the served-cpu starts")
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="build-speed-", dir=args.scratch))
    rows: list[tuple[str, str, str]] = []
    try:
        repo = copy_repo(scratch / "repo")
        if args.stack == "served":
            subprocess.run([sys.executable, "-m", "frank", "revert", "mhc-overlap", "--stack",
                            "stacks/served.toml"], cwd=repo, check=True, capture_output=True,
                           env={**os.environ, "FRANK_CACHE": str(scratch / "lock-cache"),
                                "FRANK_CACHE_DIR": str(scratch / "lock-cache")})
        print(f"disk free at start: {free_gb(scratch):.1f} GB", flush=True)
        cache, out = scratch / "cache", scratch / "out"
        pairs: list[tuple[float, float, float, float]] = []  # uv s, uv CPU, frank s, CPU
        cold_rss = 0
        for k in range(args.cold):  # uv then frank, each from empty caches, alternating
            for old in (cache, out):  # the last pair's build goes first: each tool
                shutil.rmtree(old, ignore_errors=True)  # starts with the same free memory
            uv_wall, uv_bytes, uv_cpu = (0.0, 0, 0.0) if args.skip_uv else \
                uv_cold(repo, args.stack, scratch)
            if free_gb(scratch) < args.min_free_gb:
                raise SystemExit(f"{free_gb(scratch):.1f} GB free under {scratch}, fewer "
                                 f"than --min-free-gb {args.min_free_gb:g}: not building")
            cold, rss, doc = compose(repo, cache, out, args.stack)
            cold_rss = max(cold_rss, rss)
            pairs.append((uv_wall, uv_cpu, cold, doc["_cpu"]))
            digest = doc["image"]["digest"]
            print(f"cold pair {k + 1}: uv {uv_wall:.1f} s ({uv_cpu:.1f} CPU s), frank "
                  f"{cold:.1f} s ({doc['_cpu']:.1f} CPU s) {digest}", flush=True)
            if args.expect and digest != args.expect:
                raise SystemExit(f"cold digest {digest} is not the expected {args.expect}")
        if args.results:  # where the last cold build's time went, layer by layer
            shutil.copyfile(out / "build.log", args.results.with_suffix(".cold-build.log"))
        n = len(pairs)
        each = "; ".join(f"{u:.1f}/{f:.1f}" for u, _, f, _ in pairs)
        uv_wall = statistics.median(u for u, _, _, _ in pairs)
        cold = statistics.median(f for _, _, f, _ in pairs)
        if not args.skip_uv:
            rows.append((f"uv pip install --target, empty uv cache (median of {n})",
                         f"{uv_wall:.1f} s", f"{uv_bytes / 1e9:.2f} GB installed; "
                         f"{statistics.median(c for _, c, _, _ in pairs):.1f} CPU s; "
                         "the anchor"))
        ratios = [f / u for u, _, f, _ in pairs if u]
        fastest = min((u for u, _, _, _ in pairs if u), default=0.0)
        ratio = (f"; median of the pairs' ratios {statistics.median(ratios):.2f}x uv, "
                 f"{cold / fastest:.2f}x uv's fastest run (goal <= 1.5x); uv/frank s per "
                 f"pair {each}") if ratios else ""
        rows.append((f"frank compose, empty cache (median of {n})", f"{cold:.1f} s",
                     f"{doc['image']['layers_built']} layers; "
                     f"{statistics.median(c for _, _, _, c in pairs):.1f} CPU s; "
                     f"peak RSS {cold_rss / 1e6:.0f} MB{ratio}"))
        print(rows[-2:], flush=True)
        noops = [compose(repo, cache, out, args.stack) for _ in range(args.noop)]
        med = statistics.median(t for t, _, _ in noops)
        rows.append((f"no-op recompose (median of {args.noop})", f"{med:.2f} s",
                     f"range {min(t for t, _, _ in noops):.2f}-"
                     f"{max(t for t, _, _ in noops):.2f} s; goal < 1 s"))
        print(rows[-1], flush=True)
        plugin = repo / "plugins" / "region_cache" / "frank_region_cache" / "__init__.py"
        plugin.write_text(plugin.read_text() + "\n# bench: a one-part change\n")
        one, _, doc1 = compose(repo, cache, out, args.stack)
        rows.append(("one-part change (region-cache plugin)", f"{one:.2f} s",
                     f"{doc1['image']['layers_built']} layers built; goal < 2 s"))
        print(rows[-1], flush=True)
        plugin.write_text(plugin.read_text().replace("\n# bench: a one-part change\n", ""))
        drop_layer_blobs(cache)
        warm, warm_rss, doc2 = compose(repo, cache, out, args.stack)
        same = doc2["image"]["digest"] == digest
        rows.append(("warm downloads, no layer blobs", f"{warm:.1f} s",
                     f"{doc2['image']['layers_built']} layers; {doc2['_cpu']:.1f} CPU s; "
                     f"peak RSS "
                     f"{warm_rss / 1e6:.0f} MB; digest {'identical' if same else 'DIFFERENT'}"
                     f"; goal <= 40 s"))
        print(rows[-1], flush=True)
        rows.append(("peak memory of compose", f"{max(cold_rss, warm_rss) / 1e9:.2f} GB",
                     "max RSS of the cold and warm-dl processes; goal <= 1 GB"))
        for what, d in (("cold", doc), ("warm-dl", doc2)):
            rows.append((f"audit, inside the {what} compose", f"{d['audit']['seconds']:.1f} s",
                         f"{d['audit']['cpu_seconds']:.1f} CPU s, {d['audit']['files']} "
                         f"files; ok {d['audit']['ok']}"))
        if not args.no_serve:
            rows += serve_rows(repo, cache, scratch)
            print(rows[-3:], flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    head = (results_head(f"Build speed of {args.stack} against uv", "build_speed_bench.py")
            + f"Image digest (cold; warm-dl gave the same: {same}): `{digest}`\n\n"
            "| step | time | notes |\n|---|---|---|\n")
    table = head + "".join(f"| {a} | {b} | {c} |\n" for a, b, c in rows)
    print(table)
    if args.results:
        args.results.write_text(table)


if __name__ == "__main__":
    main()
