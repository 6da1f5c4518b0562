"""Build exllamav3's ``exllamav3_ext`` on this host from pinned inputs, keyed by content;
print the time, the peak memory and the module's sha256.

The inputs are the ones parts/exl3-ext/1.toml pins (the exllamav3 wheel, the CUDA 13.0
toolchain, torch 2.11's and cuBLAS/cuSPARSE/cuSOLVER/cuRAND's headers, Python 3.11's
headers from libpython3.11-dev), fetched through frank's store (verified); the build is
``frank.assemble.extension`` running builders/exllamav3-ext/build.py (standard library, no
network), so a key this script builds is the key `frank compose` of a stack with exl3-ext
finds: the output is kept at ``$FRANK_CACHE/exllamav3-ext/<key>/`` and the same key builds
nothing. ``--archs`` (torch's spelling), ``--only SRC`` (a few sources: CI's check) and
``--python-include`` (another Python's headers, e.g. the GPU proof's 3.12: not pinned, said
so) override the part's, and are in the key.

    FRANK_CACHE=/work/fcache nice -n 10 .venv/bin/python bench/exllamav3_ext_build.py \
        --archs 12.0 --jobs 2
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tomllib
from pathlib import Path

from frank.assemble.extension import build_extension
from frank.errors import FrankError
from frank.model.kinds import PART_ADAPTER
from frank.model.kinds.extension import Extension
from frank.store.blobs import BlobStore
from frank.store.fetch import Fetcher

REPO = Path(__file__).resolve().parents[1]
PART = REPO / "parts" / "exl3-ext" / "1.toml"


def part() -> Extension:
    """parts/exl3-ext/1.toml's model."""
    got = PART_ADAPTER.validate_python(tomllib.loads(PART.read_text(encoding="utf-8")))
    assert isinstance(got, Extension)
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--archs", default=None, help="torch's spelling, space-separated "
                                                  "(default: the part's)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", action="append", default=[])
    ap.add_argument("--python-include", type=Path, action="append", default=[],
                    help="another Python's headers (default: the pinned 3.11 ones)")
    ap.add_argument("--ext-suffix", default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    t0 = time.monotonic()
    try:
        built = build_extension(part(), REPO, Fetcher(BlobStore()), manifest=PART,
                                archs=args.archs, only=args.only,
                                python_include=args.python_include, suffix=args.ext_suffix,
                                jobs=args.jobs)
    except FrankError as exc:
        print(exc, file=sys.stderr)
        return 1
    result = dict(built.result)
    result["path"] = str(built.module)
    result["cached_s"] = round(time.monotonic() - t0, 2)
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in
                                                         result.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
