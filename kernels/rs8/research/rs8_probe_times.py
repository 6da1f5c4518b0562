"""Same-call A/B timing of rs8 builds: µs per call of each, side by side in one process.

Why: builds timed in separate calls differ by ~2% from day to day and call to call, more
than most changes worth measuring; here every build runs in the same process, rounds are
interleaved over the builds, and the median of the rounds' medians is printed (graph
replay over inputs past the L2, as bench/rs8_bench.py times). A 1-element fill_ and the
first build on rows of length 1 give the launch floor beside them. The nineteenth
session's probes (runtime exits -DRS8_PROBE=1n, the kernel without the strided-row and
tail code against -DRS8_ALWAYS_ANY=1) were timed with it.

    python3 kernels/rs8/research/rs8_probe_times.py main=lib.so any=lib2.so [--ctx 112464,191998]
        [--width 262144] [--rows 6] [--rounds 5]
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))  # rs8_bench
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))  # rs8_op, rs8_ref

import rs8_bench
import rs8_op

K = 512


def time_ctx(
    ctx: int, width: int, rows: int, libs: dict[str, ctypes.CDLL], rounds: int, replays: int
) -> dict[str, list[float]]:
    """µs per call of every build (and a 1-element fill_) at one length, per round."""
    lengths = rs8_bench.request_lengths(ctx, rows // rs8_bench.NEXT_N)
    seq = torch.tensor(lengths, dtype=torch.int32, device="cuda").reshape(-1, rs8_bench.NEXT_N)
    seq1 = torch.ones_like(seq)
    nbuf = rs8_bench.buffers_past_l2(rows * width * 4)
    bufs = [torch.randn(rows, width, device="cuda") for _ in range(nbuf)]
    out = torch.full((rows, K), -1, dtype=torch.int32, device="cuda")
    tiny = torch.zeros(1, device="cuda")

    def rs8(lib: ctypes.CDLL, lens: torch.Tensor) -> rs8_bench.Launch:
        return lambda i: rs8_op.launch(bufs[i], 1, lens, out, rows, width, 1, K, True, lib=lib)

    fns: dict[str, rs8_bench.Launch] = {"fill_ (1 element)": lambda i: tiny.fill_(1.0)}
    for j, (name, lib) in enumerate(libs.items()):
        fns[name] = rs8(lib, seq)
        if j == 0:  # the first build on rows of length 1 (its short path)
            fns[name + " (rows of length 1)"] = rs8(lib, seq1)
    per: dict[str, list[float]] = {n: [] for n in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            per[name].append(rs8_bench.graph_time_us(fn, nbuf, replays))
    return per


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("libs", nargs="+", help="name=path/to/librs8.so")
    parser.add_argument("--ctx", default="112464")
    parser.add_argument("--rows", type=int, default=6)
    parser.add_argument(
        "--width", type=int, default=0, help="logits width (0: ctx rounded up to 4)"
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--replays", type=int, default=15)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("rs8_probe_times.py: needs a CUDA GPU and a librs8.so build; torch sees no GPU")
    if args.rows % rs8_bench.NEXT_N:
        parser.error(f"--rows must be a multiple of next_n = {rs8_bench.NEXT_N}")
    libs = rs8_bench.open_builds(args.libs)
    for ctx in (int(c) for c in args.ctx.split(",")):
        width = args.width or rs8_bench.tight_width(ctx)
        per = time_ctx(ctx, width, args.rows, libs, args.rounds, args.replays)
        print(
            f"== ctx {ctx}, width {width}, {args.rows} rows: "
            f"µs per call (median of {args.rounds} rounds)"
        )
        for name, ts in per.items():
            med = statistics.median(ts)
            print(f"{name:44s} {med:7.3f}  (min {min(ts):.3f} max {max(ts):.3f})")


if __name__ == "__main__":
    main()
