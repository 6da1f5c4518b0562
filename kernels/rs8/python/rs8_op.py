"""torch binding of the rs8 kernel: the op ``rs8::topk_decode`` over librs8.so's C ABI.

The shared library is built by kernels/rs8/build.sh (nvcc only, no torch headers),
so one build serves any torch version; ctypes calls it on torch's current stream,
which keeps it CUDA-graph capturable. Nothing here touches CUDA at import time:
the library is loaded on the first GPU call.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import rs8_ref
import torch

SUPPORTED_K = (512, 1024, 2048)
_LIB: ctypes.CDLL | None = None


def _candidates() -> list[Path]:
    """Where librs8.so may be: $RS8_LIB, the installed plugin package, or the build dir."""
    here = Path(__file__).resolve().parent
    env = os.environ.get("RS8_LIB")
    paths = [Path(env)] if env else []
    return [*paths, here / "rs8_vllm" / "librs8.so", here.parent / "build" / "librs8.so"]


def open_library(path: str | Path) -> ctypes.CDLL:
    """Open one librs8.so build and declare its C signatures."""
    lib = ctypes.CDLL(str(path))
    lib.rs8_topk_decode.restype = ctypes.c_int
    lib.rs8_topk_decode.argtypes = [
        ctypes.c_void_p,
        ctypes.c_longlong,
        ctypes.c_longlong,
        ctypes.c_longlong,
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_void_p,
    ]
    lib.rs8_cache_keys.restype = ctypes.c_int
    lib.rs8_cache_keys.argtypes = [ctypes.c_int]
    lib.rs8_block_keys.restype = ctypes.c_int
    lib.rs8_block_keys.argtypes = [ctypes.c_int, ctypes.c_int]
    return lib


def load_library() -> ctypes.CDLL:
    """Load librs8.so once; raise a clear error naming the paths tried."""
    global _LIB
    if _LIB is None:
        for path in _candidates():
            if path.is_file():
                lib = open_library(path)
                _LIB = lib
                break
        else:
            tried = ", ".join(str(p) for p in _candidates())
            raise FileNotFoundError(f"librs8.so not found (tried {tried}); run build.sh")
    return _LIB


def cache_keys(k: int) -> int:
    """Keys one block of an 8-block cluster holds in registers (tests probe its edges)."""
    return int(load_library().rs8_cache_keys(k))


def block_keys(k: int, cl: int) -> int:
    """Keys one block holds in registers with cl blocks per row (16, 8 or 4)."""
    return int(load_library().rs8_block_keys(k, cl))


def launch(
    logits: torch.Tensor,
    next_n: int,
    seq_lens: torch.Tensor,
    indices: torch.Tensor,
    num_rows: int,
    stride0: int,
    stride1: int,
    k: int,
    per_row_lengths: bool | None = None,
    lib: ctypes.CDLL | None = None,
) -> None:
    """Run the kernel on torch's current stream (no sync, no allocation).

    ``per_row_lengths`` defaults to vLLM's rule: 2-D seq_lens hold one length per row.
    ``lib`` selects another build (tests load a deliberately broken one).
    """
    if k not in SUPPORTED_K:
        raise ValueError(f"rs8 supports k in {SUPPORTED_K}, got {k}")
    if logits.dtype != torch.float32 or seq_lens.dtype != torch.int32:
        raise TypeError("rs8 needs float32 logits and int32 seq_lens")
    if indices.dtype != torch.int32 or not indices.is_contiguous():
        raise TypeError("rs8 needs contiguous int32 indices")
    if not seq_lens.is_contiguous():
        raise ValueError("seq_lens must be contiguous")
    if per_row_lengths is None:
        per_row_lengths = seq_lens.dim() == 2
    stream = torch.cuda.current_stream(logits.device).cuda_stream
    err = (lib or load_library()).rs8_topk_decode(
        logits.data_ptr(),
        stride0,
        stride1,
        logits.shape[1],
        seq_lens.data_ptr(),
        int(per_row_lengths),
        next_n,
        indices.data_ptr(),
        num_rows,
        k,
        stream,
    )
    if err != 0:
        raise RuntimeError(f"rs8_topk_decode failed: cudaError {err}")


@torch.library.custom_op("rs8::topk_decode", mutates_args=("indices",))
def topk_decode(
    logits: torch.Tensor,
    next_n: int,
    seq_lens: torch.Tensor,
    indices: torch.Tensor,
    numRows: int,
    stride0: int,
    stride1: int,
    topK: int,
) -> None:
    """Same schema as vLLM's ``_C::top_k_per_row_decode``; canonical order output."""
    if logits.is_cuda:
        launch(logits, next_n, seq_lens, indices, numRows, stride0, stride1, topK)
        return
    view = logits.as_strided((numRows, logits.shape[1]), (stride0, stride1))
    indices.copy_(rs8_ref.topk_decode_ref(view, next_n, seq_lens, topK))


@topk_decode.register_fake
def _(
    logits: torch.Tensor,
    next_n: int,
    seq_lens: torch.Tensor,
    indices: torch.Tensor,
    numRows: int,
    stride0: int,
    stride1: int,
    topK: int,
) -> None:
    return None


def torch_fallback(
    logits: torch.Tensor,
    next_n: int,
    seq_lens: torch.Tensor,
    indices: torch.Tensor,
    num_rows: int,
    k: int,
    per_row_lengths: bool,
) -> None:
    """Exact canonical top-k in plain torch ops on the logits' device, for any k.

    Slow but capturable; used by the vLLM plugin for k the kernel does not build.
    """
    dev = logits.device
    width = logits.shape[1]
    cols = torch.arange(width, device=dev, dtype=torch.int64)
    sl = seq_lens.to(torch.int64)
    if per_row_lengths:
        ends = sl.reshape(-1)[:num_rows]
    else:
        r = torch.arange(num_rows, device=dev, dtype=torch.int64)
        ends = sl[r // next_n] - next_n + (r % next_n) + 1
    ends = ends.clamp(min=0, max=width)
    keys = rs8_ref.float_keys(logits[:num_rows].float())
    comp = (keys << 31) | ((1 << 31) - 1 - cols)
    comp = torch.where(cols[None, :] < ends[:, None], comp, torch.full_like(comp, -1))
    kk = min(k, width)
    top = torch.topk(comp, kk, dim=1, largest=True, sorted=True).values
    pos = ((1 << 31) - 1 - (top & ((1 << 31) - 1))).to(torch.int32)
    slot = torch.arange(kk, device=dev, dtype=torch.int64)
    short = ends[:, None] <= k
    pos = torch.where(short, slot[None, :].to(torch.int32), pos)
    pos = torch.where(slot[None, :] < ends[:, None], pos, torch.full_like(pos, -1))
    indices[:num_rows].fill_(-1)
    indices[:num_rows, :kk].copy_(pos)
