"""vLLM general plugin: serve the decode top-k ops with rs8 instead of vLLM's kernels.

Loaded by vLLM in every process through the ``vllm.general_plugins`` entry point.
``register()`` overrides the CUDA kernels of ``_C::top_k_per_row_decode`` (and the
``persistent_topk`` / ``cooperative_topk`` decode paths) at the dispatcher, so every
Python-side call is caught without rebuilding vLLM. It is idempotent and creates no
CUDA context: the kernel library is loaded on the first call.

Environment: ``RS8_DISABLE=1`` skips registration (the revert path);
``RS8_VLLM_OPS`` is a comma list of the ops to override (default: all three);
``RS8_LIB`` points at librs8.so.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Callable

import rs8_op
import torch

DEFAULT_OPS = ("top_k_per_row_decode", "persistent_topk", "cooperative_topk")
_REGISTERED: dict[tuple[str, str], torch.library.Library] = {}


def _decode(
    logits: torch.Tensor,
    next_n: int,
    seq_lens: torch.Tensor,
    indices: torch.Tensor,
    numRows: int,
    stride0: int,
    stride1: int,
    topK: int,
) -> None:
    """``top_k_per_row_decode`` with rs8's canonical order."""
    _run(logits, next_n, seq_lens, indices, numRows, stride0, stride1, topK, None)


def _per_row(
    logits: torch.Tensor,
    lengths: torch.Tensor,
    output: torch.Tensor,
    workspace: torch.Tensor,
    k: int,
    max_seq_len: int,
) -> None:
    """``persistent_topk`` / ``cooperative_topk``: one length per row; workspace unused."""
    del workspace, max_seq_len
    rows = logits.shape[0]
    _run(logits, 1, lengths, output, rows, logits.stride(0), logits.stride(1), k, True)


def _run(
    logits: torch.Tensor,
    next_n: int,
    seq_lens: torch.Tensor,
    indices: torch.Tensor,
    rows: int,
    stride0: int,
    stride1: int,
    k: int,
    per_row: bool | None,
) -> None:
    """Dispatch to the kernel, or to the exact torch path for k it does not build / CPU."""
    per_row_lengths = seq_lens.dim() == 2 if per_row is None else per_row
    if logits.is_cuda and k in rs8_op.SUPPORTED_K:
        rs8_op.launch(logits, next_n, seq_lens, indices, rows, stride0, stride1, k, per_row_lengths)
        return
    view = logits.as_strided((rows, logits.shape[1]), (stride0, stride1))
    rs8_op.torch_fallback(view, next_n, seq_lens, indices, rows, k, per_row_lengths)


_IMPLS: dict[str, Callable[..., None]] = {
    "top_k_per_row_decode": _decode,
    "persistent_topk": _per_row,
    "cooperative_topk": _per_row,
}


def _load_vllm_ops() -> None:
    """Import vLLM's extension first so our impl lands after (and overrides) vLLM's own.

    The platform picks the library: vLLM's CPU platform loads ``_C_AVX512`` (which also
    registers the ``_C`` namespace) on a CPU with AVX-512 but no AVX512-BF16, and importing
    ``vllm._C`` beside it registers ``_C`` twice, which aborts the engine."""
    with contextlib.suppress(ImportError, AttributeError):
        from vllm.platforms import current_platform

        current_platform.import_kernels()
        return
    for mod in ("vllm._C_stable_libtorch", "vllm._C"):
        with contextlib.suppress(ImportError):
            importlib.import_module(mod)


def register(namespace: str = "_C", dispatch_key: str = "CUDA") -> list[str]:
    """Override the decode top-k ops that exist in ``namespace``; return their names.

    Idempotent: a second call returns the same names and registers nothing.
    """
    if os.environ.get("RS8_DISABLE") == "1":
        return []
    key = (namespace, dispatch_key)
    if key in _REGISTERED:
        return list(getattr(_REGISTERED[key], "_rs8_ops", []))
    if namespace == "_C":
        _load_vllm_ops()
    wanted = os.environ.get("RS8_VLLM_OPS")
    names = [n.strip() for n in wanted.split(",")] if wanted else list(DEFAULT_OPS)
    ns = getattr(torch.ops, namespace)
    lib = torch.library.Library(namespace, "IMPL")
    done: list[str] = []
    for name in names:
        if name in _IMPLS and hasattr(ns, name):
            lib.impl(name, _IMPLS[name], dispatch_key)
            done.append(name)
    lib._rs8_ops = done  # type: ignore[attr-defined]
    _REGISTERED[key] = lib
    return done
