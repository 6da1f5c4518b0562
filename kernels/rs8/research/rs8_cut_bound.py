"""CPU bound: how much of rs8's one-request gap a tighter threshold could close, at best.

Why: every key at or above rs8's threshold T travels through the collect, the sort, the
list exchange and the rank. Run 66 (NOTES.md) measured what fewer candidates save there:
112 fewer saved ~0.55k cycles (collect -0.1k, sort -0.1k, list wait -0.35k). This prints,
for the benchmark's rows (torch.randn, lengths ctx-5 .. ctx, 16 blocks), the candidates at
the kernel's window cut, at the best cut built from per-thread maxima (T = the k-th largest
maximum itself, no bins), and at a perfect cut (k), converts the excess over k into µs at
run 66's slope, and sets it beside the measured gap to 2x `cooperative_topk` from a
committed benchmark JSON. A perfect threshold that cost nothing would close at most that.

    python3 kernels/rs8/research/rs8_cut_bound.py \\
        --json kernels/rs8/research/results/rs8-h200-2026-11-30-session12.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from rs8_candidates import block_maxima, float_keys, maxima_hist, window_threshold

CYCLES_PER_CANDIDATE = 550 / 112  # run 66: 692 -> 580 candidates saved ~0.55k cycles
CLOCK_GHZ = 1.98  # H200 SM clock under load
WIDE = 262_144  # the padded width the benchmark times beside the tight one


def candidates(row: torch.Tensor, k: int, cl: int) -> tuple[int, int]:
    """(keys >= the kernel's window cut, keys >= the k-th largest per-thread maximum)."""
    keys = float_keys(row)
    maxima = block_maxima(keys, cl)
    thr = window_threshold([maxima_hist(m) for m in maxima], k, cl)
    kth = int(torch.topk(torch.cat(maxima), k).values[-1])
    return int((keys >= thr).sum()), int((keys >= kth).sum())


def gaps(path: Path) -> dict[tuple[int, bool], float]:
    """Per (ctx, wide) at one request: rs8's µs minus half of `cooperative_topk`'s. The
    tight width is ctx rounded up to a multiple of 4; the wide one is WIDE."""
    out: dict[tuple[int, bool], float] = {}
    for r in json.loads(path.read_text())["results"]:
        if r["requests"] == 1:
            us = r["us"]
            out[(r["ctx"], r["width"] == WIDE)] = us["rs8"] - us["cooperative_topk"] / 2
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", type=Path, required=True, help="rs8_bench.py --json output")
    parser.add_argument("--k", type=int, default=512)
    parser.add_argument("--clusters", type=int, default=16)
    parser.add_argument("--rows", type=int, default=12, help="random rows per length")
    args = parser.parse_args()
    gap = gaps(args.json)
    lengths = sorted({ctx for ctx, _ in gap})
    gen = torch.Generator().manual_seed(1)
    print(
        "| ctx | candidates at the kernel's cut | at the k-th largest maximum | k "
        "| a perfect cut saves µs | gap µs (tight) | gap µs (262,144) |"
    )
    print("|---|---|---|---|---|---|---|")
    for ctx in lengths:
        now, best = [], []
        for i in range(args.rows):
            length = ctx - 5 + i % 6  # the benchmark's 6 rows of one request
            a, b = candidates(torch.randn(length, generator=gen), args.k, args.clusters)
            now.append(a)
            best.append(b)
        mean_now, mean_best = sum(now) / len(now), sum(best) / len(best)
        saves = (mean_now - args.k) * CYCLES_PER_CANDIDATE / (CLOCK_GHZ * 1000)
        print(
            f"| {ctx} | {mean_now:.0f} | {mean_best:.0f} | {args.k} | {saves:.2f} "
            f"| {gap[(ctx, False)]:.2f} | {gap[(ctx, True)]:.2f} |"
        )


if __name__ == "__main__":
    main()
