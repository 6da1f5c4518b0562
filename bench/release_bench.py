"""Release mode's cost (issue 53): `compose --release` with a warm cache beside a rebuild
whose downloads are cached and nothing else (the anchor: what release mode must stay within
1.2x of), side by side, alternating; and push's check (`derive_and_check`) on its own.

    FRANK_CACHE=/work/fcache-trust FRANK_MIRROR=/work/mirror \\
        .venv/bin/python bench/release_bench.py [--stack served] [--pairs 2]

The cache named by FRANK_CACHE must already hold the stack's image (one compose first).
Each anchor run gets a fresh cache seeded as a release build seeds its scratch store: hard
links of the blobs the lock pins, and the kept outputs of host builds whose lock pins
``output_sha256`` (``take_pinned_outputs``: hashed in full, equal to the pin), so neither
side compiles kernels. Prints a table of medians, wall and CPU, and the load average.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_speed_bench import timed

REPO = Path(__file__).resolve().parent.parent


def compose(cache: Path, stack: str, out: Path, *extra: str) -> tuple[float, float, str]:
    env = {k: v for k, v in os.environ.items() if k != "SOURCE_DATE_EPOCH"}
    env["FRANK_CACHE"] = str(cache)
    wall, _, cpu, stdout, stderr = timed([sys.executable, "-m", "frank", "compose", stack,
                                          "--locked", "--out", str(out), *extra], REPO, env)
    digest = next((w for line in stdout.splitlines() if line.startswith("image ")
                   for w in line.split() if w.startswith("sha256:")), "?")
    for line in (stdout + stderr).splitlines():  # what release mode said it took or built
        if line.startswith(("release:", "frank: error")):
            print(f"  [{' '.join(extra) or 'anchor'}] {line}", flush=True)
    return wall, cpu, digest


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stack", default="served")
    ap.add_argument("--pairs", type=int, default=2)
    args = ap.parse_args()
    from frank.audit.release import Release, pinned_digests, seed, take_pinned_outputs
    from frank.resolve.lock import read_lock
    from frank.store.blobs import BlobStore

    cache = Path(os.environ["FRANK_CACHE"])
    lock = read_lock(REPO / "stacks" / f"{args.stack}.lock")
    rows: dict[str, list[tuple[float, float, str]]] = {"anchor": [], "release": []}
    with tempfile.TemporaryDirectory(prefix="release-bench-", dir=cache.parent) as tmp:
        for i in range(args.pairs):
            fresh = Path(tmp) / f"fresh{i}"
            seed(BlobStore(cache), fresh, pinned_digests(lock, REPO))
            seeded = Release(BlobStore(cache), fresh)
            take_pinned_outputs(seeded, lock, REPO)
            assert not seeded.kept, [f.line() for f in seeded.kept]
            rows["anchor"].append(compose(fresh, args.stack, Path(tmp) / f"a{i}"))
            shutil.rmtree(fresh)
            shutil.rmtree(Path(tmp) / f"a{i}")
            rows["release"].append(compose(cache, args.stack, Path(tmp) / f"r{i}",
                                           "--release"))
            shutil.rmtree(Path(tmp) / f"r{i}")
    print(f"stack {args.stack}, {args.pairs} alternating pairs, cache {cache}, "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'':34s} {'wall s (median)':>16s} {'CPU s (median)':>15s}  digest")
    for name, what in (("anchor", "rebuild, downloads cached"),
                       ("release", "compose --release, warm cache")):
        walls = [r[0] for r in rows[name]]
        cpus = [r[1] for r in rows[name]]
        print(f"{what:34s} {statistics.median(walls):16.1f} {statistics.median(cpus):15.1f}  "
              f"{rows[name][0][2]}  (all: {', '.join(f'{w:.1f}' for w in walls)})")
    ratio = statistics.median(r[0] for r in rows["release"]) / \
        statistics.median(r[0] for r in rows["anchor"])
    print(f"release / anchor wall: {ratio:.2f}x (goal <= 1.2x)")


if __name__ == "__main__":
    main()
