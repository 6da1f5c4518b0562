"""The designs' exact tests against hand computations and brute force."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from fractions import Fraction

import pytest

from frank.trial.design import (
    draw_order,
    minimum_p,
    needed,
    permutation_test,
    rank_test,
    sign_test,
)


def test_sign_test_five_of_five_is_one_in_32() -> None:
    # verify step lower for B in all 5 blocks (the schedule-2 trial's shape)
    pairs = [(14.40, 14.10), (14.52, 14.20), (14.38, 14.09), (14.45, 14.15), (14.41, 14.12)]
    out = sign_test(pairs, "lower", 0.05)
    assert out.p_value == pytest.approx(1 / 32, abs=1e-15)
    assert out.p_exact == "1/32"
    assert out.passed
    assert out.statistic == "B better in 5 of 5 blocks"


def test_sign_test_four_of_five_fails_the_all_blocks_rule() -> None:
    pairs = [(10, 9), (10, 9), (10, 9), (10, 9), (10, 11)]
    out = sign_test(pairs, "lower", 0.05)
    assert out.p_exact == "3/16"  # (C(5,4) + C(5,5)) / 32 = 6/32
    assert out.p_value == pytest.approx(6 / 32)
    assert not out.passed


def test_sign_test_ties_are_not_better_and_direction_matters() -> None:
    assert sign_test([(1.0, 1.0)] * 5, "lower", 0.05).p_exact == "1/1"
    assert sign_test([(1, 2)] * 5, "higher", 0.05).passed
    assert not sign_test([(1, 2)] * 5, "lower", 0.05).passed


def test_balanced_four_plus_four_complete_separation_is_one_in_70() -> None:
    a = [6.64, 6.93, 6.71, 6.80]  # uncached
    b = [1.16, 1.23, 1.19, 1.20]  # cached
    out = rank_test(a, b, "lower", 0.05)
    assert out.p_exact == "1/70"
    assert out.p_value == pytest.approx(1 / 70)
    assert out.passed
    # one B start no better than one A start: the rule fails, p = 2/70
    worse = rank_test(a, [1.16, 1.23, 1.19, 6.70], "lower", 0.05)
    assert not worse.passed
    assert worse.p_exact == "1/35"


def test_rank_test_matches_scipy_exact_mann_whitney() -> None:
    from scipy.stats import mannwhitneyu

    a = [5.0, 3.1, 4.4, 6.2, 2.9]
    b = [2.0, 3.0, 1.7, 4.0, 2.5]
    ours = rank_test(a, b, "lower", 0.05)
    ref = mannwhitneyu(b, a, alternative="less", method="exact")
    assert ours.p_value == pytest.approx(ref.pvalue)


def _brute_force_permutation(d: list[float]) -> Fraction:
    observed = sum(d)
    hits = sum(1 for signs in itertools.product((1, -1), repeat=len(d))
               if sum(s * x for s, x in zip(signs, d, strict=True)) >= observed - 1e-12)
    return Fraction(hits, 2 ** len(d))


def test_permutation_test_matches_brute_force() -> None:
    pairs = [(10.0, 9.5), (10.0, 10.2), (11.0, 10.1), (9.0, 8.0), (10.0, 9.9), (12.0, 11.2)]
    d = [a - b for a, b in pairs]  # lower is better: improvement = A - B
    expected = _brute_force_permutation(d)
    out = permutation_test(pairs, "lower", 0.05)
    assert Fraction(out.p_exact) == expected
    assert out.p_value == pytest.approx(float(expected))
    # by hand: d = 0.5, -0.2, 0.9, 1.0, 0.1, 0.8 sums to 3.1 of a possible 3.5; a flip set
    # reaches 3.1 only if the |d| it makes negative sum to <= 0.2: {}, {0.1}, {0.2}
    assert expected == Fraction(3, 64)
    assert out.passed  # 3/64 = 0.047 <= 0.05
    assert not permutation_test(pairs, "lower", 0.04).passed


def test_permutation_test_matches_scipy_permutation_test() -> None:
    import numpy as np
    from scipy.stats import permutation_test as scipy_permutation_test

    rng = np.random.default_rng(3)
    a = rng.normal(10, 1, 10)
    b = a - rng.normal(0.3, 0.5, 10)
    ref = scipy_permutation_test((a, b), lambda x, y, axis: np.mean(x - y, axis=axis),
                                 permutation_type="samples", n_resamples=np.inf,
                                 alternative="greater", vectorized=True)
    ours = permutation_test(list(zip(a.tolist(), b.tolist(), strict=True)), "lower", 0.05)
    assert ours.p_value == pytest.approx(ref.pvalue)


def test_sixteen_blocks_all_better_is_one_in_65536() -> None:
    out = permutation_test([(2.0, 1.0 + i / 100) for i in range(16)], "lower", 0.05)
    assert out.p_exact == "1/65536"


def test_minimum_p_and_blocks_needed() -> None:
    assert minimum_p("blocks", 5, 1) == Fraction(1, 32)
    assert minimum_p("balanced", 1, 4) == Fraction(1, 70)
    assert minimum_p("balanced", 1, 3) == Fraction(1, 20)
    assert needed("blocks", 0.05) == 5
    assert needed("balanced", 0.05) == 3
    assert needed("permutation", 0.01) == 7


def test_orders_are_seeded_balanced_and_cover_the_70_orders() -> None:
    assert draw_order("blocks", 5, 1, 42) == draw_order("blocks", 5, 1, 42)
    blocks = draw_order("blocks", 5, 1, 42)
    assert [s.index for s in blocks] == list(range(1, 11))
    for block in range(1, 6):
        assert sorted(s.arm for s in blocks if s.block == block) == ["A", "B"]
    seen = Counter("".join(s.arm for s in draw_order("balanced", 1, 4, seed))
                   for seed in range(7000))
    assert len(seen) == math.comb(8, 4) == 70
    assert all(o.count("A") == 4 for o in seen)
    assert max(seen.values()) < 160  # ~100 each: uniform enough, not a few favourites


def _brute_force_rank(a: list[float], b: list[float]) -> Fraction:
    """Every relabelling of the pooled values, U counted pair by pair (ties 1/2)."""
    values = [*a, *b]

    def u(idx: tuple[int, ...]) -> float:
        bs = [values[i] for i in idx]
        as_ = [values[i] for i in range(len(values)) if i not in idx]
        return sum(1.0 if x < y else 0.5 if x == y else 0.0 for x in bs for y in as_)

    observed = u(tuple(range(len(a), len(values))))
    combos = list(itertools.combinations(range(len(values)), len(b)))
    return Fraction(sum(1 for c in combos if u(c) >= observed), len(combos))


def test_rank_and_permutation_counts_equal_brute_force_on_random_data_with_ties() -> None:
    import random

    rng = random.Random(11)
    for _ in range(60):
        n_a, n_b = rng.randint(1, 5), rng.randint(1, 5)
        grid = [rng.choice([1.0, 1.5, 2.0, 2.5, 3.0]) for _ in range(n_a + n_b)]  # many ties
        a, b = grid[:n_a], grid[n_a:]
        assert Fraction(rank_test(a, b, "lower", 0.05).p_exact) == _brute_force_rank(a, b)
        flipped = [-x for x in a], [-x for x in b]
        assert rank_test(a, b, "higher", 0.05).p_exact == \
            rank_test(*flipped, "lower", 0.05).p_exact
        n = rng.randint(1, 9)
        pairs = [(rng.choice([1.0, 2.0, 3.0]), rng.choice([1.0, 2.0, 3.0])) for _ in range(n)]
        d = [x - y for x, y in pairs]
        assert Fraction(permutation_test(pairs, "lower", 0.05).p_exact) == \
            _brute_force_permutation(d)


def test_large_designs_stay_exact_and_fast() -> None:
    import time

    t0 = time.monotonic()
    out = permutation_test([(2.0, 1.0 + i / 1000) for i in range(30)], "lower", 0.05)
    assert out.p_exact == f"1/{2**30}"
    big = rank_test([float(i) for i in range(20, 40)], [float(i) for i in range(20)],
                    "lower", 0.05)
    assert big.p_exact == f"1/{math.comb(40, 20)}" and big.passed
    assert time.monotonic() - t0 < 10


def test_all_blocks_rule_is_stricter_than_the_sign_test_p_alone() -> None:
    # 7 of 8 blocks better: p = (C(8,7) + 1) / 256 = 9/256 < 0.05, but the rule written
    # before the trial was "better in all 8 blocks", so it does not pass.
    out = sign_test([(2.0, 1.0)] * 7 + [(1.0, 2.0)], "lower", 0.05)
    assert out.p_exact == "9/256" and out.p_value < 0.05
    assert not out.passed
