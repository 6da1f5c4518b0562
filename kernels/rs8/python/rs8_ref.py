"""Pure-torch reference of rs8's contract (vLLM ``top_k_per_row_decode`` + canonical order).

It is the oracle the GPU kernel must match byte for byte, so it is written
for obviousness, not speed, and runs on the CPU in CI.
"""

from __future__ import annotations

import torch

_POS_BITS = 31  # positions < 2**31 (int32 indices)
_POS_MASK = (1 << _POS_BITS) - 1


def float_keys(x: torch.Tensor) -> torch.Tensor:
    """Map float32 values to int64 keys whose order is the float total bit order.

    +0.0 ranks above -0.0, positive NaN above +inf, negative NaN below -inf;
    this is what makes ties and signed zeros deterministic.
    """
    bits = x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    neg = (bits & 0x80000000) != 0
    return torch.where(neg, 0xFFFFFFFF - bits, bits | 0x80000000)


def row_lengths(
    seq_lens: torch.Tensor, next_n: int, num_rows: int, ncols: int | None = None
) -> list[int]:
    """Per-row rowEnd exactly as vLLM's decode kernel derives it (1-D or 2-D seq_lens).

    ``ncols`` clamps lengths to the tensor width, as rs8 does, so nothing is read
    past the row.
    """
    sl = seq_lens.to("cpu", torch.int64)
    out: list[int] = []
    for r in range(num_rows):
        if sl.dim() == 2:
            end = int(sl.reshape(-1)[r])
        else:
            end = int(sl[r // next_n]) - next_n + (r % next_n) + 1
        end = max(0, end)
        if ncols is not None:
            end = min(end, ncols)
        out.append(end)
    return out


def composite_keys(keys: torch.Tensor) -> torch.Tensor:
    """One unique int64 per entry of a row of ``float_keys``, larger for an entry that
    comes first in the canonical order: key descending, then lower position."""
    pos = torch.arange(keys.numel(), dtype=torch.int64)
    return (keys << _POS_BITS) | (_POS_MASK - pos)  # < 2**63


def topk_row(values: torch.Tensor, k: int) -> torch.Tensor:
    """Canonical top-k of one row: key descending, then lower position; -1 fill."""
    length = values.numel()
    out = torch.full((k,), -1, dtype=torch.int32)
    if length <= k:
        out[:length] = torch.arange(length, dtype=torch.int32)
        return out
    top = torch.topk(composite_keys(float_keys(values)), k, largest=True, sorted=True).values
    out[:] = (_POS_MASK - (top & _POS_MASK)).to(torch.int32)
    return out


def topk_decode_ref(
    logits: torch.Tensor, next_n: int, seq_lens: torch.Tensor, k: int
) -> torch.Tensor:
    """Reference for ``rs8::topk_decode``: int32 [num_rows, k] on the CPU.

    Only columns [0, rowEnd) of each row are looked at, like the kernel.
    """
    num_rows = logits.shape[0]
    lengths = row_lengths(seq_lens, next_n, num_rows, logits.shape[1])
    out = torch.empty((num_rows, k), dtype=torch.int32)
    for r, length in enumerate(lengths):
        out[r] = topk_row(logits[r, :length].to("cpu", torch.float32), k)
    return out
