#!/usr/bin/env python3
"""Build an expert plan (which routed experts stay on the CPU) from routing-count traces.

Method: frequency placement, as ktransformers' `frequency` strategy places
experts: the experts that route the most tokens stay on the GPU, the least-routed go to
the CPU, exactly ``budget`` of them. DeepSeek's EPLB greedy packing solves another problem
(balancing load across GPUs, with replicas); with one CPU pool and one GPU pool the share
of routed tokens served by GPU experts is maximized by taking the most-routed experts
first, which is what this does.

Inputs (any number of trace files, summed), format ``frank-routing-counts/1`` (README.md):

    {"format": "frank-routing-counts/1",
     "counts": {"<layer>": [tokens of expert 0, 1, ...]  or  {"<expert>": tokens, ...}}}

Usage:

    plan.py --out PLAN --layers 40 --experts 384 --cpu-experts 5296 [--split global] TRACE...
    plan.py ... --cpu-bytes B --expert-bytes S ...   (budget B / S experts, exactly)

``--split global`` picks the least-routed experts over all layers; ``--split even`` keeps
each layer's CPU count as the published plan does (budget // layers, one more in the first
budget % layers layers) and picks the least-routed inside each layer. Ties: among experts
with equal token counts the one with the lower (layer, expert) index stays on the GPU (so
the CPU takes ties from the highest indices). A bad input is one line ``FILE: FIELD:
message`` (or ``--option: message``) on stderr, exit 2, and nothing written.

Standard library only: frank runs it as a derived part's program (parts/expert-plan/).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

FORMAT_IN = "frank-routing-counts/1"
FORMAT_OUT = "frank-expert-plan/1"
METHOD = "frequency placement (most-routed experts on the GPU), as ktransformers places experts"
TIE_BREAK = "equal token counts: the lower (layer, expert) index stays on the GPU"


class Bad(Exception):
    """One bad input: where (file and field, or an option) and why."""


def _count(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise Bad(f"{where}: {json.dumps(value)} is not a whole number of tokens")
    if value < 0:
        raise Bad(f"{where}: {value} is negative")
    return value


def _index(text: str, limit: int, what: str, where: str) -> int:
    if not (text.isdigit() and (text == "0" or not text.startswith("0"))) \
            or int(text) >= limit:
        raise Bad(f"{where}: {what} {text} is not in the model ({what}s 0-{limit - 1})")
    return int(text)


def read_trace(path: str, layers: int, experts: int, into: list[list[int]]) -> str:
    """Add one trace's counts into ``into``; return the file's sha256."""
    raw = open(path, "rb").read()
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise Bad(f"{path}: not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT_IN:
        got = doc.get("format") if isinstance(doc, dict) else None
        raise Bad(f"{path}: format: {json.dumps(got)}, expected {json.dumps(FORMAT_IN)}")
    counts = doc.get("counts")
    if not isinstance(counts, dict):
        raise Bad(f"{path}: counts: an object of layers is required")
    for key, row in counts.items():
        layer = _index(key, layers, "layer", f"{path}: counts.{key}")
        where = f"{path}: counts.{key}"
        if isinstance(row, list):
            if len(row) > experts:
                raise Bad(f"{where}[{experts}]: expert {experts} is not in the model "
                          f"({len(row)} counts, experts 0-{experts - 1})")
            if len(row) < experts:
                raise Bad(f"{where}: {len(row)} counts, the model has {experts} experts "
                          "per layer (list every expert, or give an object of them)")
            for e, value in enumerate(row):
                into[layer][e] += _count(value, f"{where}[{e}]")
        elif isinstance(row, dict):
            for ekey, value in row.items():
                e = _index(ekey, experts, "expert", f"{where}.{ekey}")
                into[layer][e] += _count(value, f"{where}.{ekey}")
        else:
            raise Bad(f"{where}: a list of counts or an object of experts is required")
    return hashlib.sha256(raw).hexdigest()


def place(totals: list[list[int]], budget: int, split: str) -> list[list[int]]:
    """The CPU experts of each layer, sorted (see the module docstring for the rule)."""
    layers, experts = len(totals), len(totals[0])
    # GPU preference order: most tokens first, then lower (layer, expert) index
    def rank(le: tuple[int, int]) -> tuple[int, int, int]:
        return (-totals[le[0]][le[1]], le[0], le[1])

    cpu: list[list[int]] = [[] for _ in range(layers)]
    if split == "global":
        order = sorted(((l, e) for l in range(layers) for e in range(experts)), key=rank)
        for l, e in order[len(order) - budget:]:
            cpu[l].append(e)
    else:
        for l in range(layers):
            quota = budget // layers + (1 if l < budget % layers else 0)
            order = sorted(((l, e) for e in range(experts)), key=rank)
            cpu[l] = [e for _, e in order[experts - quota:]]
    return [sorted(x) for x in cpu]


def build(args: argparse.Namespace) -> dict[str, object]:
    layers, experts = args.layers, args.experts
    if layers <= 0:
        raise Bad(f"--layers: {layers} is not a positive number of layers")
    if experts <= 0:
        raise Bad(f"--experts: {experts} is not a positive number of experts")
    total_experts = layers * experts
    if args.cpu_experts is not None:
        if args.cpu_bytes is not None or args.expert_bytes is not None:
            raise Bad("--cpu-experts: give the budget in experts or in bytes, not both")
        budget, option = args.cpu_experts, "--cpu-experts"
    elif args.cpu_bytes is not None and args.expert_bytes is not None:
        if args.expert_bytes <= 0:
            raise Bad(f"--expert-bytes: {args.expert_bytes} is not a positive size")
        if args.cpu_bytes % args.expert_bytes:
            raise Bad(f"--cpu-bytes: {args.cpu_bytes} is not a whole number of experts of "
                      f"{args.expert_bytes} bytes")
        budget, option = args.cpu_bytes // args.expert_bytes, "--cpu-bytes"
    else:
        raise Bad("--cpu-experts: a budget is required (--cpu-experts, or --cpu-bytes with "
                  "--expert-bytes)")
    if budget < 0:
        raise Bad(f"{option}: {budget} experts is below zero")
    if budget > total_experts:
        raise Bad(f"{option}: {budget} experts is more than the model's {total_experts} "
                  f"routed experts ({layers} layers x {experts})")
    if not args.traces:
        raise Bad("traces: at least one trace file is required")
    totals = [[0] * experts for _ in range(layers)]
    hashes = [{"file": os.path.basename(t), "sha256": read_trace(t, layers, experts, totals)}
              for t in args.traces]
    tokens = sum(map(sum, totals))
    if tokens == 0:
        raise Bad(f"{args.traces[0]}: counts: the traces route no tokens at all")
    cpu = place(totals, budget, args.split)
    gpu_tokens = tokens - sum(totals[l][e] for l in range(layers) for e in cpu[l])
    per_layer = []
    for l in range(layers):
        layer_tokens = sum(totals[l])
        on_cpu = sum(totals[l][e] for e in cpu[l])
        per_layer.append(round((layer_tokens - on_cpu) / layer_tokens, 6) if layer_tokens
                         else None)
    assert sum(map(len, cpu)) == budget
    return {
        "format": FORMAT_OUT, "method": METHOD, "tie_break": TIE_BREAK, "split": args.split,
        "layers": layers, "experts_per_layer": experts, "cpu_total": budget,
        "cpu_experts": {str(l): cpu[l] for l in range(layers)},
        "coverage": {"gpu_share": round(gpu_tokens / tokens, 6), "per_layer": per_layer,
                     "tokens": tokens, "gpu_tokens": gpu_tokens},
        "inputs": hashes,
    }


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--experts", type=int, required=True)
    p.add_argument("--cpu-experts", type=int)
    p.add_argument("--cpu-bytes", type=int)
    p.add_argument("--expert-bytes", type=int)
    p.add_argument("--split", choices=("global", "even"), default="global")
    p.add_argument("traces", nargs="*")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse(argv)
    try:
        plan = build(args)
    except Bad as exc:
        print(exc, file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"{exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    text = json.dumps(plan, sort_keys=True, indent=1) + "\n"
    tmp = args.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
