"""The metric of a start: arithmetic over Prometheus counter deltas and the workload's JSON.

Why an expression: the metric our users publish for the region cache is the server's time
outside queueing and prefill, which vLLM does not export as one series; it is
``vllm:e2e_request_latency_seconds_sum - vllm:request_queue_time_seconds_sum -
vllm:request_prefill_time_seconds_sum`` (optionally divided by a ``_count``), each taken as
the change over the workload (after minus before), summed over label sets.
``json:KEY`` names a number in the JSON object the workload prints last on stdout.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

_TOKEN = re.compile(r"\s*(?:(?P<num>\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)|(?P<json>json:[A-Za-z0-9_.\-]+)"
                    r"|(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)|(?P<op>[-+*/()]))")
_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?P<labels>\{.*\})?\s+(?P<value>\S+)")


class MetricError(ValueError):
    """A metric expression that does not parse, or a value it needs that is missing."""


@dataclass(frozen=True)
class Expr:
    """A parsed metric expression: evaluate it with ``value``."""

    text: str
    series: tuple[str, ...]  # Prometheus series it reads (as deltas)
    json_keys: tuple[str, ...]  # workload JSON keys it reads
    _eval: Callable[[Mapping[str, float], Mapping[str, float]], float]

    def value(self, deltas: Mapping[str, float], workload: Mapping[str, float]) -> float:
        """The metric for one start; a missing series or key raises MetricError."""
        result = self._eval(deltas, workload)
        if not math.isfinite(result):
            raise MetricError(f"{self.text} is not finite ({result})")
        return result


def parse(text: str) -> Expr:
    """Parse ``a - b / c``-style arithmetic over series names, ``json:KEY`` and numbers."""
    tokens: list[tuple[str, str]] = []
    pos = 0
    stripped = text.rstrip()
    while pos < len(stripped):
        m = _TOKEN.match(stripped, pos)
        if m is None or m.end() == pos:
            raise MetricError(f"cannot read the metric at {stripped[pos:]!r}")
        kind = m.lastgroup
        assert kind is not None
        tokens.append((kind, m.group(kind)))
        pos = m.end()
    if not tokens:
        raise MetricError("the metric is empty")
    series: list[str] = []
    keys: list[str] = []
    Fn = Callable[[Mapping[str, float], Mapping[str, float]], float]
    at = 0

    def peek() -> tuple[str, str] | None:
        return tokens[at] if at < len(tokens) else None

    def take() -> tuple[str, str]:
        nonlocal at
        tok = peek()
        if tok is None:
            raise MetricError(f"{text!r} ends too early")
        at += 1
        return tok

    def atom() -> Fn:
        kind, val = take()
        if kind == "num":
            number = float(val)
            return lambda d, w: number
        if kind == "name":
            if val.startswith("json:"):
                raise MetricError(f"{text!r}: json: needs a key (json:KEY)")
            series.append(val)
            return lambda d, w: _get(d, val, "Prometheus series")
        if kind == "json":
            key = val.removeprefix("json:")
            keys.append(key)
            return lambda d, w: _get(w, key, "workload JSON key")
        if val == "(":
            inner = expr()
            if take() != ("op", ")"):
                raise MetricError(f"{text!r}: missing ')'")
            return inner
        if val == "-":
            sub = atom()
            return lambda d, w: -sub(d, w)
        raise MetricError(f"{text!r}: unexpected {val!r}")

    def term() -> Fn:
        left = atom()
        while (tok := peek()) is not None and tok[1] in ("*", "/"):
            take()
            right = atom()
            left = _binary(tok[1], left, right)
        return left

    def expr() -> Fn:
        left = term()
        while (tok := peek()) is not None and tok[1] in ("+", "-"):
            take()
            right = term()
            left = _binary(tok[1], left, right)
        return left

    fn = expr()
    if at != len(tokens):
        raise MetricError(f"{text!r}: unexpected {tokens[at][1]!r}")
    return Expr(text, tuple(dict.fromkeys(series)), tuple(dict.fromkeys(keys)), fn)


def _get(values: Mapping[str, float], key: str, what: str) -> float:
    if key not in values:
        raise MetricError(f"metric missing: {what} {key!r} was not reported")
    return values[key]


def _binary(op: str, left: Callable[[Mapping[str, float], Mapping[str, float]], float],
            right: Callable[[Mapping[str, float], Mapping[str, float]], float]
            ) -> Callable[[Mapping[str, float], Mapping[str, float]], float]:
    def apply(d: Mapping[str, float], w: Mapping[str, float]) -> float:
        a, b = left(d, w), right(d, w)
        if op == "+":
            return a + b
        if op == "-":
            return a - b
        if op == "*":
            return a * b
        if b == 0:
            raise MetricError("metric divides by zero (did the workload send any request?)")
        return a / b
    return apply


def parse_prometheus(text: str) -> dict[str, float]:
    """Prometheus text format -> series name -> value, summed over label sets."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        try:
            value = float(m.group("value"))
        except ValueError:
            continue
        out[m.group("name")] = out.get(m.group("name"), 0.0) + value
    return out


def deltas(before: Mapping[str, float], after: Mapping[str, float],
           names: tuple[str, ...]) -> dict[str, float]:
    """after - before for each named series present after the workload (absent before: 0)."""
    return {n: after[n] - before.get(n, 0.0) for n in names if n in after}


def workload_json(stdout: str) -> dict[str, float]:
    """The numbers in the last JSON object the workload printed (one per line), if any."""
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                return {str(k): float(v) for k, v in obj.items()
                        if isinstance(v, int | float) and not isinstance(v, bool)}
    return {}
