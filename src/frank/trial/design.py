"""The three designs our users pre-register, their run orders and their exact tests.

Why exact: a rule such as "better in all 5 blocks" is a statement about a finite
randomization (2^5 equally likely sign patterns, or 70 equally likely orders of 4 + 4),
so its p-value is a count over that set, never a normal approximation.

Conventions: arm A is the current stack, arm B the candidate. A value is "better" when it
is lower (direction "lower") or higher (direction "higher"); ties are never better. An
``improvement`` is oriented so that positive means B did better.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

import numpy as np

Kind = Literal["blocks", "balanced", "permutation"]
Direction = Literal["lower", "higher"]
Arm = Literal["A", "B"]

# Both counts stay exact and fast well past any trial our users run (16 blocks; 4 + 4).
MAX_PERMUTATION_BLOCKS = 40
MAX_BALANCED_PER_ARM = 50


@dataclass(frozen=True)
class Start:
    """One engine start in the sealed order (``index`` counts from 1)."""

    index: int
    block: int
    arm: Arm


@dataclass(frozen=True)
class Outcome:
    """What a rule says about a set of results."""

    p_value: float
    p_exact: str  # the p-value as a fraction, e.g. "1/32"
    passed: bool
    statistic: str  # e.g. "B better in 5 of 5 blocks"


def minimum_p(kind: Kind, blocks: int, per_arm: int) -> Fraction:
    """The smallest p-value the design can produce: the rule can pass only if it is <= alpha."""
    if kind == "balanced":
        return Fraction(1, math.comb(2 * per_arm, per_arm))
    return Fraction(1, 2**blocks)


def needed(kind: Kind, alpha: float) -> int:
    """The fewest blocks (or starts per arm, for balanced) that can pass at ``alpha``."""
    n = 1
    while float(minimum_p(kind, n, n)) > alpha:
        n += 1
    return n


def rule_text(kind: Kind, blocks: int, per_arm: int, alpha: float, direction: Direction,
              label: str) -> str:
    """The decision rule in the words our users publish, fixed before any start runs."""
    better = "lower" if direction == "lower" else "higher"
    if kind == "blocks":
        p = minimum_p(kind, blocks, per_arm)
        return (f"adopt B if {label} is {better} for B than for A in all {blocks} randomized "
                f"blocks (one-sided exact sign test, p = {p.numerator}/{p.denominator} "
                f"<= alpha {alpha:g})")
    if kind == "balanced":
        p = minimum_p(kind, blocks, per_arm)
        return (f"adopt B if {label} is {better} for every B start than for every A start "
                f"({per_arm} + {per_arm} starts in one of the {p.denominator} balanced "
                f"orders; exact rank test, p = 1/{p.denominator} <= alpha {alpha:g})")
    return (f"adopt B if the mean within-block improvement in {label} ({better} is better) "
            f"has a one-sided exact permutation p-value <= alpha {alpha:g} over all "
            f"{2**blocks} sign flips of {blocks} blocks")


def draw_order(kind: Kind, blocks: int, per_arm: int, seed: int) -> list[Start]:
    """The randomized run order: arm order random within each block, or one of the
    C(2n, n) balanced orders, each equally likely, drawn from ``seed``."""
    rng = random.Random(seed)
    if kind == "balanced":
        total = 2 * per_arm
        b_positions = set(rng.sample(range(total), per_arm))
        return [Start(i + 1, 1, "B" if i in b_positions else "A") for i in range(total)]
    out: list[Start] = []
    for block in range(1, blocks + 1):
        arms: list[Arm] = ["A", "B"] if rng.random() < 0.5 else ["B", "A"]
        out.extend(Start(len(out) + 1, block, arm) for arm in arms)
    return out


def improvement(a: float, b: float, direction: Direction) -> float:
    """How much better B is than A (positive: B better)."""
    return a - b if direction == "lower" else b - a


def _fraction(count: int, total: int) -> str:
    f = Fraction(count, total)
    return f"{f.numerator}/{f.denominator}"


def sign_test(pairs: list[tuple[float, float]], direction: Direction,
              alpha: float) -> Outcome:
    """"B better in all N blocks": one-sided exact sign test (scipy's binomtest).

    A tie counts as "not better", which only makes the test more conservative.
    """
    from scipy.stats import binomtest  # type: ignore[import-untyped,unused-ignore]

    n = len(pairs)
    k = sum(1 for a, b in pairs if improvement(a, b, direction) > 0)
    p = float(binomtest(k, n, 0.5, alternative="greater").pvalue)
    count = sum(math.comb(n, j) for j in range(k, n + 1))
    return Outcome(p, _fraction(count, 2**n), k == n and p <= alpha,
                   f"B better in {k} of {n} blocks")


def rank_test(a: list[float], b: list[float], direction: Direction,
              alpha: float) -> Outcome:
    """"Every B start better than every A start": exact rank (Mann-Whitney) test.

    U counts the (B, A) pairs where B is better (a tie scores 1/2). Its p-value is the share
    of all C(n_a + n_b, n_b) ways the labels could have fallen whose U reaches the observed
    one, counted exactly (with ties, on midranks) by a subset-sum count over the ranks, so
    no approximation is involved; complete separation gives p = 1/C(2n, n).
    """
    sign = 1.0 if direction == "lower" else -1.0
    values = [sign * v for v in (*a, *b)]  # smaller is better after orienting
    n_a, n_b = len(a), len(b)
    twice_ranks = _twice_midranks(values)
    # U = n_a n_b - (R_B - n_b (n_b + 1) / 2) with R_B the B rank sum: U >= u <=> R_B <= r
    observed_r2 = sum(twice_ranks[n_a:])
    u = n_a * n_b - (observed_r2 / 2 - n_b * (n_b + 1) / 2)
    # ways[k][s]: subsets of k positions whose doubled rank sum is s
    ways: list[dict[int, int]] = [{0: 1}] + [{} for _ in range(n_b)]
    for r2 in twice_ranks:
        for k in range(n_b, 0, -1):
            for s_prev, count in ways[k - 1].items():
                ways[k][s_prev + r2] = ways[k].get(s_prev + r2, 0) + count
    total = math.comb(n_a + n_b, n_b)
    at_least = sum(c for s_sum, c in ways[n_b].items() if s_sum <= observed_r2)
    p = at_least / total
    separated = u == n_a * n_b
    return Outcome(p, _fraction(at_least, total), separated and p <= alpha,
                   f"B better in {u:g} of {n_a * n_b} B-A pairs")


def _twice_midranks(values: list[float]) -> list[int]:
    """Twice each value's ascending midrank (integers, so rank sums count exactly)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + 1) + (j + 1)  # twice the mean of ranks i+1 .. j+1
        i = j + 1
    return out


def permutation_test(pairs: list[tuple[float, float]], direction: Direction,
                     alpha: float) -> Outcome:
    """Within-block permutation test: under "no effect" each block's improvement is as
    likely negated, so the p-value is the share of all 2^N sign flips whose total
    improvement reaches the observed one (identity included).

    Every flip is counted: the sums of each half of the blocks are enumerated in full and
    the pairs reaching the observed total are counted by a search in the sorted other half
    (2 x 2^(N/2) sums instead of 2^N, same count).
    """
    d = [improvement(a, b, direction) for a, b in pairs]
    n = len(d)
    if n > MAX_PERMUTATION_BLOCKS:
        raise ValueError(f"{n} blocks is more than the {MAX_PERMUTATION_BLOCKS} enumerated")
    left = _all_sign_sums(d[: n // 2])
    right = np.sort(_all_sign_sums(d[n // 2:]))
    observed = float(sum(d))
    tol = 1e-9 * max(1.0, float(np.abs(np.array(d)).sum()))
    # flips with left + right >= observed - tol, counted per left sum
    cut = np.searchsorted(right, observed - tol - left, side="left")
    at_least = int((len(right) - cut).sum())
    p = at_least / 2**n
    return Outcome(p, _fraction(at_least, 2**n), p <= alpha,
                   f"mean improvement {observed / n:.6g} per block")


def _all_sign_sums(d: list[float]) -> np.ndarray:
    """The 2^len(d) sums of +-d_i, every sign pattern once."""
    sums = np.zeros(1, dtype=np.float64)
    for x in d:
        sums = np.concatenate([sums + x, sums - x])
    return sums
