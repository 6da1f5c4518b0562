"""Issue 52: the served FlashInfer set built ahead of time by frank, cold, again, and twice.

Three runs of served's ``aot:flashinfer-aot`` layer, each a fresh process under
``/usr/bin/time`` (wall seconds, peak resident memory of the largest process):

1. cold: an empty cache A (the pinned wheels come from the mirror folders, so the network is
   not timed; unpacking them is);
2. unchanged: cache A again (every module kept by key: must be about 0 s);
3. cold again in an empty cache B.

Each run assembles the layer exactly as ``frank compose`` does (``frank.assemble.builder``'s
``assemble_layer`` on served's plan, then ``frank.image.layer.build_layer`` with the plan's
key) and prints the layer's digest: A and B must agree. That layer is the only one of the
served image this part changes, so equal layer digests give equal image digests when the
rest of the lock is the same. Per-module compile times come from ninja's log
(``$FRANK_CACHE/aot/runs.jsonl``).

    python bench/flashinfer_aot_bench.py [--stack served] [--scratch DIR] [--mirror DIR]...

Run it under ``nice -n 10`` on a shared machine; results go under bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(plan_path: Path, layer_name: str) -> None:
    """One run in this process's FRANK_CACHE: the layer assembled and tarred; JSON out."""
    from frank.assemble.builder import OCI_BUILDER_VERSION, assemble_layer
    from frank.assemble.plan import BuildPlan
    from frank.hashing import sha256_file, sha256_json
    from frank.image.layer import build_layer
    from frank.image.spec import LayerInput
    from frank.store.blobs import BlobStore
    from frank.store.fetch import Fetcher

    plan = BuildPlan.model_validate(json.loads(plan_path.read_text()))
    layer = next(x for x in plan.layers if x.name == layer_name)
    store = BlobStore()
    fetcher = Fetcher(store)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(dir=store.tmp_dir, prefix="bench-") as tmp:
        staging = Path(tmp) / "rootfs"
        staging.mkdir()
        assemble_layer(layer, plan, ROOT, staging, fetcher, Path(tmp) / "log")
        files = {p.relative_to(staging).as_posix(): sha256_file(p)
                 for p in sorted(staging.rglob("*.so"))}
        key = sha256_json({"plan_layer": layer.key, "builder": OCI_BUILDER_VERSION})
        rec, _ = build_layer(store, LayerInput(name=layer.name, key=key,
                                               entries=((staging, "/"),)),
                             plan.source_date_epoch)
    print(json.dumps({"layer_digest": rec.digest, "files": files,
                      "seconds": round(time.monotonic() - start, 1)}))


def run(cache: Path, plan: Path, layer: str, mirrors: list[str]) -> dict[str, object]:
    env = {**os.environ, "FRANK_CACHE": str(cache), "FRANK_MIRROR": os.pathsep.join(mirrors)}
    timing = cache.parent / f"{cache.name}.time"
    start = time.monotonic()
    proc = subprocess.run(["/usr/bin/time", "-f", "%e %M", "-o", str(timing), sys.executable,
                           __file__, "--child", str(plan), "--layer", layer],
                          env=env, capture_output=True, text=True, check=False)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit(f"run in {cache} failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    _, maxrss_kb = timing.read_text().split()[-2:]
    runs = cache / "aot" / "runs.jsonl"
    built = [json.loads(x) for x in runs.read_text().splitlines()] if runs.is_file() else []
    return {**out, "wall_s": round(wall, 1), "peak_rss_mb": round(int(maxrss_kb) / 1024),
            "runs": built}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--layer", default="aot:flashinfer-aot")
    ap.add_argument("--stack", default="served")
    ap.add_argument("--scratch", type=Path, default=None)
    ap.add_argument("--mirror", action="append", default=[])
    ap.add_argument("--keep", action="store_true", help="keep the scratch caches")
    ap.add_argument("--once", action="store_true",
                    help="cold and unchanged only (no second cold cache: no digest comparison)")
    args = ap.parse_args()
    if args.child is not None:
        child(args.child, args.layer)
        return
    mirrors = args.mirror or [p for p in os.environ.get("FRANK_MIRROR", "").split(":") if p]
    scratch = Path(tempfile.mkdtemp(prefix="aot-bench-", dir=args.scratch))
    try:
        out = scratch / "plan"
        subprocess.run([sys.executable, "-m", "frank", "compose", f"stacks/{args.stack}.toml",
                        "--locked", "--builder", "none", "--out", str(out)], cwd=ROOT,
                       check=True, capture_output=True)
        plan = out / "plan.json"
        results = {}
        runs = (("cold A", "a"), ("unchanged A", "a"), ("cold B", "b"))
        for label, cache in runs[:2] if args.once else runs:
            results[label] = run(scratch / cache, plan, args.layer, mirrors)
            r = results[label]
            print(f"{label:12s} {r['wall_s']:8.1f} s  peak {r['peak_rss_mb']:5d} MB  "
                  f"layer {r['layer_digest']}", flush=True)
        cold = results["cold A"]["runs"]
        print("\nper module (cold A, ninja's log; modules build in one ninja run, so their "
              "times overlap):")
        for record in cold:
            for name, secs in sorted(record["built"].items()):
                print(f"  {name:20s} {secs} s")
        same = args.once or results["cold A"]["layer_digest"] == results["cold B"]["layer_digest"]
        if not args.once:
            print(f"\nlayer digest, two empty caches: {'identical' if same else 'DIFFERENT'}")
        print(json.dumps({"machine": platform.node(), "cpus": os.cpu_count(),
                          "python": platform.python_version(), "results": results}, indent=1))
        if not same:
            sys.exit(1)
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
