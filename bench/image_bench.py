"""Benchmark the daemonless image builder: cold build, no-op rebuild, one-part change, revert.

Builds a demo stack (plugin package, a data file, a 'kernel' binary, the lock) on the test
base from images/test-base.toml (built once per cache from pinned .debs; ``--mini`` uses a tiny base
instead), then times:

* no-op rebuild: the same spec again (target: median under 1 s; ko's no-op is about 3 s);
* one-part change: the kernel part gets new content and a new key each round;
* revert: switching between two locks built before, which must re-tar nothing (the
  output layout is rewritten from the cache each switch);
* each in-process (``build_image``) and, for no-op, as a fresh ``python`` process, which is
  what ``frank compose`` pays (interpreter start and imports included).

Usage: python bench/image_bench.py [--rounds N] [--mini] [--out bench/results/image-DATE.md]
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from frank.assemble.base import resolve_base
from frank.assemble.baselayout import BaseImage, layout_from_rootfs
from frank.image.oci import build_image, read_layout
from frank.image.spec import ImageSpec, LayerInput
from frank.store.blobs import BlobStore

REPO = Path(__file__).resolve().parents[1]
EPOCH = 1_700_000_000


def key_of(*parts: str) -> str:
    """A lock-style content key."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def make_sources(root: Path) -> dict[str, Path]:
    """Realistic part contents: frank's own package as the plugin, 64 MB data, 16 MB .so."""
    plugin = root / "plugin"
    shutil.copytree(
        REPO / "src" / "frank", plugin / "frank", ignore=shutil.ignore_patterns("__pycache__")
    )
    data = root / "data"
    data.mkdir()
    rnd = hashlib.sha256(b"seed").digest() * (64 * 1024 * 1024 // 32)
    (data / "table.bin").write_bytes(rnd)
    kernel = root / "kernel"
    kernel.mkdir()
    lock = root / "frank.lock"
    lock.write_text('[stack]\nname = "bench"\n')
    return {"plugin": plugin, "data": data, "kernel": kernel, "lock": lock}


def set_kernel(src: dict[str, Path], version: int) -> str:
    """Write kernel version ``version`` (16 MB) and return its content key."""
    blob = hashlib.sha256(f"kernel {version}".encode()).digest() * (16 * 1024 * 1024 // 32)
    (src["kernel"] / "libkern.so").write_bytes(blob)
    return key_of("kernel", str(version))


def spec_for(base: BaseImage, src: dict[str, Path], kernel_key: str) -> ImageSpec:
    """The demo stack's spec with the given kernel key."""
    return ImageSpec(
        base_layout=base.layout,
        base_digest=base.digest,
        layers=(
            LayerInput("part:plugin", key_of("plugin"), ((src["plugin"], "/opt/frank/py"),)),
            LayerInput("part:data", key_of("data"), ((src["data"], "/opt/frank/data"),)),
            LayerInput("part:kernel", kernel_key, ((src["kernel"], "/opt/frank/kernels"),)),
            LayerInput("lock", key_of("lock"), ((src["lock"], "/etc/frank/frank.lock"),)),
        ),
        env={"FRANK_STACK": "bench"},
        entrypoint=["python3", "-m", "frank"],
        cmd=["serve"],
        labels={"dev.frank.stack": "bench"},
        annotations={},
        source_date_epoch=EPOCH,
    )


def timed(fn: object, *args: object) -> tuple[float, object]:
    """(seconds, result) of one call."""
    t = time.perf_counter()
    r = fn(*args)  # type: ignore[operator]
    return time.perf_counter() - t, r


NOOP_SCRIPT = """
import sys, pickle
from pathlib import Path
from frank.image.oci import build_image
from frank.store.blobs import BlobStore
spec = pickle.loads(Path(sys.argv[1]).read_bytes())
print(build_image(spec, BlobStore(Path(sys.argv[2])), Path(sys.argv[3])))
"""


def main() -> None:
    """Run the benchmark and print (and optionally write) a markdown table."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--mini", action="store_true", help="tiny base instead of the test base")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="frank-image-bench-"))
    try:
        if args.mini:
            (work / "root" / "etc").mkdir(parents=True)
            (work / "root" / "etc" / "os-release").write_text("ID=mini\n")
            d = layout_from_rootfs(
                work / "root", BlobStore(work / "bc"), work / "base", epoch=0, created_by="mini"
            )
            base = BaseImage(name="mini", layout=work / "base", digest=d)
        else:
            base = resolve_base(REPO / "images" / "test-base.toml", BlobStore())
        src = make_sources(work / "src")
        store = BlobStore(work / "cache")
        out = work / "out"
        k1 = set_kernel(src, 1)
        spec1 = spec_for(base, src, k1)
        cold, digest1 = timed(build_image, spec1, store, out)

        noop = [timed(build_image, spec1, store, out)[0] for _ in range(args.rounds)]

        import pickle

        (work / "spec.pkl").write_bytes(pickle.dumps(spec1))
        fresh = []
        for _ in range(max(3, args.rounds // 2)):
            t = time.perf_counter()
            r = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    NOOP_SCRIPT,
                    str(work / "spec.pkl"),
                    str(work / "cache"),
                    str(out),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            fresh.append(time.perf_counter() - t)
            assert r.stdout.strip() == digest1

        change = []
        spec = spec1
        for v in range(2, 2 + args.rounds):
            spec = spec_for(base, src, set_kernel(src, v))
            misses = store.stats.layer_misses
            change.append(timed(build_image, spec, store, out)[0])
            assert store.stats.layer_misses == misses + 1

        # revert: switch the output between two locks built before; nothing is re-tarred,
        # but every switch rewrites the output layout from the cache
        set_kernel(src, 1)
        misses = store.stats.layer_misses
        revert = [
            timed(build_image, s, store, out)[0]
            for _ in range(args.rounds // 2 + 1)
            for s in (spec1, spec)
        ]
        assert store.stats.layer_misses == misses
        build_image(spec1, store, out)
        assert read_layout(out, verify_layers=False).digest == digest1

        info = read_layout(out, verify_layers=False)
        rows = [
            ("cold build (empty cache, base imported)", [cold]),
            ("no-op rebuild, in process", noop),
            ("no-op rebuild, fresh python process", fresh),
            ("rebuild after one-part change (16 MB kernel)", change),
            ("revert: switch between two built locks (output rewritten)", revert),
        ]
        lines = [
            f"# Image builder benchmark, {dt.date.today().isoformat()}",
            "",
            f"- command: `{' '.join([Path(sys.executable).name, *sys.argv])}`",
            f"- machine: {platform.node()}, {_cpu()} ({os.cpu_count()} CPUs), "
            f"{platform.system()} {platform.release()}, Python {platform.python_version()}",
            f"- base: {base.name} {base.digest}",
            f"- image: {digest1}",
            "",
            "| scenario | runs | median s | min s | max s |",
            "|---|---:|---:|---:|---:|",
        ]
        for name, xs in rows:
            lines.append(
                f"| {name} | {len(xs)} | {statistics.median(xs):.3f} | "
                f"{min(xs):.3f} | {max(xs):.3f} |"
            )
        lines += ["", "| layer | created by | size (bytes) |", "|---|---|---:|"]
        for i, layer in enumerate(info.layers):
            lines.append(
                f"| {i} {layer.digest[:19]} | {layer.created_by or 'base'} | {layer.size:,} |"
            )
        lines.append(f"| total | | {sum(x.size for x in info.layers):,} |")
        text = "\n".join(lines) + "\n"
        print(text)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(text)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


if __name__ == "__main__":
    main()
