"""GPU exactness tests of the rs8 kernel: byte-identical to the CPU reference.

Skipped cleanly without a CUDA device (CI). On a GPU they need librs8.so: $RS8_LIB,
or kernels/rs8/build/librs8.so, which is built here with build.sh if nvcc exists.
The broken-build test needs $RS8_BREAK_LIB (a build with -DRS8_BREAK), or nvcc.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "kernels" / "rs8" / "python"))

import rs8_op  # noqa: E402
import rs8_ref  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

POISON = -7


def _arch() -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"{major}{minor}" + ("a" if major == 9 else "")


def _build(out: Path, extra: str = "") -> Path:
    if shutil.which("nvcc") is None:
        pytest.skip("no nvcc to build librs8.so")
    env = dict(os.environ, RS8_EXTRA_FLAGS=extra)
    subprocess.run(
        [str(ROOT / "kernels" / "rs8" / "build.sh"), str(out), _arch()], check=True, env=env
    )
    return out / "librs8.so"


@pytest.fixture(scope="module", autouse=True)
def _library() -> None:
    if not os.environ.get("RS8_LIB") and not (ROOT / "kernels/rs8/build/librs8.so").is_file():
        os.environ["RS8_LIB"] = str(_build(ROOT / "kernels" / "rs8" / "build"))
    rs8_op.load_library()


def run_rs8(
    logits: torch.Tensor, next_n: int, seq_lens: torch.Tensor, k: int, lib: object = None
) -> torch.Tensor:
    """One call into poisoned output, so unwritten slots show up."""
    out = torch.full((logits.shape[0], k), POISON, dtype=torch.int32, device=logits.device)
    rs8_op.launch(
        logits,
        next_n,
        seq_lens,
        out,
        logits.shape[0],
        logits.stride(0),
        logits.stride(1),
        k,
        lib=lib,  # type: ignore[arg-type]
    )
    torch.cuda.synchronize()
    return out.cpu()


def mismatched_rows(
    logits: torch.Tensor, next_n: int, seq_lens: torch.Tensor, k: int, lib: object = None
) -> list[int]:
    got = run_rs8(logits, next_n, seq_lens, k, lib)
    ref = rs8_ref.topk_decode_ref(logits.cpu(), next_n, seq_lens.cpu(), k)
    return [r for r in range(got.shape[0]) if not torch.equal(got[r], ref[r])]


def per_row(lengths: list[int]) -> torch.Tensor:
    return torch.tensor(lengths, dtype=torch.int32, device="cuda").reshape(-1, 1)


def edge_lengths(k: int, gen: torch.Generator) -> list[int]:
    """Lengths at every boundary: k, one block's register-held keys and 2, 4 and 8 times that,
    and the row length past which 4-block clusters stream a tail."""
    cache = rs8_op.cache_keys(k)
    fixed = [1, 2, k - 1, k, k + 1, k + 2, 1000, 4097, cache - 1, cache, cache + 1]
    for edge in sorted({2 * cache, 4 * cache, 8 * cache, 4 * rs8_op.block_keys(k, 4)}):
        fixed += [edge - 1, edge, edge + 1, edge + 4, edge + 5]
    fixed += [200_000, 262_144, 300_000]
    rand = torch.randint(1, 300_001, (10,), generator=gen).tolist()
    return fixed + rand


@pytest.mark.parametrize("k", [512, 1024, 2048])
def test_random_rows_all_lengths(k: int) -> None:
    """Six rows per call (16-block clusters on an H200, 512 threads), twelve (8-block
    clusters, 1,024 threads), then all rows and 4x that in one call (4-block clusters, 1,024
    threads, the latter in waves, with long tails past the register-held keys), so every
    cluster size, block shape and tail path is checked.
    """
    gen = torch.Generator().manual_seed(k)
    lengths = edge_lengths(k, gen)
    width = 300_004
    logits = torch.randn(len(lengths), width, generator=gen)
    logits[1::3] = torch.relu(logits[1::3])  # ReLU-like rows: many exact-zero ties
    logits[2::5] = torch.round(logits[2::5] * 4) / 4  # coarse values: ties at the cutoff
    dev = logits.cuda()
    for step in (6, 12):
        for lo in range(0, len(lengths), step):
            part = lengths[lo : lo + step]
            assert mismatched_rows(dev[lo : lo + step], 1, per_row(part), k) == [], (step, lo)
    assert mismatched_rows(dev, 1, per_row(lengths), k) == []
    many = dev.repeat(4, 1)
    assert mismatched_rows(many, 1, per_row(lengths * 4), k) == []


@pytest.mark.parametrize("k", [512, 2048])
def test_aligned_rows_at_tight_widths(k: int) -> None:
    """The host launches a kernel without the strided-row and tail code when every row is
    contiguous and 16-byte aligned and the width lets no slice outgrow the registers (the
    test above, at width 300,004, never does). Every boundary length at a tight width, then
    the widths where that choice flips for 16- and 8-block clusters: 4 columns below, at and
    4 above cl x the keys one block holds, with rows ending on every column near the width.
    """
    gen = torch.Generator().manual_seed(k + 7)
    lengths = edge_lengths(k, gen)
    for step in (6, 12):
        for lo in range(0, len(lengths), step):
            part = lengths[lo : lo + step]
            width = (max(part) + 3) & ~3
            logits = torch.randn(len(part), width, generator=gen)
            logits[1::3] = torch.relu(logits[1::3])
            got = mismatched_rows(logits.cuda(), 1, per_row(part), k)
            assert got == [], (step, lo, width)
    for cl, rows in ((16, 6), (8, 12)):
        edge = cl * rs8_op.block_keys(k, cl)
        for width in (edge - 4, edge, edge + 4):
            part = [width - j for j in range(rows)]
            logits = torch.randn(rows, width, generator=gen)
            assert mismatched_rows(logits.cuda(), 1, per_row(part), k) == [], (cl, width)


def adversarial(n: int, gen: torch.Generator) -> torch.Tensor:
    """Rows of length n that stress ties, signed zeros, infinities and NaNs."""
    rows = []
    rows.append(torch.full((n,), 0.5))
    r = torch.relu(torch.randn(n, generator=gen))
    rows.append(r)
    r2 = torch.zeros(n)
    r2[torch.randperm(n, generator=gen)[:100]] = 1.0
    rows.append(r2)  # cutoff inside the zeros
    signs = torch.randint(0, 2, (n,), generator=gen).bool()
    rows.append(torch.where(signs, torch.tensor(0.0), torch.tensor(-0.0)))
    v = torch.randn(n, generator=gen)
    v[torch.randperm(n, generator=gen)[: n // 50]] = float("inf")
    v[torch.randperm(n, generator=gen)[: n // 50]] = float("-inf")
    rows.append(v)
    words = torch.tensor([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF], dtype=torch.int64)
    nan = words.to(torch.int32).view(torch.float32).repeat(n // 8)
    w = torch.randn(n, generator=gen)
    w[torch.randperm(n, generator=gen)[: nan.numel()]] = nan
    rows.append(w)
    rows.append(torch.arange(n, dtype=torch.float32))
    rows.append(-torch.arange(n, dtype=torch.float32))
    rows.append(torch.arange(n, dtype=torch.float32) % 1000)
    rows.append(torch.randint(0, 3, (n,), generator=gen).float())
    big = torch.randn(n, generator=gen) * 1e30  # outside the coarse bucket range
    rows.append(big)
    tiny = torch.randn(n, generator=gen) * 1e-30
    rows.append(tiny)
    return torch.stack(rows)


@pytest.mark.parametrize("k", [512, 2048])
@pytest.mark.parametrize("n", [3000, 150_000, 200_000])
def test_adversarial_rows(k: int, n: int) -> None:
    gen = torch.Generator().manual_seed(n + k)
    logits = adversarial(n, gen)
    lengths = [n] * logits.shape[0]
    assert mismatched_rows(logits.cuda(), 1, per_row(lengths), k) == []


def heterogeneous_row(n: int, cl: int, gen: torch.Generator) -> torch.Tensor:
    """Tiny values with 24 spikes at 1.0 in every block of a 16-block cluster, and the
    top k (at 4-5) all in block 0: every other block's threshold window sits far below
    the cut, with maxima above it (tests/test_rs8_threshold_model.py)."""
    cs = (math.ceil(n / cl) + 3) & ~3
    row = torch.randn(n, generator=gen) * 1e-3
    for r in range(cl):
        row[r * cs + torch.randperm(min(cs, n - r * cs), generator=gen)[:24]] = 1.0
    row[torch.randperm(cs, generator=gen)[:400]] = 4.0 + torch.rand(400, generator=gen)
    return row


def skewed(n: int, gen: torch.Generator) -> torch.Tensor:
    """Rows whose winners crowd into one slice of the cluster (recency bias, spikes, runs).

    Before the per-block lists grew to fill shared memory, these overflowed one
    block's list and sent the whole row to the general path
    (kernels/rs8/research/rs8_candidates.py); either way the output must stay exact.
    """
    pos = torch.arange(n)
    base = torch.randn(n, generator=gen)
    rows = [
        base + torch.where(pos >= n - n // 50, 2.0, 0.0),  # recency: last 2% +2 sigma
        base + torch.where(pos >= n - n // 50, 1.0, 0.0),
        torch.where(torch.rand(n, generator=gen) < 0.01, torch.tensor(10.0), base),
        torch.sort(torch.randn(n, generator=gen)).values,  # ascending: all winners at the end
        torch.relu(base) + torch.where(pos < n // 40, 3.0, 0.0),  # a hot prefix, zero ties
        torch.round(base * 2) / 2 + torch.where(pos >= n - n // 30, 1.5, 0.0),
        heterogeneous_row(n, 16, gen),
    ]
    return torch.stack(rows)


@pytest.mark.parametrize("k", [512, 1024, 2048])
def test_skewed_rows(k: int) -> None:
    """Skewed rows on 16-block clusters (7 rows), 8-block clusters (14 rows) and 4-block
    clusters (56 rows, tails)."""
    gen = torch.Generator().manual_seed(7 * k)
    for n in (112_464, 191_998):
        logits = skewed(n, gen).cuda()
        rows = logits.shape[0]
        assert mismatched_rows(logits, 1, per_row([n] * rows), k) == [], n
        for times in (2, 8):
            many = logits.repeat(times, 1)
            assert mismatched_rows(many, 1, per_row([n] * times * rows), k) == [], (n, times)


def test_noncontiguous_strides_and_1d_seq_lens() -> None:
    gen = torch.Generator().manual_seed(99)
    rows, width, k, next_n = 12, 190_003, 512, 6
    base = torch.randn(rows, 3 * width + 1, generator=gen).cuda()
    seq = torch.tensor([190_000, 100_000], dtype=torch.int32, device="cuda")
    strided = base[:, 1::3]  # stride1 = 3, misaligned base
    assert mismatched_rows(strided, next_n, seq, k) == []
    offset = base[:, 1 : width + 1]  # stride1 = 1, base not 16-byte aligned
    assert mismatched_rows(offset, next_n, seq, k) == []
    tall = torch.randn(width, rows, generator=gen).cuda().t()  # stride0 = 1, stride1 = rows
    assert mismatched_rows(tall, next_n, seq, k) == []
    seq2d = torch.tensor([[5, 190_000, 0], [700, 183_425, 1]], dtype=torch.int32, device="cuda")
    six = base[:6, : width * 3 : 3]
    assert mismatched_rows(six, 3, seq2d, k) == []


def test_oversized_stride_is_refused_before_launch() -> None:
    """stride1 travels to the kernel as 32 bits: a larger one is refused, nothing runs."""
    logits = torch.zeros(1, 1000, device="cuda")
    seq = torch.tensor([1000], dtype=torch.int32, device="cuda")
    out = torch.full((1, 512), POISON, dtype=torch.int32, device="cuda")
    with pytest.raises(RuntimeError, match="cudaError 1"):
        rs8_op.launch(logits, 1, seq, out, 1, 1000, 2**31, 512)
    torch.cuda.synchronize()
    assert bool((out == POISON).all())


def test_cuda_graph_replay() -> None:
    """Capture once, then change data and lengths in place: every replay stays exact."""
    gen = torch.Generator().manual_seed(5)
    rows, width, k = 6, 192_000, 512
    logits = torch.randn(rows, width, generator=gen).cuda()
    seq = torch.full((rows, 1), width, dtype=torch.int32, device="cuda")
    out = torch.full((rows, k), POISON, dtype=torch.int32, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        rs8_op.launch(logits, 1, seq, out, rows, width, 1, k)  # warm-up outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        rs8_op.launch(logits, 1, seq, out, rows, width, 1, k)
    for trial in range(4):
        logits.copy_(torch.randn(rows, width, generator=gen))
        if trial == 2:
            logits.copy_(adversarial(width, gen)[:rows])
        lengths = torch.randint(1, width + 1, (rows, 1), generator=gen, dtype=torch.int32)
        lengths[0, 0] = 183_425
        seq.copy_(lengths)
        out.fill_(POISON)
        graph.replay()
        torch.cuda.synchronize()
        ref = rs8_ref.topk_decode_ref(logits.cpu(), 1, seq.cpu(), k)
        assert torch.equal(out.cpu(), ref), trial


def test_same_bytes_every_run() -> None:
    gen = torch.Generator().manual_seed(8)
    logits = adversarial(160_000, gen).cuda()
    seq = per_row([160_000] * logits.shape[0])
    first = run_rs8(logits, 1, seq, 512)
    for _ in range(3):
        assert torch.equal(run_rs8(logits, 1, seq, 512), first)


def test_deliberately_broken_build_is_caught(tmp_path: Path) -> None:
    """A build that ranks -0.0 like +0.0 must fail the same comparison."""
    path = os.environ.get("RS8_BREAK_LIB") or str(_build(tmp_path, "-DRS8_BREAK"))
    broken = rs8_op.open_library(path)
    gen = torch.Generator().manual_seed(17)
    logits = adversarial(5000, gen).cuda()
    seq = per_row([5000] * logits.shape[0])
    bad = mismatched_rows(logits, 1, seq, 512, lib=broken)
    assert bad, "the broken build passed: the check cannot fail"
    assert mismatched_rows(logits, 1, seq, 512) == []


@pytest.mark.skipif(
    not os.environ.get("RS8_VLLM_LIB"),
    reason="needs $RS8_VLLM_LIB: vLLM's top-k ops built by bench/build_vllm_topk.py",
)
def test_plugin_overrides_vllm_cuda_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """The vLLM plugin against vLLM 0.33.0's own CUDA kernels, not a stand-in.

    bench/build_vllm_topk.py registers vLLM's three decode top-k ops, compiled from its
    released source, with the stable-ABI macros vllm._C_stable_libtorch uses, under the
    namespace ``rs8vb``. Before the override they return vLLM's output (the reference's
    sets, at least one op in an order of its own) and never call rs8; after
    ``rs8_vllm.register`` every call through the dispatcher goes to rs8 and returns the
    reference's bytes, also when replayed from a CUDA graph.
    """
    import rs8_vllm

    torch.ops.load_library(os.environ["RS8_VLLM_LIB"])
    ops = torch.ops.rs8vb
    gen = torch.Generator().manual_seed(23)
    requests, next_n, width, k = 2, 6, 150_000, 512
    rows = requests * next_n
    host = torch.randn(rows, width, generator=gen)
    logits = host.cuda()
    lengths = torch.tensor(
        [[width - 9_000 * r - next_n + 1 + j for j in range(next_n)] for r in range(requests)],
        dtype=torch.int32,
    )
    seq = lengths.cuda()
    ref = rs8_ref.topk_decode_ref(host, next_n, lengths, k)
    out = torch.full((rows, k), POISON, dtype=torch.int32, device="cuda")
    workspace = torch.zeros(2**20, dtype=torch.uint8, device="cuda")
    max_len = int(lengths.max())
    calls = {
        "top_k_per_row_decode": lambda: ops.top_k_per_row_decode(
            logits, next_n, seq, out, rows, width, 1, k
        ),
        "persistent_topk": lambda: ops.persistent_topk(logits, seq, out, workspace, k, max_len),
        "cooperative_topk": lambda: ops.cooperative_topk(logits, seq, out, workspace, k, max_len),
    }

    def result(name: str) -> torch.Tensor:
        out.fill_(POISON)
        calls[name]()
        torch.cuda.synchronize()
        return out.cpu()

    launches: list[str] = []
    launch = rs8_op.launch

    def counted(*args: object, **kwargs: object) -> None:
        launches.append("rs8")
        launch(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(rs8_op, "launch", counted)
    in_vllm_order = []
    for name in calls:  # vLLM's kernels: the same sets, in vLLM's order, and no rs8 launch
        got = result(name)
        assert torch.equal(got.sort(dim=1).values, ref.sort(dim=1).values), name
        in_vllm_order.append(not torch.equal(got, ref))
    assert launches == [] and any(in_vllm_order)

    assert sorted(rs8_vllm.register(namespace="rs8vb")) == sorted(calls)
    assert sorted(rs8_vllm.register(namespace="rs8vb")) == sorted(calls)  # idempotent
    for name in calls:  # now every call is rs8's, with rs8's bytes
        before = len(launches)
        assert torch.equal(result(name), ref), name
        assert len(launches) == before + 1, name

    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        calls["top_k_per_row_decode"]()  # warm-up outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        calls["top_k_per_row_decode"]()
    host2 = torch.randn(rows, width, generator=gen)
    logits.copy_(host2)
    out.fill_(POISON)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), rs8_ref.topk_decode_ref(host2, next_n, lengths, k))
