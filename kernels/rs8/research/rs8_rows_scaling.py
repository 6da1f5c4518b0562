"""Per-call time of rs8 against the number of rows (one cluster per row), by graph replay.

Why: at one request about 3 µs of a call lies outside the kernel's marked stages. If
clusters start one after another, each extra row adds a fixed step; this prints the
per-call time for 1..N rows of one length so that step can be read off, next to a
1-element fill_ (the launch cost of any kernel in a graph).

    python3 kernels/rs8/research/rs8_rows_scaling.py --ctx 112464 --rows 1,2,3,4,6
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))  # rs8_bench
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))  # rs8_op, rs8_ref
import rs8_op
from rs8_bench import graph_time_us


def per_call_us(fn: Callable[[], object]) -> float:
    """Median µs per call over 15 replays of a graph of 32 calls (rs8_bench's timer)."""
    return graph_time_us(lambda _i: fn(), 1, 15, min_calls=32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ctx", type=int, default=112464)
    parser.add_argument("--rows", default="1,2,3,4,6")
    parser.add_argument("--k", type=int, default=512)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("rs8_rows_scaling.py: needs a CUDA GPU and a librs8.so build; torch sees no GPU")
    tiny = torch.zeros(1, device="cuda")
    print(f"1-element fill_: {per_call_us(lambda: tiny.fill_(1.0)):.2f} µs")
    for rows in (int(r) for r in args.rows.split(",")):
        full, empty = time_rows(rows, args.ctx, args.k)
        print(f"rows={rows} ctx={args.ctx}: {full:.2f} µs per call; length-1 rows: {empty:.2f} µs")


def time_rows(rows: int, ctx: int, k: int) -> tuple[float, float]:
    """µs per call on `rows` random rows of length ctx, and on rows of length 1."""
    x = torch.randn(rows, ctx, device="cuda")
    seq = torch.full((rows, 1), ctx, dtype=torch.int32, device="cuda")
    out = torch.empty((rows, k), dtype=torch.int32, device="cuda")
    short = torch.ones((rows, 1), dtype=torch.int32, device="cuda")
    full = per_call_us(lambda: rs8_op.launch(x, 1, seq, out, rows, ctx, 1, k))
    empty = per_call_us(lambda: rs8_op.launch(x, 1, short, out, rows, ctx, 1, k))
    return full, empty


if __name__ == "__main__":
    main()
