"""`frank trial render`: one Kubernetes Job per sealed start, and `frank trial record` taking
the results back from those Jobs' logs. The Jobs are validated offline (kubernetes-validate
--strict); their workload program (the driver) is run here for real against a stand-in
engine on 127.0.0.1, as it runs beside the engine in the Job's pod. No cluster is run."""

from __future__ import annotations

import http.server
import json
import os
import shlex
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.k8s_helpers import docs, kubernetes_validate, lock_digest, pushed
from tests.spine_helpers import frank, snapshot

TRIAL = "k8s-ab"
METRIC = "vllm:e2e_request_latency_seconds_sum"


class Engine(http.server.BaseHTTPRequestHandler):
    """/health, /metrics and /bump (a request costing the current arm's latency)."""

    arm = "A"
    latency = 0.0
    started = 1.7e9

    def do_GET(self) -> None:
        if self.path == "/bump":
            Engine.latency += 2.0 if Engine.arm == "A" else 1.0
        body = (f"# TYPE x counter\n{METRIC}{{model=\"m\"}} {Engine.latency}\n"
                f"process_start_time_seconds {Engine.started}\n"
                if self.path == "/metrics" else "ok\n").encode()
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def engine() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


WORKLOAD = (f"{shlex.quote(sys.executable)} -c \"import os, urllib.request; urllib.request."
            "urlopen(os.environ['FRANK_TRIAL_BASE_URL'] + '/bump').read(); "
            "print('{\\\"requests\\\": 1}')\"")


def planned(repo: Path) -> tuple[str, dict[str, str]]:
    res = frank("trial", "plan", "served", "candidate", "--name", TRIAL, "--metric", METRIC,
                "--direction", "lower", "--blocks", "5", "--seed", "7", "--seal", cwd=repo)
    assert res.code == 0, res.err
    images = {"A": pushed(repo, "served", lock_digest(repo, "served")),
              "B": pushed(repo, "candidate", lock_digest(repo, "candidate"))}
    return tomllib.loads((repo / "trials" / f"{TRIAL}.toml").read_text())["seal"]["hash"], \
        images


def test_trial_renders_one_valid_job_per_sealed_start(repo: Path, tmp_path: Path) -> None:
    seal, images = planned(repo)
    out = tmp_path / "jobs"
    res = frank("trial", "render", TRIAL, "--workload", WORKLOAD, "--out", str(out),
                "--node", "gpu-node-1", cwd=repo)
    assert res.code == 0, res.err
    valid = kubernetes_validate(*sorted(out.iterdir()))
    assert valid.code == 0, valid.out + valid.err
    objs = docs(out)
    claims = [o for o in objs if o["kind"] == "PersistentVolumeClaim"]
    jobs = sorted((o for o in objs if o["kind"] == "Job"), key=lambda o: o["metadata"]["name"])
    assert {c["metadata"]["name"] for c in claims} == {"served-weights", "candidate-weights"}
    order = tomllib.loads((repo / "trials" / f"{TRIAL}.toml").read_text())["order"]
    assert len(jobs) == len(order) == 10
    for job, start in zip(jobs, order, strict=True):
        notes = job["metadata"]["annotations"]
        assert job["metadata"]["name"] == f"{TRIAL}-start-{start['start']:03d}"
        assert notes["frank.dev/trial-digest"] == seal
        assert notes["frank.dev/start"] == str(start["start"])
        assert notes["frank.dev/block"] == str(start["block"])
        assert notes["frank.dev/arm"] == start["arm"]
        assert notes["frank.dev/order"] == f"{start['start']}/10"
        assert notes["frank.dev/image-digest"] == images[start["arm"]]
        assert job["spec"]["backoffLimit"] == 0
        pod = job["spec"]["template"]["spec"]
        assert pod["restartPolicy"] == "Never"
        assert pod["nodeSelector"]["kubernetes.io/hostname"] == "gpu-node-1"
        weights, eng = pod["initContainers"]
        assert "--fetch-only" in weights["args"]
        assert eng["name"] == "engine" and eng["restartPolicy"] == "Always"  # a sidecar
        assert eng["image"].endswith("@" + images[start["arm"]])
        env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
        assert env["FRANK_TRIAL_SERIES"] == METRIC and env["FRANK_TRIAL_WORKLOAD"] == WORKLOAD


def run_jobs(jobs: list[dict], base_url: str, logs: Path) -> None:
    """Each Job's workload container, in order, as its pod would run it (its program and
    env from the rendered Job; the engine is the stand-in on base_url)."""
    logs.mkdir()
    for job in jobs:
        container = job["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e["value"] for e in container["env"]}
        env["FRANK_TRIAL_BASE_URL"] = base_url
        Engine.arm = env["FRANK_TRIAL_ARM"]
        assert container["command"][:2] == ["python3", "-c"]
        proc = subprocess.run([sys.executable, "-c", container["command"][2]],
                              env={**os.environ, **env}, capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 0, proc.stderr
        (logs / f"{job['metadata']['name']}.log").write_text(
            "2026-12-02T00:00:00Z some engine chatter\n" + proc.stdout)


def rewrite(log: Path, **change: object) -> None:
    lines = log.read_text().splitlines()
    mark = "frank-trial-result "
    for i, line in enumerate(lines):
        if line.startswith(mark):
            data = json.loads(line[len(mark):])
            data.update(change)
            lines[i] = mark + json.dumps(data)
    log.write_text("\n".join(lines) + "\n")


def test_trial_record_takes_results_back_from_job_logs(repo: Path, tmp_path: Path,
                                                       engine: str) -> None:
    _, images = planned(repo)
    out = tmp_path / "jobs"
    assert frank("trial", "render", TRIAL, "--workload", WORKLOAD, "--out", str(out),
                 cwd=repo).code == 0
    jobs = sorted((o for o in docs(out) if o["kind"] == "Job"),
                  key=lambda o: o["metadata"]["name"])
    logs = tmp_path / "logs"
    run_jobs(jobs, engine, logs)
    results = repo / "trials" / f"{TRIAL}.results.jsonl"

    # wrong inputs first: each refused in one line naming the file, nothing written
    first = logs / f"{TRIAL}-start-001.log"
    second = logs / f"{TRIAL}-start-002.log"
    good1, good2 = first.read_text(), second.read_text()
    cases = [
        (first, {"digest": "sha256:" + "1" * 64}, "ran under seal"),
        (first, {"metrics_after": f"{METRIC} 9\nprocess_start_time_seconds 5"},
         "the engine restarted during the workload"),
        (first, {"status": "crash", "error": "workload exited with code 3: boom"},
         "crashed in its Job: workload exited with code 3"),
        (first, {"lock_digest": "sha256:" + "2" * 64}, "lock changed since sealing"),
        (second, {"started": "2026-01-01T00:00:00.000000Z"}, "must run one at a time"),
    ]
    for log, change, message in cases:
        rewrite(log, **change)
        before = snapshot(repo / "trials")
        res = frank("trial", "record", TRIAL, str(logs), cwd=repo)
        assert res.code == 2 and message in res.err, (change, res.err)
        assert len(res.err.strip().splitlines()) == 1 and log.name in res.err
        assert snapshot(repo / "trials") == before and not results.exists()
        first.write_text(good1)
        second.write_text(good2)
    (logs / "stray.log").write_text("no result here\n")
    res = frank("trial", "record", TRIAL, str(logs), cwd=repo)
    assert res.code == 2 and "stray.log" in res.err and "no frank-trial-result line" in res.err
    (logs / "stray.log").unlink()

    res = frank("trial", "record", TRIAL, str(logs), cwd=repo)
    assert res.code == 0, res.err
    assert "recorded 10 start(s)" in res.out
    rows = [json.loads(x) for x in results.read_text().splitlines()]
    for arm in ("A", "B"):
        assert {r["image"] for r in rows if r["arm"] == arm} == {images[arm]}
    assert {r["source"] for r in rows} == {"record:logs"}
    assert {r["value"] for r in rows if r["arm"] == "A"} == {2.0}
    assert {r["value"] for r in rows if r["arm"] == "B"} == {1.0}
    again = frank("trial", "record", TRIAL, str(logs), cwd=repo)
    assert again.code == 2 and "already has a result" in again.err
    decision = frank("trial", "decide", TRIAL, "--json", cwd=repo)
    assert decision.code == 0, decision.err
    verdict = json.loads(decision.out)
    assert verdict["passed"] is True and verdict["images"] == images
