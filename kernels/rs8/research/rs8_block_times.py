"""Wall-clock stamps of every block of rs8's kernel (a -DRS8_TSTAMP build), last call of a graph.

Why: RS8_MARK's clock64 is per SM and taken by warp 0 of row 0 only, so it cannot say
when clusters start against each other, which cluster ends last, how much of a call
lies between kernels, or which warp holds up a block barrier. The globaltimer stamps
(32 ns steps on the H200) can: every block stamps its stages, and every warp stamps
the collect step (its start after the threshold barrier, its end, and the next
barrier's release). Inputs are cycled past the L2 as in bench/rs8_bench.py.

    python3 kernels/rs8/research/rs8_block_times.py --lib /tmp/rs8s/librs8.so \\
        --ctx 112464,191998 --rows 6
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))  # rs8_bench
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))  # rs8_op, rs8_ref
import rs8_op
from rs8_bench import buffers_past_l2, capture_graph, graph_time_us
from rs8_candidates import threads

STAMP_BLOCKS, WARPS = 1024, 32
STAGES = ["prologue", "load+hist", "cluster wait+threshold", "collect", "sort+exchange", "rank"]
K = 512


def cluster_size(rows: int) -> int:
    """Blocks per row the launcher picks on the H200 (16 up to 6 rows, 8 up to 12, else 4)."""
    return 16 if rows <= 6 else (8 if rows <= 12 else 4)


def quantiles(values: list[float]) -> tuple[float, float]:
    """Median and 90th percentile."""
    ordered = sorted(values)
    return statistics.median(ordered), ordered[int(0.9 * (len(ordered) - 1))]


def probe(lib: ctypes.CDLL, rows: int, ctx: int, replays: int) -> dict[str, object]:
    """Per-call time and stamp statistics for one row shape (medians over replays)."""
    seq = torch.full((rows, 1), ctx, dtype=torch.int32, device="cuda")
    out = torch.empty((rows, K), dtype=torch.int32, device="cuda")
    nbuf = buffers_past_l2(rows * ctx * 4)
    bufs = [torch.randn(rows, ctx, device="cuda") for _ in range(nbuf)]

    def fn(i: int) -> None:
        rs8_op.launch(bufs[i], 1, seq, out, rows, ctx, 1, K, True, lib=lib)

    per_call = graph_time_us(fn, nbuf, 15)
    graph, _ = capture_graph(fn, nbuf, 32)  # its last call leaves the stamps
    blocks = (ctypes.c_ulonglong * (STAMP_BLOCKS * 8))()
    warps = (ctypes.c_ulonglong * (STAMP_BLOCKS * WARPS * 4))()
    cl = cluster_size(rows)
    nwarps = threads(cl) // 32
    acc: dict[str, list[float]] = {}
    slowest: Counter[int] = Counter()

    def add(name: str, value_ns: float) -> None:
        acc.setdefault(name, []).append(value_ns / 1000.0)

    for _ in range(replays):
        graph.replay()
        torch.cuda.synchronize()
        if lib.rs8_read_stamps(ctypes.addressof(blocks), ctypes.addressof(warps)) != 0:
            raise SystemExit("rs8_read_stamps failed")
        t = [[blocks[b * 8 + i] for i in range(8)] for b in range(rows * cl)]
        if any(0 in x[:7] for x in t):
            raise SystemExit(f"rows={rows} ctx={ctx}: a block left no stamps (general path?)")
        first = min(x[0] for x in t)
        add("kernel span", max(x[6] for x in t) - first)
        add("entry spread, all blocks", max(x[0] for x in t) - first)
        durations = []
        for c in range(rows):
            blk = t[c * cl : (c + 1) * cl]
            durations.append(max(x[6] for x in blk) - min(x[0] for x in blk))
        add("cluster duration, mean", statistics.mean(durations))
        add("cluster duration, max", max(durations))
        for b, x in enumerate(t):
            for i, name in enumerate(STAGES):
                add(name, x[i + 1] - x[i])
            w = [[warps[(b * WARPS + j) * 4 + i] for i in range(4)] for j in range(nwarps)]
            arrive, leave, done, after = zip(*w, strict=True)
            collect = [d - s for d, s in zip(done, leave, strict=True)]
            add("threshold: warp 0 after the first warp at the barrier", w[0][0] - min(arrive))
            add("threshold: last warp after warp 0 at the barrier", max(arrive) - w[0][0])
            add("collect per warp, median", statistics.median(collect))
            add("collect per warp, slowest", max(collect))
            add("collect barrier: last warp done -> release", min(after) - max(done))
            slowest[collect.index(max(collect))] += 1
    result: dict[str, object] = {"rows": rows, "ctx": ctx, "per_call_us": per_call}
    span = statistics.median(acc["kernel span"])
    result["gap_per_call_us"] = per_call - span
    result["stats"] = {name: quantiles(v) for name, v in acc.items()}
    result["slowest_collect_warp"] = dict(sorted(slowest.items()))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lib", required=True, help="a librs8.so built with -DRS8_TSTAMP")
    parser.add_argument("--ctx", default="112464,191998")
    parser.add_argument("--rows", default="6")
    parser.add_argument("--replays", type=int, default=30)
    parser.add_argument("--json", help="write the results here as well")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("rs8_block_times.py: needs a CUDA GPU and a librs8.so build; torch sees no GPU")
    lib = rs8_op.open_library(args.lib)
    lib.rs8_read_stamps.restype = ctypes.c_int
    lib.rs8_read_stamps.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    results = []
    for rows in (int(r) for r in args.rows.split(",")):
        for ctx in (int(c) for c in args.ctx.split(",")):
            r = probe(lib, rows, ctx, args.replays)
            results.append(r)
            print(
                f"rows={rows} ctx={ctx}: {r['per_call_us']:.2f} µs per call, of which"
                f" {r['gap_per_call_us']:.2f} between kernels (per call minus the span)"
            )
            stats = r["stats"]
            assert isinstance(stats, dict)
            for name, (med, p90) in stats.items():
                print(f"  {name:55s} {med:6.3f} µs (p90 {p90:.3f})")
            print(f"  slowest warp in the collect (blocks): {r['slowest_collect_warp']}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
