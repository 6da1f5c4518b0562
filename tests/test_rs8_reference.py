"""CPU tests of rs8's reference, its torch op, the exact torch fallback and the vLLM plugin.

The reference is the oracle for the GPU kernel, so it is itself checked against an
independent brute force (Python sort on float bit patterns) on adversarial rows.
"""

from __future__ import annotations

import math
import struct
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

PY_DIR = Path(__file__).resolve().parents[1] / "kernels" / "rs8" / "python"
sys.path.insert(0, str(PY_DIR))

import rs8_op  # noqa: E402
import rs8_ref  # noqa: E402
import rs8_vllm  # noqa: E402

K = 512


def brute_row(values: torch.Tensor, k: int) -> list[int]:
    """Independent oracle: sort positions by (total-order key desc, position asc).

    Works on the raw bit patterns (Python floats would lose NaN signs and payloads).
    """
    words = values.contiguous().view(torch.int32).tolist()
    n = len(words)
    if n <= k:
        return list(range(n)) + [-1] * (k - n)
    us = [struct.unpack("<I", struct.pack("<i", w))[0] for w in words]
    keys = [(0xFFFFFFFF - u) if u & 0x80000000 else (u | 0x80000000) for u in us]
    return sorted(range(n), key=lambda i: (-keys[i], i))[:k]


def bits_to_floats(words: list[int]) -> torch.Tensor:
    """Build float32 values from raw bit patterns (keeps NaN signs and -0.0 exact)."""
    return torch.tensor(words, dtype=torch.int64).to(torch.int32).view(torch.float32)


def adversarial_rows(gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Rows that break naive top-k: ties, signed zeros, infinities, NaNs, sorted runs."""
    n = 1500
    rows: dict[str, torch.Tensor] = {}
    rows["all_equal"] = torch.full((n,), 0.75)
    z = torch.zeros(n)
    z[torch.randperm(n, generator=gen)[:300]] = torch.rand(300, generator=gen)
    rows["many_zero_ties"] = z
    signs = torch.randint(0, 2, (n,), generator=gen).bool()
    rows["pm_zero"] = torch.where(signs, torch.tensor(0.0), torch.tensor(-0.0))
    pz = torch.where(signs, torch.tensor(0.0), torch.tensor(-0.0))
    pz[:200] = -1.0
    rows["pm_zero_cutoff"] = pz
    v = torch.randn(n, generator=gen)
    v[torch.randperm(n, generator=gen)[:40]] = math.inf
    v[torch.randperm(n, generator=gen)[:40]] = -math.inf
    rows["pm_inf"] = v
    words = [0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF, 0x7F800000, 0xFF800000] * 50
    nan_row = torch.cat([bits_to_floats(words), torch.randn(n - len(words), generator=gen)])
    rows["nan_mixed"] = nan_row[torch.randperm(n, generator=gen)]
    rows["ascending"] = torch.arange(n, dtype=torch.float32)
    rows["descending"] = -torch.arange(n, dtype=torch.float32)
    runs = torch.cat([torch.arange(500.0), torch.arange(500.0).flip(0), torch.full((500,), 7.0)])
    rows["sorted_runs_and_plateau"] = runs
    rows["few_values"] = torch.randint(0, 4, (n,), generator=gen).float()
    rows["denormals"] = bits_to_floats(
        torch.randint(0, 1 << 23, (n,), generator=gen).tolist()
    ) * torch.where(signs, 1.0, -1.0)
    return rows


def test_float_keys_total_order() -> None:
    """Keys must rank -NaN < -inf < -1 < -0.0 < +0.0 < 1 < +inf < +NaN, strictly."""
    words = [0xFFC00000, 0xFF800000, 0xBF800000, 0x80000000, 0, 0x3F800000, 0x7F800000, 0x7FC00000]
    keys = rs8_ref.float_keys(bits_to_floats(words)).tolist()
    assert keys == sorted(keys)
    assert len(set(keys)) == len(keys)


@pytest.mark.parametrize("k", [512, 1024])
def test_reference_matches_brute_force_adversarial(k: int) -> None:
    gen = torch.Generator().manual_seed(1234 + k)
    for name, row in adversarial_rows(gen).items():
        got = rs8_ref.topk_row(row, k).tolist()
        assert got == brute_row(row, k), name


@pytest.mark.parametrize("length", [1, 7, K - 1, K, K + 1, 2 * K + 3, 4000])
def test_reference_matches_brute_force_lengths(length: int) -> None:
    gen = torch.Generator().manual_seed(length)
    row = torch.randn(length, generator=gen)
    row[: length // 3] = row[length // 3 : 2 * (length // 3)]  # exact duplicates too
    assert rs8_ref.topk_row(row, K).tolist() == brute_row(row, K)


def test_short_rows_are_iota_then_minus_one() -> None:
    out = rs8_ref.topk_row(torch.randn(5), 8).tolist()
    assert out == [0, 1, 2, 3, 4, -1, -1, -1]


def test_naive_topk_differs_so_the_check_can_fail() -> None:
    """torch.topk ignores the zero sign and the canonical order: the brute force sees it."""
    gen = torch.Generator().manual_seed(7)
    row = adversarial_rows(gen)["pm_zero_cutoff"]
    naive = torch.topk(row, K).indices.tolist()
    assert naive != brute_row(row, K)


def test_row_lengths_1d_and_2d() -> None:
    seq = torch.tensor([10, 3], dtype=torch.int32)
    # rowEnd = seq[r // next_n] - next_n + r % next_n + 1, clamped at 0 and at ncols.
    assert rs8_ref.row_lengths(seq, 4, 8) == [7, 8, 9, 10, 0, 1, 2, 3]
    assert rs8_ref.row_lengths(seq, 4, 8, ncols=8) == [7, 8, 8, 8, 0, 1, 2, 3]
    seq2 = torch.tensor([[5, -2], [9, 0]], dtype=torch.int32)
    assert rs8_ref.row_lengths(seq2, 2, 4) == [5, 0, 9, 0]


def _batch(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, int]:
    width = 3000
    logits = torch.randn(6, width, generator=gen)
    logits[1, :2000] = 0.0
    logits[2] = torch.where(logits[2] > 0, torch.tensor(0.0), torch.tensor(-0.0))
    seq = torch.tensor([2500, 600], dtype=torch.int32)
    return logits, seq, 3


def test_reference_rows_and_noncontiguous_strides() -> None:
    gen = torch.Generator().manual_seed(3)
    logits, seq, next_n = _batch(gen)
    ref = rs8_ref.topk_decode_ref(logits, next_n, seq, K)
    lengths = rs8_ref.row_lengths(seq, next_n, 6, logits.shape[1])
    for r, length in enumerate(lengths):
        assert ref[r].tolist() == brute_row(logits[r, :length], K)
    wide = torch.randn(logits.shape[1], 6 * 2, generator=gen)
    view = wide.t()[::2]  # stride0 = 2, stride1 = 12: non-contiguous both ways
    view.copy_(logits)
    assert torch.equal(rs8_ref.topk_decode_ref(view, next_n, seq, K), ref)


def test_cpu_op_and_fallback_match_reference() -> None:
    gen = torch.Generator().manual_seed(5)
    logits, seq, next_n = _batch(gen)
    ref = rs8_ref.topk_decode_ref(logits, next_n, seq, K)
    wide = torch.randn(6, 2 * logits.shape[1], generator=gen)
    view = wide[:, ::2]
    view.copy_(logits)
    out = torch.full((6, K), -7, dtype=torch.int32)
    torch.ops.rs8.topk_decode(view, next_n, seq, out, 6, view.stride(0), view.stride(1), K)
    assert torch.equal(out, ref)
    out2 = torch.full((6, K), -7, dtype=torch.int32)
    rs8_op.torch_fallback(logits, next_n, seq, out2, 6, K, per_row_lengths=False)
    assert torch.equal(out2, ref)
    seq2 = torch.tensor(rs8_ref.row_lengths(seq, next_n, 6), dtype=torch.int32).reshape(2, 3)
    out3 = torch.full((6, K), -7, dtype=torch.int32)
    rs8_op.torch_fallback(logits, next_n, seq2, out3, 6, K, per_row_lengths=True)
    assert torch.equal(out3, ref)


def test_plugin_register_overrides_and_is_idempotent() -> None:
    """register() on a stand-in namespace (CPU key) replaces the op's kernel, once."""
    lib = torch.library.Library("rs8fake", "DEF")
    lib.define(
        "top_k_per_row_decode(Tensor logits, int next_n, Tensor seq_lens, Tensor! indices, "
        "int numRows, int stride0, int stride1, int topK) -> ()"
    )

    def stand_in(*args: object) -> None:
        args[3].fill_(0)  # type: ignore[attr-defined]

    lib.impl("top_k_per_row_decode", stand_in, "CPU")
    gen = torch.Generator().manual_seed(11)
    logits, seq, next_n = _batch(gen)
    out = torch.full((6, K), -7, dtype=torch.int32)
    args = (logits, next_n, seq, out, 6, logits.stride(0), logits.stride(1), K)
    torch.ops.rs8fake.top_k_per_row_decode(*args)
    assert int(out.abs().sum()) == 0  # the stand-in kernel ran
    assert rs8_vllm.register("rs8fake", "CPU") == ["top_k_per_row_decode"]
    assert rs8_vllm.register("rs8fake", "CPU") == ["top_k_per_row_decode"]
    torch.ops.rs8fake.top_k_per_row_decode(*args)
    assert torch.equal(out, rs8_ref.topk_decode_ref(logits, next_n, seq, K))
    assert not torch.cuda.is_initialized()


def test_plugin_import_creates_no_cuda_context_and_entry_point() -> None:
    code = (
        f"import sys; sys.path.insert(0, {str(PY_DIR)!r}); import torch, rs8_vllm; "
        "rs8_vllm.register(); assert not torch.cuda.is_initialized(); print('ok')"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr
    meta = tomllib.loads((PY_DIR / "pyproject.toml").read_text())
    eps = meta["project"]["entry-points"]["vllm.general_plugins"]
    assert eps == {"rs8": "rs8_vllm:register"}
