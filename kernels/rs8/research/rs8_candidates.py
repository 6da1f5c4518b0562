"""CPU model of rs8's fast-path threshold: candidates per block for several row shapes.

Why: the fast path keeps a row only if every block's keys >= T fit its list
(kSegCap = SEG_BYTES/(16+4*CL) - 2 since run 32 of NOTES.md, SEG_BYTES/8/(CL+1) - 1 in runs
29-31; 4k/CL for 8 and 16 blocks and 2k/CL for 4 before, `--old-cap`); otherwise every block
takes the slow general path. T is the lower edge of the coarse bucket holding the k-th
largest per-thread maximum as the kernel finds it since the seventh session: a lower bound
from every block's 32-bin window of its histogram (one DSMEM round), which may put the cut
some bins below the exact one where a block's window misses it (column "cut below
exact"). The GPU benchmark used Gaussian rows only; this replays the
kernel's own layout (512 or 1,024 threads, float4 quads, slices of ceil(L/CL) rounded to 4) and
bucket map on other shapes, without a GPU, and prints how close each comes to the cap.

    python3 kernels/rs8/research/rs8_candidates.py --ctx 112464,191998 --clusters 16,8,4
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))  # rs8_op, rs8_ref
from rs8_ref import float_keys  # the kernel's to_key, as int64

ROW_REG_KEYS = 196_608
E_LO = 113  # exponent of 2^-14, as in the kernel
# Candidates per block (rs8_topk.cu's kSegCap): SM120's 99 KB less Misc (4,608 B) and the
# maxima histogram (4 KB), shared by the block's own candidates (8 B collected + 8 B sorted)
# and the keys received from the CL blocks (4 B each).
SEG_BYTES = 101_376 - 4_608 - 4_096


def threads(cl: int) -> int:
    """Threads per block for cl blocks per row (rs8_topk.cu's Block<CL>)."""
    return 512 if cl == 16 else 1024


def quads(cl: int) -> int:
    """float4s each thread holds in registers (rs8_topk.cu's Regs<CL>): at most 12 in 512
    threads' 128 registers, 8 in 1,024 threads' 64."""
    nt = threads(cl)
    return min(ROW_REG_KEYS // cl // (4 * nt), 8 if nt >= 1024 else 12)


def list_cap(k: int, cl: int, old: bool = False) -> int:
    """Per-block candidate list capacity of the kernel (v13's with old=True)."""
    if old:
        return (4 if cl >= 8 else 2) * k // cl
    return SEG_BYTES // (16 + 4 * cl) - 2


def mag_bin(u: torch.Tensor) -> torch.Tensor:
    b = (u - (E_LO << 23)) >> 19
    return torch.where(u < (E_LO << 23), torch.zeros_like(u), b.clamp(max=511))


def bucket(k: torch.Tensor) -> torch.Tensor:
    pos = (k & 0x80000000) != 0
    return torch.where(pos, 512 + mag_bin(k & 0x7FFFFFFF), 511 - mag_bin(0x7FFFFFFF - k))


def bucket_lo(b: int) -> int:
    def mag_lo(m: int) -> int:
        return 0 if m == 0 else (E_LO << 23) + (m << 19)

    def mag_hi(m: int) -> int:
        return 0x7FFFFFFF if m >= 511 else (E_LO << 23) + ((m + 1) << 19) - 1

    return 0x80000000 + mag_lo(b - 512) if b >= 512 else 0x7FFFFFFF - mag_hi(511 - b)


def per_thread_max(keys: torch.Tensor, nquads: int, nt: int) -> torch.Tensor:
    """Max key per thread of one block's slice (nt threads): thread t holds quads t + u*nt
    (u < nquads) in registers; the rest of the slice (the tail) is spread over threads by index."""
    n = keys.numel()
    mx = torch.full((nt,), -1, dtype=torch.int64)
    held = min(n // 4, nquads * nt)
    q = keys[: 4 * held].view(-1, 4).amax(dim=1)  # per quad
    v = torch.arange(held)
    mx.scatter_reduce_(0, v % nt, q, reduce="amax")
    tail = keys[4 * held :]
    if tail.numel():
        t = torch.arange(tail.numel()) % nt
        mx.scatter_reduce_(0, t, tail, reduce="amax")
    return mx[mx >= 0]


def suffix_counts(hist: torch.Tensor) -> torch.Tensor:
    """Maxima at or above each bin, and a trailing 0 for the bin past the last."""
    above = torch.flip(torch.cumsum(torch.flip(hist, [0]), 0), [0])
    return torch.cat([above, torch.zeros(1, dtype=above.dtype)])


def slice_len(n: int, cl: int) -> int:
    """Keys each block owns of a row of n: ceil(n / cl) rounded up to a multiple of 4."""
    return (math.ceil(n / cl) + 3) & ~3


def block_maxima(keys: torch.Tensor, cl: int) -> list[torch.Tensor]:
    """Each block's per-thread maxima, laid out as the kernel does."""
    cs = slice_len(keys.numel(), cl)
    return [per_thread_max(keys[r * cs : (r + 1) * cs], quads(cl), threads(cl)) for r in range(cl)]


def maxima_hist(maxima: torch.Tensor) -> torch.Tensor:
    """A block's 1,024-bin histogram of its per-thread maxima."""
    return torch.bincount(bucket(maxima), minlength=1024)


def block_hists(keys: torch.Tensor, cl: int) -> list[torch.Tensor]:
    """Each block's 1,024-bin histogram of per-thread maxima, laid out as the kernel does."""
    return [maxima_hist(m) for m in block_maxima(keys, cl)]


def exact_cut(hists: list[torch.Tensor], k: int) -> int:
    """The bin holding the k-th largest maximum of the whole cluster (-1: fewer than k)."""
    hit = torch.nonzero(suffix_counts(torch.stack(hists).sum(0)) >= k)
    return int(hit.max()) if hit.numel() else -1


def window_start(above: torch.Tensor, k: int, cl: int) -> int:
    """First bin of a block's 32-bin window: 8 bins below the half-group (16 bins) holding
    its (k/cl)-th largest maximum, clamped to the histogram."""
    halves = above[0:1024:16]
    nxt = torch.cat([halves[1:], torch.zeros(1, dtype=halves.dtype)])
    hit = torch.nonzero((halves >= k // cl) & (nxt < k // cl))
    h = int(hit[0]) if hit.numel() else 0
    return min(max(16 * h - 8, 0), 1024 - 32)


def window_cut(hists: list[torch.Tensor], k: int, cl: int) -> int:
    """The kernel's one-round cut (step 2 of rs8_topk.cu): each block sends the suffix counts
    of its 32-bin window; the cut is the highest bin whose lower bound of the cluster's
    maxima at or above it reaches k (-1: none)."""
    bins = torch.arange(1024)
    bound = torch.zeros(1024, dtype=torch.int64)
    for hist in hists:
        above = suffix_counts(hist)
        w0 = window_start(above, k, cl)
        lb = above[torch.clamp(bins, min=w0)]
        bound += torch.where(bins <= w0 + 32, lb, torch.zeros_like(lb))
    hit = torch.nonzero(bound >= k)
    return int(hit.max()) if hit.numel() else -1


def cut_threshold(cut: int) -> int:
    """The threshold a cut gives: its bin's lower edge, or 0 (every key) for no cut (-1)."""
    return 0 if cut < 0 else bucket_lo(cut)


def window_threshold(hists: list[torch.Tensor], k: int, cl: int) -> int:
    """The kernel's T: the lower edge of the window cut's bin (0, every key, without one)."""
    return cut_threshold(window_cut(hists, k, cl))


def simulate(row: torch.Tensor, k: int, cl: int, old: bool = False) -> tuple[int, int, float, int]:
    """(largest block's candidate count, the cap, candidates over k, bins the kernel's cut
    lies below the exact one) for one row."""
    cs = slice_len(row.numel(), cl)
    keys = float_keys(row)
    hists = block_hists(keys, cl)
    cut = window_cut(hists, k, cl)  # also reported against the exact cut
    thr = cut_threshold(cut)
    per_block = [int((keys[r * cs : (r + 1) * cs] >= thr).sum()) for r in range(cl)]
    cap = list_cap(k, cl, old)
    return max(per_block), cap, sum(per_block) / k, exact_cut(hists, k) - cut


def shapes(gen: torch.Generator) -> dict[str, Callable[[int], torch.Tensor]]:
    def relu_sum(n: int) -> torch.Tensor:  # indexer-like: weighted sum of 8 ReLU'd heads
        w = torch.rand(8, 1, generator=gen)
        return (w * torch.relu(torch.randn(8, n, generator=gen))).sum(0)

    return {
        "normal": lambda n: torch.randn(n, generator=gen),
        "relu(normal)": lambda n: torch.relu(torch.randn(n, generator=gen)),
        "exponential": lambda n: torch.empty(n).exponential_(generator=gen),
        "lognormal(0,2)": lambda n: torch.empty(n).log_normal_(0.0, 2.0, generator=gen),
        "sum of 8 relu heads": relu_sum,
        "normal, sorted ascending": lambda n: torch.sort(torch.randn(n, generator=gen)).values,
        "normal, last 2% of positions +2 (recency)": lambda n: (
            torch.randn(n, generator=gen) + torch.where(torch.arange(n) >= n - n // 50, 2.0, 0.0)
        ),
        "normal, last 2% of positions +1 (recency)": lambda n: (
            torch.randn(n, generator=gen) + torch.where(torch.arange(n) >= n - n // 50, 1.0, 0.0)
        ),
        "normal + 1% spikes at 10": lambda n: torch.where(
            torch.rand(n, generator=gen) < 0.01, torch.tensor(10.0), torch.randn(n, generator=gen)
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ctx", default="112464,191998")
    parser.add_argument("--clusters", default="16,8,4")
    parser.add_argument("--k", type=int, default=512)
    parser.add_argument("--rows", type=int, default=3, help="random rows per shape")
    parser.add_argument("--old-cap", action="store_true", help="v13's caps (4k/CL, 2k/CL)")
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(0)
    print(
        "| shape | ctx | blocks | largest block / cap | candidates / k | cut below exact | path |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, make in shapes(gen).items():
        for ctx in (int(c) for c in args.ctx.split(",")):
            for cl in (int(c) for c in args.clusters.split(",")):
                worst, ratio, cap, lower = 0, 0.0, 0, 0
                for _ in range(args.rows):
                    w, cap, r, d = simulate(make(ctx), args.k, cl, args.old_cap)
                    worst, ratio, lower = max(worst, w), max(ratio, r), max(lower, d)
                path = "fast" if worst <= cap else "general (overflow)"
                print(
                    f"| {name} | {ctx} | {cl} | {worst} / {cap} | {ratio:.2f} | {lower} | {path} |"
                )


if __name__ == "__main__":
    main()
