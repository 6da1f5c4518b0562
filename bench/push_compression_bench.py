#!/usr/bin/env python3
"""Bytes and CPU time of the compressed forms `frank push` sends, for one image layout.

For each compression (zstd, the default; gzip) the form is made twice from two empty
caches: the two digests must be equal (reproducible), and the table gives the layers'
bytes against the uncompressed ones (goal for served: <= 0.35x), the wall time and the CPU
time (goal: <= 30 s on 2 cores, i.e. about 60 s of CPU). The anchor is `zstd -3 -T0` /
`gzip -6` of the same blobs by the command-line tools, if installed, in the same run.

Usage: .venv/bin/python bench/push_compression_bench.py LAYOUT [--only zstd] [--once]
       [--results FILE]. Needs free disk for two compressed copies of the layers.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from frank.image.compress import Compression, image_form  # noqa: E402
from frank.image.oci import resolve_manifest  # noqa: E402


def measure(layout: Path, kind: Compression, cache: Path) -> dict[str, Any]:
    t0, c0 = time.monotonic(), os.times()
    form = image_form(layout, kind, cache)
    c1 = os.times()
    return {"digest": form.digest, "bytes": form.compressed_bytes,
            "plain": form.uncompressed_bytes, "wall": time.monotonic() - t0,
            "cpu": (c1.user - c0.user) + (c1.system - c0.system), "by": form.compressor}


def cli_anchor(layout: Path, kind: str) -> tuple[float, float] | None:
    """(wall s, bytes) of the command-line tool over the layer blobs, or None."""
    tool = {"zstd": ["zstd", "-3", "-T0", "-c", "-q"], "gzip": ["gzip", "-6", "-c"]}[kind]
    if shutil.which(tool[0]) is None:
        return None
    _, _, manifest = resolve_manifest(layout)
    t0, total = time.monotonic(), 0
    for d in manifest["layers"]:
        path = layout / "blobs" / "sha256" / d["digest"].split(":")[1]
        proc = subprocess.run([*tool, str(path)], stdout=subprocess.PIPE, check=True)
        total += len(proc.stdout)
    return time.monotonic() - t0, float(total)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("layout", type=Path)
    ap.add_argument("--only", choices=["zstd", "gzip"], default=None)
    ap.add_argument("--once", action="store_true", help="one form each (no reproducibility)")
    ap.add_argument("--results", type=Path, default=None)
    args = ap.parse_args()
    digest = resolve_manifest(args.layout)[0]
    lines = [f"# push compression, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
             f"image {digest} ({args.layout}); {platform.node()}, {os.cpu_count()} cores, "
             f"load {os.getloadavg()[0]:.1f}",
             f"command: {' '.join(sys.argv)}", "",
             "| form | layers bytes | ratio | wall s | CPU s | digest | same twice |",
             "|---|---|---|---|---|---|---|"]
    for kind in [args.only] if args.only else ["zstd", "gzip"]:
        runs = []
        for _ in range(1 if args.once else 2):
            with tempfile.TemporaryDirectory(prefix="frank-bench-") as tmp:
                runs.append(measure(args.layout, kind, Path(tmp)))  # type: ignore[arg-type]
        r = runs[0]
        same = "-" if len(runs) == 1 else str(runs[0]["digest"] == runs[1]["digest"])
        lines.append(f"| {kind} ({r['by']}) | {r['bytes']:,} | "
                     f"{int(r['bytes']) / int(r['plain']):.3f} | {float(r['wall']):.1f} | "
                     f"{float(r['cpu']):.1f} | {r['digest']} | {same} |")
        anchor = cli_anchor(args.layout, kind)
        if anchor:
            lines.append(f"| {kind} CLI anchor | {int(anchor[1]):,} | "
                         f"{anchor[1] / int(r['plain']):.3f} | {anchor[0]:.1f} | - | - | - |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.results:
        args.results.write_text(text)


if __name__ == "__main__":
    main()
