"""The three designs our users pre-register, their run orders and their exact tests.

Why exact: a rule such as "better in all 5 blocks" is a statement about a finite
randomization (2^5 equally likely sign patterns, or 70 equally likely orders of 4 + 4),
so its p-value is a count over that set, never a normal approximation.

Conventions: arm A is the current stack, arm B the candidate. A value is "better" when it
is lower (direction "lower") or higher (direction "higher"); ties are never better. An
``improvement`` is oriented so that positive means B did better.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

import numpy as np

Kind = Literal["blocks", "balanced", "permutation"]
Direction = Literal["lower", "higher"]
Arm = Literal["A", "B"]

# 2^24 sign flips (16.7 M) is the most we enumerate; beyond it a trial needs another design.
MAX_PERMUTATION_BLOCKS = 24
MAX_BALANCED_PER_ARM = 12  # C(24, 12) = 2.7 M orders


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

    The p-value is counted over all C(n_a + n_b, n_b) ways the labels could have fallen
    (exact with ties: a tie scores 1/2); complete separation gives p = 1/C(2n, n).
    """
    sign = 1.0 if direction == "lower" else -1.0
    values = [sign * v for v in (*a, *b)]  # smaller is better after orienting

    def u_of(b_idx: tuple[int, ...]) -> float:
        chosen = set(b_idx)
        bs = [values[i] for i in b_idx]
        as_ = [values[i] for i in range(len(values)) if i not in chosen]
        return sum(1.0 if x < y else 0.5 if x == y else 0.0 for x in bs for y in as_)

    observed = u_of(tuple(range(len(a), len(values))))
    total = 0
    at_least = 0
    for idx in itertools.combinations(range(len(values)), len(b)):
        total += 1
        if u_of(idx) >= observed - 1e-9:
            at_least += 1
    p = at_least / total
    separated = observed == len(a) * len(b)
    return Outcome(p, _fraction(at_least, total), separated and p <= alpha,
                   f"B better in {observed:g} of {len(a) * len(b)} B-A pairs")


def permutation_test(pairs: list[tuple[float, float]], direction: Direction,
                     alpha: float) -> Outcome:
    """Within-block permutation test: under "no effect" each block's improvement is as
    likely negated, so the p-value is the share of all 2^N sign flips whose mean
    improvement reaches the observed one (enumerated, identity included)."""
    d = np.array([improvement(a, b, direction) for a, b in pairs], dtype=np.float64)
    n = len(d)
    if n > MAX_PERMUTATION_BLOCKS:
        raise ValueError(f"{n} blocks is more than the {MAX_PERMUTATION_BLOCKS} enumerated")
    masks = np.arange(2**n, dtype=np.int64)[:, None]
    signs = 1.0 - 2.0 * ((masks >> np.arange(n, dtype=np.int64)) & 1)  # (2^n, n) of +-1
    sums = signs @ d
    observed = float(d.sum())
    tol = 1e-9 * max(1.0, float(np.abs(d).sum()))
    at_least = int(np.count_nonzero(sums >= observed - tol))
    p = at_least / 2**n
    return Outcome(p, _fraction(at_least, 2**n), p <= alpha,
                   f"mean improvement {observed / n:.6g} per block")
