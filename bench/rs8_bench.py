"""Time rs8 against vLLM's decode top-k kernels and torch.topk by CUDA-graph replay.

Why this shape: the served case is one decode step of next_n = 6 rows per request
(MTP), k = 512, at long contexts; the padded logits width (vLLM's max_model_len)
changes which vLLM path runs, so each length is timed at a tight width and at
262,144. Each graph holds many calls cycling over input buffers that together
exceed the 60 MB L2, so the numbers are not L2-resident replays (`--l2-resident`
times every call on one buffer instead: the case where the logits were just
written by the kernel before, as in the served decode step). Every config
also checks exactness: rs8 and every --variant build byte-identical to the CPU
reference, and each vLLM kernel the same set as the reference on rows whose cutoff
has no exact tie.

    python3 bench/rs8_bench.py --vllm-lib /tmp/rs8vb/rs8vb.so --out results.md
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "kernels" / "rs8" / "python"))

import rs8_op  # noqa: E402
import rs8_ref  # noqa: E402

NEXT_N = 6
L2_SPAN = 160 * 2**20  # bytes of inputs cycled per graph, > 2x the H200's L2
Launch = Callable[[int], None]


def buffers_past_l2(nbytes: int) -> int:
    """Input buffers of nbytes each to cycle so that a graph's calls do not run from the L2."""
    return max(2, min(32, math.ceil(L2_SPAN / nbytes)))


def capture_graph(fn: Launch, nbuf: int, min_calls: int) -> tuple[torch.cuda.CUDAGraph, int]:
    """A CUDA graph of >= min_calls calls of fn cycling over nbuf buffers, and its call count."""
    calls = nbuf * math.ceil(min_calls / nbuf)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for i in range(nbuf):
            fn(i)  # warm-up: attributes, workspaces, lazy module loads
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for i in range(calls):
            fn(i % nbuf)
    return graph, calls


def graph_time_us(fn: Launch, nbuf: int, replays: int, min_calls: int = 24) -> float:
    """Median µs per call over graph replays of >= min_calls calls that cycle the buffers."""
    graph, calls = capture_graph(fn, nbuf, min_calls)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / calls)
    return statistics.median(times)


def copy_bandwidth() -> float:
    """Device copy bandwidth in bytes/s, counting bytes read plus written."""
    a = torch.empty(2**28, dtype=torch.float32, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    times = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1000.0)
    return 2 * a.numel() * 4 / statistics.median(times)


def no_tie_at_cutoff(row: torch.Tensor, k: int) -> bool:
    keys = rs8_ref.float_keys(row)
    if keys.numel() <= k:
        return True
    top = torch.topk(keys, k + 1).values
    return bool(top[k - 1] != top[k])


def request_lengths(ctx: int, requests: int) -> list[int]:
    """Row lengths of `requests` decode steps at context ctx: next_n rows each, ctx-5 .. ctx."""
    return [ctx - NEXT_N + 1 + j for _ in range(requests) for j in range(NEXT_N)]


def tight_width(ctx: int) -> int:
    """The tight logits width for context ctx: ctx rounded up to 4 columns."""
    return 4 * math.ceil(ctx / 4)


def open_builds(specs: list[str]) -> dict[str, ctypes.CDLL]:
    """librs8 builds named on the command line as NAME=PATH, opened, by name."""
    return {name: rs8_op.open_library(path) for name, path in (s.split("=", 1) for s in specs)}


def run_config(
    requests: int,
    ctx: int,
    width: int,
    k: int,
    vllm: bool,
    replays: int,
    variants: dict[str, ctypes.CDLL] | None = None,
    l2_resident: bool = False,
) -> dict[str, object]:
    rows = NEXT_N * requests
    lengths = request_lengths(ctx, requests)
    seq2d = torch.tensor(lengths, dtype=torch.int32, device="cuda").reshape(requests, NEXT_N)
    nbuf = 1 if l2_resident else buffers_past_l2(rows * width * 4)
    bufs = [torch.randn(rows, width, device="cuda") for _ in range(nbuf)]
    out = torch.full((rows, k), -1, dtype=torch.int32, device="cuda")
    ws = torch.zeros(2**20, dtype=torch.uint8, device="cuda")
    max_len = max(lengths)

    fns: dict[str, Launch] = {
        "rs8": lambda i: rs8_op.launch(bufs[i], 1, seq2d, out, rows, width, 1, k, True),
    }
    if vllm:
        ops = torch.ops.rs8vb
        fns["cooperative_topk"] = lambda i: ops.cooperative_topk(
            bufs[i], seq2d, out, ws, k, max_len
        )
        fns["persistent_topk"] = lambda i: ops.persistent_topk(bufs[i], seq2d, out, ws, k, max_len)
        fns["top_k_per_row_decode"] = lambda i: ops.top_k_per_row_decode(
            bufs[i], NEXT_N, seq2d, out, rows, width, 1, k
        )
    fns["torch.topk"] = lambda i: torch.topk(bufs[i][:, :max_len], k, dim=1)
    for vname, vlib in (variants or {}).items():
        fns[vname] = lambda i, vlib=vlib: rs8_op.launch(
            bufs[i],
            1,
            seq2d,
            out,
            rows,
            width,
            1,
            k,
            True,
            lib=vlib,  # type: ignore[arg-type]
        )

    # Exactness on buffer 0.
    ref = rs8_ref.topk_decode_ref(bufs[0].cpu(), NEXT_N, seq2d.cpu(), k)
    checks: dict[str, str] = {}
    for name in ["rs8", *(variants or {})]:  # every rs8 build against the reference
        out.fill_(-7)
        fns[name](0)
        torch.cuda.synchronize()
        checks[name] = "byte-identical" if torch.equal(out.cpu(), ref) else "MISMATCH"
    host = bufs[0].cpu()
    for name in ("cooperative_topk", "persistent_topk", "top_k_per_row_decode"):
        if name not in fns:
            continue
        out.fill_(-7)
        fns[name](0)
        torch.cuda.synchronize()
        got = out.cpu()
        same = compared = 0
        for r in range(rows):
            if not no_tie_at_cutoff(host[r, : lengths[r]], k):
                continue
            compared += 1
            same += int(torch.equal(got[r].sort().values, ref[r].sort().values))
        checks[name] = f"same set {same}/{compared}"

    times = {name: graph_time_us(fn, nbuf, replays) for name, fn in fns.items()}
    bufs.clear()
    torch.cuda.empty_cache()
    return {
        "requests": requests,
        "rows": rows,
        "ctx": ctx,
        "width": width,
        "bytes": sum(lengths) * 4 + rows * k * 4,
        "us": times,
        "checks": checks,
    }


def launch_cost_us(replays: int) -> dict[str, float]:
    """Per-call cost of near-empty work in a graph: the launch part of the floor."""
    tiny = torch.zeros(1, device="cuda")
    seq = torch.ones((6, 1), dtype=torch.int32, device="cuda")
    out = torch.empty((6, 512), dtype=torch.int32, device="cuda")
    logits = torch.zeros((6, 512), device="cuda")
    return {
        "1-element fill_": graph_time_us(lambda i: tiny.fill_(1.0), 1, replays),
        "rs8 on rows of length 1": graph_time_us(
            lambda i: rs8_op.launch(logits, 1, seq, out, 6, 512, 1, 512, True), 1, replays
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--vllm-lib", type=Path, help="rs8vb.so from build_vllm_topk.py")
    parser.add_argument("--out", type=Path, help="write a markdown table here")
    parser.add_argument("--json", type=Path, help="write raw results here")
    parser.add_argument("--requests", default="1,2,4,8")
    parser.add_argument("--lengths", default="112464,131072,150000,169449,191998")
    parser.add_argument("--wide", type=int, default=262_144)
    parser.add_argument("--k", type=int, default=512)
    parser.add_argument("--replays", type=int, default=15)
    parser.add_argument(
        "--variant", action="append", default=[], help="NAME=PATH: time another librs8 build"
    )
    parser.add_argument(
        "--l2-resident",
        action="store_true",
        help="every call on one input buffer (warm L2), not cycled past the L2",
    )
    args = parser.parse_args()
    variants = open_builds(args.variant)

    vllm = False
    if args.vllm_lib and args.vllm_lib.is_file():
        torch.ops.load_library(str(args.vllm_lib))
        vllm = True
    gpu = torch.cuda.get_device_name()
    bw = copy_bandwidth()
    launch = launch_cost_us(args.replays)
    results = []
    for req in (int(x) for x in args.requests.split(",")):
        for ctx in (int(x) for x in args.lengths.split(",")):
            for width in (tight_width(ctx), args.wide):
                res = run_config(
                    req, ctx, width, args.k, vllm, args.replays, variants, args.l2_resident
                )
                results.append(res)
                us = res["us"]
                assert isinstance(us, dict)
                line = " ".join(f"{n}={v:.2f}" for n, v in us.items())
                print(f"req={req} ctx={ctx} width={width} {line} {res['checks']}", flush=True)

    names = list(results[0]["us"].keys())  # type: ignore[union-attr]
    lines = [
        f"GPU: {gpu}; torch {torch.__version__}; date {datetime.date.today().isoformat()}"
        + ("; inputs L2-resident (one buffer)" if args.l2_resident else "; inputs past the L2"),
        f"Command: python3 {' '.join(sys.argv)}",
        f"Copy bandwidth (read+write): {bw / 1e12:.2f} TB/s; launch in graph: "
        + ", ".join(f"{n} {v:.2f} µs" for n, v in launch.items()),
        "",
        "| req | rows | ctx | width | "
        + " | ".join(names)
        + " | floor µs | persistent/rs8 | cooperative/rs8 | exactness |",
        "|" + "---|" * (len(names) + 8),
    ]
    for res in results:
        us = res["us"]
        assert isinstance(us, dict)
        floor = float(res["bytes"]) / bw * 1e6 + launch["1-element fill_"]  # type: ignore[arg-type]
        pr = us["persistent_topk"] / us["rs8"] if "persistent_topk" in us else float("nan")
        cr = us["cooperative_topk"] / us["rs8"] if "cooperative_topk" in us else float("nan")
        cells = " | ".join(f"{us[n]:.2f}" for n in names)
        checks = "; ".join(f"{n}: {c}" for n, c in res["checks"].items())  # type: ignore[union-attr]
        lines.append(
            f"| {res['requests']} | {res['rows']} | {res['ctx']} | {res['width']} | {cells} | "
            f"{floor:.2f} | {pr:.2f} | {cr:.2f} | {checks} |"
        )
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    if args.json:
        blob = {
            "gpu": gpu,
            "bandwidth": bw,
            "launch_us": launch,
            "l2_resident": args.l2_resident,
            "results": results,
        }
        args.json.write_text(json.dumps(blob, indent=1))


if __name__ == "__main__":
    main()
