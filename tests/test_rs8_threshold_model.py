"""CPU tests of rs8's one-round threshold, through the CPU model in kernels/rs8/research/.

The kernel finds its cut from each block's 32-bin window of suffix counts (a lower
bound of the cluster's histogram). Two things must hold, and both can be checked
without a GPU: the bound never puts the cut above the exact one (else T would drop
keys of the top k), and the GPU test set really contains rows where a window misses
the cut, so the kernel's loose-bound path is proved exact on the GPU, not just here.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "kernels" / "rs8" / "research"))
sys.path.insert(0, str(ROOT / "kernels" / "rs8" / "python"))

import rs8_candidates as model  # noqa: E402
from rs8_ref import float_keys  # noqa: E402

from tests.test_rs8_gpu import heterogeneous_row, skewed  # noqa: E402


def block_hists(row: torch.Tensor, cl: int) -> list[torch.Tensor]:
    return model.block_hists(float_keys(row), cl)


@pytest.mark.parametrize("cl", [16, 8, 4])
def test_window_cut_never_above_the_exact_cut(cl: int) -> None:
    gen = torch.Generator().manual_seed(cl)
    n = 60_000
    rows = [
        torch.randn(n, generator=gen),
        torch.empty(n).log_normal_(0.0, 2.0, generator=gen),
        torch.randn(n, generator=gen) * 1e-6,  # below the bucket map's range
        torch.sort(torch.randn(n, generator=gen)).values,
        heterogeneous_row(n, cl, gen),
        *skewed(n, gen),
    ]
    below = 0
    for row in rows:
        hists = block_hists(row, cl)
        for k in (512, 2048):
            exact, window = model.exact_cut(hists, k), model.window_cut(hists, k, cl)
            assert window <= exact
            below += window < exact
    assert below < len(rows) * 2  # the bound is tight on most rows, not just safe


def upper_bound_cut(hists: list[torch.Tensor], k: int, cl: int) -> int:
    """A deliberately wrong window_cut: above a block's window it counts the maxima
    above the window (an upper bound there) instead of none."""
    bins = torch.arange(1024)
    bound = torch.zeros(1024, dtype=torch.int64)
    for hist in hists:
        above = model.suffix_counts(hist)
        w0 = model.window_start(above, k, cl)
        bound += above[torch.clamp(bins, min=w0, max=w0 + 32)]
    hit = torch.nonzero(bound >= k)
    return int(hit.max()) if hit.numel() else -1


def test_a_wrong_bound_is_caught() -> None:
    hists = block_hists(heterogeneous_row(112_464, 16, torch.Generator().manual_seed(1)), 16)
    exact = model.exact_cut(hists, 512)
    assert upper_bound_cut(hists, 512, 16) > exact  # the safety check above would fail it
    assert model.window_cut(hists, 512, 16) <= exact  # the kernel's bound: safe, if loose


def test_gpu_skewed_rows_include_a_window_that_misses_the_cut() -> None:
    """tests/test_rs8_gpu.py::test_skewed_rows draws these rows (same seeds, same
    order); at least one takes the loose-bound path, where T is below the exact cut."""
    missed = []
    for k in (512, 1024, 2048):
        gen = torch.Generator().manual_seed(7 * k)
        for n in (112_464, 191_998):
            for i, row in enumerate(skewed(n, gen)):
                hists = block_hists(row, 16)
                if model.window_cut(hists, k, 16) < model.exact_cut(hists, k):
                    missed.append((k, n, i))
    assert missed, "no GPU-tested row exercises a window that misses the cut"


def test_cut_bound_orders_its_thresholds() -> None:
    """rs8_cut_bound.py: the kernel's cut keeps at least as many keys as the best
    maxima-based cut, which keeps at least k (k maxima, so k keys, are at or above it)."""
    import rs8_cut_bound

    gen = torch.Generator().manual_seed(3)
    for row in (torch.randn(112_464, generator=gen), *skewed(60_000, gen)):
        now, best = rs8_cut_bound.candidates(row, 512, 16)
        assert now >= best >= 512


def test_cut_bound_reads_every_one_request_gap() -> None:
    import rs8_cut_bound

    results = ROOT / "kernels" / "rs8" / "research" / "results"
    gap = rs8_cut_bound.gaps(results / "rs8-h200-2026-11-30-session12.json")
    assert sorted(gap) == [
        (ctx, wide) for ctx in (112464, 131072, 150000, 169449, 191998) for wide in (False, True)
    ]
    assert gap[(131072, False)] == pytest.approx(6.91 - 12.51 / 2, abs=0.01)
