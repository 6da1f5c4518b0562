"""CPU model of a one-round rs8 (not built): candidates it would carry, and rows it would lose.

Why: `main` waits for the slowest block twice, at the window round and at the list
exchange. Dropping the window round means each block collects at a cut of its own (the bin
of its m-th largest per-thread maximum) and sends every key at or above it. The result is
exact unless some block's smallest sent entry ranks above the union's k-th, because then
a key it held back may belong to the top k; such a row would take the general path. This
prints, per row shape, the candidates per row against `main`'s window cut and how many rows
are at risk, for several m (NOTES.md, fifteenth session).

    python3 kernels/rs8/research/rs8_one_round_model.py --ctx 112464,191998 --rows 12
"""

from __future__ import annotations

import argparse

import torch
from rs8_candidates import (
    block_hists,
    cut_threshold,
    exact_cut,
    float_keys,
    shapes,
    slice_len,
    window_threshold,
)
from rs8_ref import composite_keys

SHAPES = (
    "normal",
    "sum of 8 relu heads",
    "lognormal(0,2)",
    "normal, last 2% of positions +2 (recency)",
)


def main_candidates(keys: torch.Tensor, hists: list[torch.Tensor], k: int, cl: int) -> int:
    """Keys at or above `main`'s window cut (the kernel's one-round threshold)."""
    return int((keys >= window_threshold(hists, k, cl)).sum())


def one_round(
    keys: torch.Tensor, comp: torch.Tensor, hists: list[torch.Tensor], k: int, cl: int, m: int
) -> tuple[int, bool]:
    """(candidates sent, row at risk) when each block cuts at its m-th largest maximum."""
    cs = slice_len(keys.numel(), cl)
    sent: list[torch.Tensor] = []
    truncated_mins: list[int] = []
    for r in range(cl):
        lo = cut_threshold(exact_cut([hists[r]], m))  # this block's m-th largest maximum's bin
        block_keys, block_comp = keys[r * cs : (r + 1) * cs], comp[r * cs : (r + 1) * cs]
        s = block_comp[block_keys >= lo]
        sent.append(s)
        if s.numel() < block_comp.numel() and s.numel():
            truncated_mins.append(int(s.min()))
    union = torch.cat(sent)
    if union.numel() < k:
        return union.numel(), True
    kth = int(torch.topk(union, k).values[-1])
    return union.numel(), any(mn > kth for mn in truncated_mins)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ctx", default="112464,191998")
    parser.add_argument("--k", type=int, default=512)
    parser.add_argument("--blocks", type=int, default=16)
    parser.add_argument("--rows", type=int, default=12, help="random rows per shape")
    parser.add_argument("--m", default="32,40,48,56,64", help="per-block cuts to model")
    args = parser.parse_args()
    ms = [int(m) for m in args.m.split(",")]
    gen = torch.Generator().manual_seed(1)
    makers = shapes(gen)
    cells = " | ".join(f"m = {m}: candidates, rows at risk" for m in ms)
    print(f"| ctx | shape | main's candidates | {cells} |")
    print("|---" * (3 + len(ms)) + "|")
    for ctx in (int(c) for c in args.ctx.split(",")):
        for name in SHAPES:
            base: list[int] = []
            sent: dict[int, list[int]] = {m: [] for m in ms}
            risky = dict.fromkeys(ms, 0)
            for _ in range(args.rows):
                keys = float_keys(makers[name](ctx))
                hists = block_hists(keys, args.blocks)
                comp = composite_keys(keys)
                base.append(main_candidates(keys, hists, args.k, args.blocks))
                for m in ms:
                    n, risk = one_round(keys, comp, hists, args.k, args.blocks, m)
                    sent[m].append(n)
                    risky[m] += int(risk)
            row = " | ".join(
                f"{sum(sent[m]) / len(sent[m]):.0f}, {risky[m]}/{args.rows}" for m in ms
            )
            print(f"| {ctx} | {name} | {sum(base) / len(base):.0f} | {row} |", flush=True)


if __name__ == "__main__":
    main()
