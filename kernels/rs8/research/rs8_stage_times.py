"""Per-stage clock64 cycles of rs8's kernel (a -DRS8_TIMING build), row 0's blocks (8 or 16).

Why: the stages (load + histogram, threshold, collect + sort + push, rank)
each wait on data pushed by the other blocks, so whole-kernel timings cannot say which one costs;
the block-local cycle counts can. Median over calls, per stage and block.

    python3 kernels/rs8/research/rs8_stage_times.py --lib /tmp/rs8t/librs8.so --ctx 112464
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))  # rs8_op, rs8_ref
import rs8_op

STAGES = [  # warp 0's clock at each mark; the block barrier waits for every warp (NOTES.md run 49)
    "load + histogram + estimate + push window",
    "wait for the windows",
    "threshold from the windows + block barrier",
    "collect keys >= T",
    "sort + push list (warp 0)",
    "wait for counts",
    "block barrier (all warps past the count wait)",
    "wait for lists",
    "rank + write (warp 0)",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lib", required=True)
    parser.add_argument("--ctx", type=int, default=112464)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--rows", type=int, default=6, help="rows per call (6 per request)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("rs8_stage_times.py: needs a CUDA GPU and a librs8.so build; torch sees no GPU")
    lib = rs8_op.open_library(args.lib)
    lib.rs8_read_clocks.restype = ctypes.c_int
    lib.rs8_read_clocks.argtypes = [ctypes.c_void_p]
    rows, k = args.rows, 512
    seq = torch.full((rows, 1), args.ctx, dtype=torch.int32, device="cuda")
    out = torch.empty((rows, k), dtype=torch.int32, device="cuda")
    host = (ctypes.c_longlong * (16 * 16))()
    per: list[list[list[int]]] = [[[] for _ in STAGES] for _ in range(16)]
    candidates: list[int] = []
    general_before = 0
    for call in range(args.calls + 5):
        x = torch.randn(rows, args.ctx, device="cuda")
        rs8_op.launch(x, 1, seq, out, rows, args.ctx, 1, k, lib=lib)
        torch.cuda.synchronize()
        assert lib.rs8_read_clocks(ctypes.addressof(host)) == 0
        if call < 5:
            general_before = host[15]  # rows on the general path, counted since load
            continue
        candidates.append(host[14])
        for b in range(16):
            t = [host[b * 16 + i] for i in range(len(STAGES) + 1)]
            if 0 in t:
                continue  # a block this cluster size does not have
            for i in range(len(STAGES)):
                per[b][i].append(t[i + 1] - t[i])
    blocks = [b for b in range(16) if per[b][0]]
    print(
        f"ctx={args.ctx}, {rows} rows: median cycles per stage (blocks {blocks[0]}..{blocks[-1]});"
        f" row 0's candidates: median {int(statistics.median(candidates))};"
        f" rows on the general path: {host[15] - general_before} of {rows * args.calls}"
    )
    width = max(len(name) for name in STAGES)  # the block-barrier label is the longest
    for i, name in enumerate(STAGES):
        meds = [int(statistics.median(per[b][i])) for b in blocks]
        print(f"{name:{width}s} " + " ".join(f"{m:7d}" for m in meds))


if __name__ == "__main__":
    main()
