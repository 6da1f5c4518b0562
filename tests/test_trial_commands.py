"""`frank trial` commands on a repo copy: plan, seal, record, decide, adopt, and run against a
fake engine (a tiny HTTP server with /health and /metrics, started by the real launcher).

Every bad input of issue 7 is checked as one line on stderr with exit 2.
"""

from __future__ import annotations

import csv
import json
import os
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.spine_helpers import Result, frank, processes_mentioning, snapshot
from tests.vllm_server import free_port

FAKE_ENGINE = r'''
"""A fake engine: per-request cost 1.00 s with EXL3_CPU_EXPERTS_SCHED=2, else 1.25 s."""
import json, os, sys, signal
from http.server import BaseHTTPRequestHandler, HTTPServer
crash = os.environ.get("FAKE_CRASH_ONCE")
if crash and os.path.exists(crash):
    os.unlink(crash)
    print("fake engine: crashing on purpose", flush=True)
    sys.exit(3)
port = int(sys.argv[sys.argv.index("--port") + 1])
cost = 1.0 if os.environ.get("EXL3_CPU_EXPERTS_SCHED") == "2" else 1.25
state = {"sum": 0.0, "count": 0}
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def reply(self, body, ctype="text/plain"):
        data = body.encode()
        self.send_response(200); self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data))); self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        if self.path == "/health":
            return self.reply("")
        if self.path == "/metrics":
            return self.reply("# HELP fake_work_seconds work\n"
                              f'fake_work_seconds_sum{{engine="0"}} {state["sum"]}\n'
                              f'fake_work_seconds_count{{engine="0"}} {state["count"]}\n')
        self.send_response(404); self.end_headers()
    def do_POST(self):
        state["sum"] += cost; state["count"] += 1
        self.reply(json.dumps({"ok": True}), "application/json")
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
print("fake engine: serving", port, flush=True)
HTTPServer(("127.0.0.1", port), H).serve_forever()
'''

WORKLOAD = r'''
import json, os, urllib.request
for _ in range(3):
    urllib.request.urlopen(urllib.request.Request(
        os.environ["FRANK_TRIAL_BASE_URL"] + "/work", data=b"{}"), timeout=10).read()
print(json.dumps({"tokens": 42, "arm": os.environ["FRANK_TRIAL_ARM"]}))
'''


def run_frank(*args: str, cwd: Path) -> Result:
    return frank(*args, cwd=cwd)


def host_run(name: str, *args: str, cwd: Path) -> Result:
    """`frank trial run NAME --from host`: the fake engine runs on the host (there is no
    image of it; test_trial_images.py runs arms from their images)."""
    return frank("trial", "run", name, "--from", "host", *args, cwd=cwd)


def one_line_error(result: Result, *needles: str, after_progress: bool = False) -> None:
    """Exit 2 and one error line containing every needle: the only stderr line, or (for
    `run`, which shows progress on stderr first) the last one."""
    assert result.code == 2, (result.code, result.out, result.err)
    lines = result.err.splitlines()
    if not after_progress:
        assert len(lines) == 1, result.err
    line = lines[-1]
    assert line.startswith("frank: error: "), result.err
    for needle in needles:
        assert needle in line, (needle, result.err)


def load(path: Path) -> dict[str, Any]:
    return tomllib.loads(path.read_text())


@pytest.fixture
def smoke(repo: Path) -> Path:
    """A = smoke-cpu without the region cache (a child stack), B = smoke-cpu."""
    (repo / "stacks/nocache.toml").write_text(
        '# smoke-cpu without the region cache\nextends = "smoke-cpu.toml"\n'
        'remove = ["region-cache"]\n')
    return repo


def plan(repo: Path, name: str, *extra: str, design: str = "blocks", seal: bool = True
         ) -> Result:
    args = ["trial", "plan", "stacks/nocache.toml", "stacks/smoke-cpu.toml", "--name", name,
            "--metric", "fake_work_seconds_sum / fake_work_seconds_count",
            "--direction", "lower", "--design", design, "--seed", "5", *extra]
    return run_frank(*args, *(["--seal"] if seal else []), cwd=repo)


def digests(repo: Path, name: str) -> dict[str, str]:
    arms = load(repo / f"trials/{name}.toml")["arms"]
    return {k: v["digest"] for k, v in arms.items()}


def rows_for(repo: Path, name: str, values: dict[str, list[float]]) -> list[dict[str, Any]]:
    """Result rows in the sealed order; values[arm] are used in order of appearance."""
    d = digests(repo, name)
    used = {"A": 0, "B": 0}
    rows = []
    for s in load(repo / f"trials/{name}.toml")["order"]:
        arm = s["arm"]
        rows.append({"start": s["start"], "block": s["block"], "arm": arm, "digest": d[arm],
                     "value": values[arm][used[arm]],
                     "started": f"2026-11-29T08:{s['start']:02d}:00Z"})
        used[arm] += 1
    return rows


def write_json(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps(rows))
    return path


# --- plan and seal ----------------------------------------------------------------------------


def test_plan_writes_digests_metric_design_rule_and_seeded_order(smoke: Path) -> None:
    r = plan(smoke, "rc", "--blocks", "5", seal=False)
    assert r.code == 0, r.err
    t = load(smoke / "trials/rc.toml")
    # the stack's lock as it is now (the committed .lock file may lag a working-tree edit)
    a = json.loads(run_frank("serve", "smoke-cpu", "--print", cwd=smoke).out)["lock_digest"]
    assert t["arms"]["B"] == {"stack": "stacks/smoke-cpu.toml", "digest": a}
    assert t["arms"]["A"]["stack"] == "stacks/nocache.toml" and t["arms"]["A"]["digest"] != a
    assert t["metric"]["direction"] == "lower"
    assert t["design"] | {"rule": ""} == {"kind": "blocks", "blocks": 5, "starts_per_arm": 1,
                                          "alpha": 0.05, "seed": 5, "rule": ""}
    assert "all 5 randomized blocks" in t["design"]["rule"] and "1/32" in t["design"]["rule"]
    assert "seal" not in t
    assert plan(smoke, "rc2", "--blocks", "5", seal=False).code == 0
    assert load(smoke / "trials/rc2.toml")["order"] == t["order"]  # same seed, same order
    assert [s["block"] for s in t["order"]] == [1, 1, 2, 2, 3, 3, 4, 4, 5, 5]


def test_plan_refusals_are_one_line(smoke: Path) -> None:
    one_line_error(plan(smoke, "few", "--blocks", "4"), "--blocks", "too few blocks",
                   "1/16", "need at least 5")
    one_line_error(plan(smoke, "few2", "--starts-per-arm", "2", design="balanced"),
                   "--starts-per-arm", "1/6")
    one_line_error(plan(smoke, "perm", "--blocks", "4", "--alpha", "0.05",
                        design="permutation"), "too few blocks")
    assert plan(smoke, "rc", "--blocks", "5").code == 0
    one_line_error(plan(smoke, "rc", "--blocks", "5"), "already exists",
                   "`frank trial run rc --workload CMD`", "another --name")
    # sealed, nothing run yet: decide says what to run first, not a file that is not there
    one_line_error(run_frank("trial", "decide", "rc", cwd=smoke), "no results yet",
                   "run `frank trial run rc --workload CMD`")
    same = run_frank("trial", "plan", "smoke-cpu", "stacks/smoke-cpu.toml", "--name", "x",
                     "--metric", "m", "--direction", "lower", "--blocks", "5", cwd=smoke)
    one_line_error(same, "same digest")
    bad = run_frank("trial", "plan", "stacks/nocache.toml", "smoke-cpu", "--name", "y",
                    "--metric", "a - (b", "--direction", "lower", "--blocks", "5", cwd=smoke)
    one_line_error(bad, "--metric")
    assert not (smoke / "trials/few.toml").exists() and not (smoke / "trials/y.toml").exists()


def test_seal_then_every_edit_of_the_sealed_part_is_refused(smoke: Path) -> None:
    assert plan(smoke, "rc", "--blocks", "5", seal=False).code == 0
    path = smoke / "trials/rc.toml"
    sealed = run_frank("trial", "seal", "rc", cwd=smoke)
    assert sealed.code == 0, sealed.err
    t = load(path)
    assert t["seal"]["hash"].startswith("sha256:") and t["seal"]["time"].endswith("Z")
    assert path.read_text().startswith("# Trial rc: A (current) = stacks/nocache.toml")
    one_line_error(run_frank("trial", "seal", "rc", cwd=smoke), "already sealed")
    original = path.read_text()
    first_arm = t["order"][0]["arm"]
    other = "B" if first_arm == "A" else "A"
    edits = {
        "design.rule": ("in all 5 randomized blocks", "in 4 of 5 randomized blocks"),
        "design.alpha": ("alpha = 0.05", "alpha = 0.1"),
        "design.blocks": ("blocks = 5", "blocks = 6"),
        "metric.direction": ('direction = "lower"', 'direction = "higher"'),
        "order": (f'{{start = 1, block = 1, arm = "{first_arm}"}}',
                  f'{{start = 1, block = 1, arm = "{other}"}}'),
        "arms.A.digest": (t["arms"]["A"]["digest"], "sha256:" + "0" * 64),
        "subject.change": ('change = "add"', 'change = "remove"'),
        "subject.part": ('part = "region-cache"', 'part = "tiny-llama"'),
    }
    for field, (old, new) in edits.items():
        assert old in original, field
        path.write_text(original.replace(old, new, 1))
        for cmd in (("decide", "rc"), ("run", "rc", "--workload", "true"),
                    ("record", "rc", "nothing.csv")):
            one_line_error(run_frank("trial", *cmd, cwd=smoke), "trials/rc.toml", field,
                           "after sealing")
    moved = original.replace(t["seal"]["time"], "2026-01-01T00:00:00.000000Z")
    path.write_text(moved)
    one_line_error(run_frank("trial", "decide", "rc", cwd=smoke), "seal.hash",
                   "does not match the sealed")
    path.write_text(original)
    one_line_error(run_frank("trial", "decide", "rc", cwd=smoke), "no results yet",
                   "frank trial run rc")  # no results file: the next command, not a path


def test_unsealed_trial_is_refused_by_run_record_and_decide(smoke: Path) -> None:
    assert plan(smoke, "rc", "--blocks", "5", seal=False).code == 0
    for cmd in (("decide", "rc"), ("run", "rc", "--workload", "true"),
                ("record", "rc", "x.csv"), ("adopt", "rc")):
        one_line_error(run_frank("trial", *cmd, cwd=smoke), "trials/rc.toml", "seal",
                       "not sealed")
    one_line_error(run_frank("trial", "decide", "nope", cwd=smoke), "trial file not found")


def test_hand_written_trial_with_too_few_blocks_is_refused(smoke: Path) -> None:
    assert plan(smoke, "rc", "--blocks", "5", seal=False).code == 0
    path = smoke / "trials/rc.toml"
    t = load(path)
    text = path.read_text().replace("blocks = 5", "blocks = 3")
    for s in t["order"]:
        if s["block"] > 3:
            text = text.replace(f'{{start = {s["start"]}, block = {s["block"]}, '
                                f'arm = "{s["arm"]}"}},\n', "")
    path.write_text(text)
    for cmd in (("seal", "rc"), ("decide", "rc")):
        one_line_error(run_frank("trial", *cmd, cwd=smoke), "design.blocks", "too few blocks",
                       "1/8")


# --- record and decide ------------------------------------------------------------------------


def test_record_csv_then_decide_sign_test_five_of_five(smoke: Path) -> None:
    assert plan(smoke, "rc", "--blocks", "5").code == 0
    rows = rows_for(smoke, "rc", {"A": [6.64, 6.93, 6.70, 6.81, 6.77],
                                  "B": [1.16, 1.23, 1.19, 1.20, 1.18]})
    src = smoke / "measured.csv"
    with src.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    rec = run_frank("trial", "record", "rc", str(src), cwd=smoke)
    assert rec.code == 0, rec.err
    out = run_frank("trial", "decide", "rc", "--json", cwd=smoke)
    assert out.code == 0, out.err
    d = json.loads(out.out)
    assert d["p_exact"] == "1/32" and d["p_value"] == pytest.approx(1 / 32)
    assert d["verdict"] == "adopt" and d["statistic"] == "B better in 5 of 5 blocks"
    block1 = next(r for r in rows if r["block"] == 1 and r["arm"] == "A")["value"]
    assert d["rows"][0]["a"] == block1
    assert d["rows"][0]["diff"] == pytest.approx(d["rows"][0]["b"] - block1)
    assert d["rows"][0]["rel"] == pytest.approx((d["rows"][0]["b"] - block1) / block1)
    assert d["mean"]["a"] == pytest.approx((6.64 + 6.93 + 6.70 + 6.81 + 6.77) / 5)
    table = run_frank("trial", "decide", "rc", cwd=smoke)
    assert table.code == 0
    for text in ("block 1", "block 5", "mean", "p = 1/32", "verdict: adopt", "(B - A) / A"):
        assert text in table.out, (text, table.out)


def test_balanced_four_plus_four_decides_one_in_70(smoke: Path) -> None:
    assert plan(smoke, "bal", "--starts-per-arm", "4", design="balanced").code == 0
    rows = rows_for(smoke, "bal", {"A": [6.64, 6.93, 6.70, 6.81], "B": [1.16, 1.23, 1.19, 1.2]})
    assert run_frank("trial", "record", "bal", str(write_json(smoke / "m.json", rows)),
                     cwd=smoke).code == 0
    d = json.loads(run_frank("trial", "decide", "bal", "--json", cwd=smoke).out)
    assert d["p_exact"] == "1/70" and d["verdict"] == "adopt"
    assert d["ranges"] == {"A": [6.64, 6.93], "B": [1.16, 1.23]}
    assert "range 6.64-6.93 -> 1.16-1.23" in d["summary"]
    assert d["mean"]["rel"] == pytest.approx((1.195 - 6.77) / 6.77)


def test_record_refuses_changed_lock_missing_metric_extra_and_wrong_arm(smoke: Path) -> None:
    assert plan(smoke, "rc", "--blocks", "5").code == 0
    good = rows_for(smoke, "rc", {"A": [2.0] * 5, "B": [1.0] * 5})
    before = snapshot(smoke)
    cases = {
        "changed since sealing": [{**good[0], "digest": "sha256:" + "1" * 64}, *good[1:]],
        "metric missing from start 2": [good[0], {**good[1], "value": ""}, *good[2:]],
        "extra start": [*good, {**good[0], "start": 11}],
        "not 'X'": [{**good[0], "arm": "X"}],
    }
    for needle, rows in cases.items():
        one_line_error(run_frank("trial", "record", "rc",
                                 str(write_json(smoke / "bad.json", rows)), cwd=smoke),
                       "bad.json", needle)
    (smoke / "bad.json").unlink()
    assert snapshot(smoke) == before  # a refused import writes nothing
    assert run_frank("trial", "record", "rc", str(write_json(smoke / "ok.json", good[:4])),
                     cwd=smoke).code == 0
    one_line_error(run_frank("trial", "record", "rc", str(smoke / "ok.json"), cwd=smoke),
                   "extra start", "already has a result")


def _results(repo: Path, name: str) -> Path:
    return repo / f"trials/{name}.results.jsonl"


def _jsonl(rows: list[dict[str, Any]], trial: str) -> str:
    return "".join(json.dumps({**r, "trial": trial, "status": r.get("status", "ok")}) + "\n"
                   for r in rows)


def test_decide_refuses_results_that_do_not_match_the_sealed_plan(smoke: Path) -> None:
    assert plan(smoke, "rc", "--blocks", "5").code == 0
    seal_hash = load(smoke / "trials/rc.toml")["seal"]["hash"]
    good = rows_for(smoke, "rc", {"A": [2.0] * 5, "B": [1.0] * 5})
    for r in good:
        r.pop("value")
    vals = [{**r, "value": 2.0 if r["arm"] == "A" else 1.0} for r in good]
    path = _results(smoke, "rc")
    cases = {
        "missing block(s) 5": vals[:8],
        "wrong lock digest": [{**vals[0], "digest": "sha256:" + "2" * 64}, *vals[1:]],
        "extra start: start 3 has more than one result": [*vals, vals[2]],
        "metric missing from start 4": [*vals[:3], {**vals[3], "value": None}, *vals[4:]],
        "sealed order was not followed": [*vals[:5], {**vals[5], "started": "2026-11-29T07"},
                                          *vals[6:]],
        "crashed": [*vals[:9], {**vals[9], "value": None, "status": "crash",
                                "error": "engine exited with code 1"}],
    }
    for needle, rows in cases.items():
        path.write_text(_jsonl(rows, seal_hash))
        one_line_error(run_frank("trial", "decide", "rc", cwd=smoke),
                       "trials/rc.results.jsonl", needle)
    path.write_text(_jsonl(vals, seal_hash))
    d = json.loads(run_frank("trial", "decide", "rc", "--json", cwd=smoke).out)
    assert d["verdict"] == "adopt"
    # a crash followed by a good re-run of the same start is fine, and reported
    crash = {**vals[9], "value": None, "status": "crash", "error": "x"}
    path.write_text(_jsonl([*vals[:9], crash, vals[9]], seal_hash))
    d = json.loads(run_frank("trial", "decide", "rc", "--json", cwd=smoke).out)
    assert d["crashed_starts"] == 1 and d["verdict"] == "adopt"


# --- adopt ------------------------------------------------------------------------------------


def test_adopt_writes_manifest_and_served_stack_with_revert_intact(smoke: Path) -> None:
    # The served stack is arm A (smoke-cpu minus the region cache); B adds the region cache.
    assert plan(smoke, "rc", "--starts-per-arm", "3", design="balanced").code == 0
    rows = rows_for(smoke, "rc", {"A": [6.6, 6.9, 6.7], "B": [1.1, 1.2, 1.3]})
    assert run_frank("trial", "record", "rc", str(write_json(smoke / "m.json", rows)),
                     cwd=smoke).code == 0
    assert run_frank("lock", "stacks/nocache.toml", cwd=smoke).code == 0
    manifest = smoke / "parts/region-cache/1.toml"
    earlier = load(manifest)["evidence"]
    manifest.write_text(manifest.read_text().replace('status = "served"',
                                                     'status = "candidate"'))
    assert run_frank("lock", cwd=smoke).code == 0
    d = digests(smoke, "rc")
    out = run_frank("trial", "adopt", "rc", "--into", "stacks/nocache.toml", cwd=smoke)
    assert out.code == 0, out.err
    assert "adopt" in out.out and "add region-cache 1 into stacks/nocache.toml" in out.out
    m = load(manifest)
    assert m["status"] == "served"
    first, new = m["evidence"]  # the earlier evidence stays, the trial's is appended
    assert first == earlier
    assert new["trial"] == "rc " + load(smoke / "trials/rc.toml")["seal"]["hash"]
    assert "p = 1/20" in new["result"] and "every B start" in new["rule"]
    assert manifest.read_text().count("[revert]") == 1 and "# " not in m["summary"]
    stack_text = (smoke / "stacks/nocache.toml").read_text()
    assert stack_text.startswith("# smoke-cpu without the region cache")
    assert "remove" not in stack_text
    lock = json.loads((smoke / "stacks/nocache.lock").read_text())
    assert lock["digest"] == d["B"]  # exactly the measured candidate
    # smoke-cpu holds the part too: its lock was relocked, so no lock is stale
    assert "relocked" in out.out and "smoke-cpu" in out.out
    assert run_frank("lock", "--check", cwd=smoke).code == 0
    assert run_frank("check", cwd=smoke).code == 0
    hist = (smoke / "stacks/nocache.history.jsonl").read_text().splitlines()
    assert json.loads(hist[-1])["action"] == "adopt:add"
    back = run_frank("revert", "region-cache", "--stack", "stacks/nocache.toml", cwd=smoke)
    assert back.code == 0, back.err
    assert json.loads((smoke / "stacks/nocache.lock").read_text())["digest"] == d["A"]


def test_adopt_a_losing_candidate_held_by_a_stack_keeps_its_status(smoke: Path) -> None:
    # Issue 30's case: region-cache is served (in smoke-cpu, with its 4 + 4 evidence); a
    # weaker trial's "do not adopt" must neither park it nor replace that evidence.
    assert run_frank("lock", cwd=smoke).code == 0
    assert plan(smoke, "rc", "--blocks", "5").code == 0
    rows = rows_for(smoke, "rc", {"A": [1.0, 2.0, 1.0, 1.0, 1.0], "B": [1.5, 1.0, 2, 2, 2]})
    assert run_frank("trial", "record", "rc", str(write_json(smoke / "m.json", rows)),
                     cwd=smoke).code == 0
    manifest = smoke / "parts/region-cache/1.toml"
    earlier = load(manifest)["evidence"]
    stacks = {p.name: p.read_text() for p in (smoke / "stacks").glob("*.toml")}
    out = run_frank("trial", "adopt", "rc", "--into", "stacks/nocache.toml", cwd=smoke)
    assert out.code == 0 and "do not adopt" in out.out, out.err
    assert "region-cache 1 stays served" in out.out and "stacks/smoke-cpu.toml" in out.out
    m = load(manifest)
    assert m["status"] == "served"
    assert m["evidence"][0] == earlier
    assert "B better in 1 of 5 blocks" in m["evidence"][1]["result"]
    assert {p.name: p.read_text() for p in (smoke / "stacks").glob("*.toml")} == stacks
    assert run_frank("lock", "--check", cwd=smoke).code == 0  # smoke-cpu.lock relocked
    assert run_frank("check", cwd=smoke).code == 0
    # adopting the same trial again would record its evidence twice: refused, nothing written
    before = snapshot(smoke)
    one_line_error(run_frank("trial", "adopt", "rc", "--into", "stacks/nocache.toml",
                             cwd=smoke), "parts/region-cache/1.toml", "evidence",
                   "already in its evidence")
    assert snapshot(smoke) == before


def test_adopt_a_losing_candidate_no_stack_holds_is_rejected(repo: Path) -> None:
    # B (outside stacks/) moves served's expert plan to the published one, which no stack in
    # stacks/ holds: "do not adopt" with --rejected rejects it, and check still passes.
    (repo / "experiments").mkdir()
    (repo / "experiments/pub.toml").write_text(
        'extends = "../stacks/served.toml"\n[replace]\nexpert-plan = "published"\n')
    closure = repo / "stacks/pylock.served.toml"  # a data part asks nothing more of Python
    if closure.is_file():
        (repo / "experiments/pylock.pub.toml").write_bytes(closure.read_bytes())
    r = run_frank("trial", "plan", "served", "experiments/pub.toml", "--name", "pub",
                  "--metric", "m", "--direction", "lower", "--blocks", "5", "--seed", "5",
                  "--seal", cwd=repo)
    assert r.code == 0, r.err
    rows = rows_for(repo, "pub", {"A": [1.0] * 5, "B": [2.0] * 5})
    assert run_frank("trial", "record", "pub", str(write_json(repo / "m.json", rows)),
                     cwd=repo).code == 0
    out = run_frank("trial", "adopt", "pub", "--rejected", cwd=repo)
    assert out.code == 0, out.err
    assert "do not adopt" in out.out and "parts/expert-plan/published.toml is rejected" in out.out
    m = load(repo / "parts/expert-plan/published.toml")
    assert m["status"] == "rejected" and m["evidence"][-1]["trial"].startswith("pub sha256:")
    assert load(repo / "parts/expert-plan/own-traffic.toml")["status"] == "served"
    assert run_frank("check", cwd=repo).code == 0


def test_adopt_a_removal_changes_only_that_part_and_breaks_no_stack(smoke: Path) -> None:
    # A = smoke-cpu, B = nocache (smoke-cpu minus region-cache); removing won.
    assert run_frank("lock", cwd=smoke).code == 0
    r = run_frank("trial", "plan", "smoke-cpu", "stacks/nocache.toml", "--name", "rm",
                  "--metric", "m", "--direction", "lower", "--blocks", "5", "--seed", "5",
                  "--seal", cwd=smoke)
    assert r.code == 0, r.err
    assert load(smoke / "trials/rm.toml")["subject"] == {"part": "region-cache",
                                                         "change": "remove", "a": "1"}
    rows = rows_for(smoke, "rm", {"A": [2.0] * 5, "B": [1.0] * 5})
    assert run_frank("trial", "record", "rm", str(write_json(smoke / "m.json", rows)),
                     cwd=smoke).code == 0
    # into smoke-cpu itself: nocache (its child, `remove = ["region-cache"]`) would break
    before = snapshot(smoke)
    one_line_error(run_frank("trial", "adopt", "rm", "--into", "smoke-cpu", cwd=smoke),
                   "would break nocache.toml", "remove.region-cache")
    assert snapshot(smoke) == before
    # into a served copy of smoke-cpu: it loses region-cache and nothing else changes
    (smoke / "stacks/prod.toml").write_text((smoke / "stacks/smoke-cpu.toml").read_text())
    assert run_frank("lock", "stacks/prod.toml", cwd=smoke).code == 0
    out = run_frank("trial", "adopt", "rm", "--into", "prod", cwd=smoke)
    assert out.code == 0, out.err
    assert "remove region-cache 1 into stacks/prod.toml" in out.out
    prod = load(smoke / "stacks/prod.toml")
    smoke_cpu = load(smoke / "stacks/smoke-cpu.toml")
    assert prod["parts"] == {"tiny-llama": "seed0"}
    assert {k: v for k, v in prod.items() if k != "parts"} == \
        {k: v for k, v in smoke_cpu.items() if k != "parts"}
    assert json.loads((smoke / "stacks/prod.lock").read_text())["digest"] == \
        digests(smoke, "rm")["B"]
    m = load(smoke / "parts/region-cache/1.toml")  # smoke-cpu still holds it: not parked
    assert m["status"] == "served" and len(m["evidence"]) == 2
    assert "stays served" in out.out
    assert run_frank("lock", "--check", cwd=smoke).code == 0
    assert run_frank("check", cwd=smoke).code == 0


def test_plan_seals_one_subject_and_refuses_arms_without_one(smoke: Path) -> None:
    assert plan(smoke, "rc", "--blocks", "5", "--subject", "region-cache").code == 0
    t = load(smoke / "trials/rc.toml")
    assert t["subject"] == {"part": "region-cache", "change": "add", "b": "1"}
    assert "subject.part" in t["seal"]["fields"]
    one_line_error(plan(smoke, "x", "--blocks", "5", "--subject", "tiny-llama"), "--subject",
                   "B differs from A in region-cache", "not in tiny-llama")
    (smoke / "stacks/env.toml").write_text('extends = "smoke-cpu.toml"\n[env]\nX = "1"\n')
    env_only = run_frank("trial", "plan", "smoke-cpu", "stacks/env.toml", "--name", "e",
                         "--metric", "m", "--direction", "lower", "--blocks", "5", cwd=smoke)
    one_line_error(env_only, "a trial is about one part", "by no part")
    (smoke / "stacks/two.toml").write_text('extends = "nocache.toml"\nremove = ["tiny-llama"]\n')
    two = run_frank("trial", "plan", "smoke-cpu", "stacks/two.toml", "--name", "t",
                    "--metric", "m", "--direction", "lower", "--blocks", "5", cwd=smoke)
    one_line_error(two, "remove region-cache 1, remove tiny-llama seed0")
    assert not any((smoke / "trials").glob("[ext]*.toml"))


def test_adopt_refuses_a_plan_sealed_without_a_subject(smoke: Path) -> None:
    # a plan sealed before trials had a subject: still valid to run and decide, never adopted
    assert plan(smoke, "old", "--blocks", "5", seal=False).code == 0
    path = smoke / "trials/old.toml"
    text = path.read_text()
    start = text.index("[subject]")
    path.write_text(text[:start] + text[text.index("[metric]"):])
    assert run_frank("trial", "seal", "old", cwd=smoke).code == 0
    rows = rows_for(smoke, "old", {"A": [2.0] * 5, "B": [1.0] * 5})
    assert run_frank("trial", "record", "old", str(write_json(smoke / "m.json", rows)),
                     cwd=smoke).code == 0
    assert json.loads(run_frank("trial", "decide", "old", "--json",
                                cwd=smoke).out)["verdict"] == "adopt"
    before = snapshot(smoke)
    one_line_error(run_frank("trial", "adopt", "old", "--into", "stacks/nocache.toml",
                             cwd=smoke), "trials/old.toml", "subject", "names no [subject]",
                   "plan it again")
    assert snapshot(smoke) == before


def test_check_refuses_a_parked_or_rejected_part_in_any_stack(smoke: Path) -> None:
    assert run_frank("check", cwd=smoke).code == 0
    manifest = smoke / "parts/region-cache/1.toml"
    original = manifest.read_text()
    manifest.write_text(original.replace('status = "served"', 'status = "parked"'))
    one_line_error(run_frank("check", cwd=smoke), "stacks/served.toml", "parts.region-cache",
                   "region-cache 1 is parked", "may not be in any stack")
    manifest.write_text(original)
    # a child stack that brings a rejected part is named with the field that brings it
    (smoke / "stacks/pub.toml").write_text(
        'extends = "served.toml"\n[replace]\nexpert-plan = "published"\n')
    assert run_frank("check", cwd=smoke).code == 0
    pub = smoke / "parts/expert-plan/published.toml"
    pub.write_text(pub.read_text().replace('status = "candidate"', 'status = "rejected"'))
    one_line_error(run_frank("check", cwd=smoke), "stacks/pub.toml", "replace.expert-plan",
                   "expert-plan published is rejected")


# --- run against a fake engine ----------------------------------------------------------------


@pytest.fixture
def fake(repo: Path, tmp_path: Path) -> tuple[Path, Path]:
    """Stacks that run the fake engine: fake.toml (B, with cpu-experts-sched 2) and
    fake-a.toml (A: the same without it, a child stack with ``remove``)."""
    engine = tmp_path / "fake_engine.py"
    engine.write_text(FAKE_ENGINE)
    (tmp_path / "workload.py").write_text(WORKLOAD)
    (repo / "stacks/fake.toml").write_text(
        f'# a fake engine\ncommand = ["{sys.executable}", "{engine}"]\n'
        '[model]\nname = "fake-model"\n[target]\narch = "cpu"\ngpus = 0\n'
        f'[image]\nbase = "test-base"\n[flags]\nhost = "127.0.0.1"\nport = {free_port()}\n'
        '[parts]\ncpu-experts-sched = "2"\n')
    (repo / "stacks/fake-a.toml").write_text(
        '# served: the fake engine on schedule 1\nextends = "fake.toml"\n'
        'remove = ["cpu-experts-sched"]\n')
    return repo, tmp_path


def test_run_follows_the_sealed_order_and_resumes_after_a_crash(
        fake: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    repo, tmp = fake
    r = run_frank("trial", "plan", "stacks/fake-a.toml", "stacks/fake.toml", "--name", "s2",
                  "--metric", "fake_work_seconds_sum / fake_work_seconds_count",
                  "--direction", "lower", "--blocks", "5", "--seed", "9", "--seal", cwd=repo)
    assert r.code == 0, r.err
    marker = tmp / "crash-once"
    marker.write_text("")
    monkeypatch.setenv("FAKE_CRASH_ONCE", str(marker))
    workload = f"{sys.executable} {tmp / 'workload.py'}"
    first = host_run("s2", "--workload", workload, "--ready-timeout", "30",
                      cwd=repo)
    one_line_error(first, "start 1", "crashed", "engine exited with code 3",
                   after_progress=True)
    recs = [json.loads(x) for x in _results(repo, "s2").read_text().splitlines()]
    assert [(x["start"], x["status"]) for x in recs] == [(1, "crash")]
    one_line_error(run_frank("trial", "decide", "s2", cwd=repo), "start 1", "crashed")

    second = host_run("s2", "--workload", workload, "--ready-timeout", "30",
                       cwd=repo)
    assert second.code == 0, second.err
    assert "ran 10 start(s), 0 crashed" in second.out
    recs = [json.loads(x) for x in _results(repo, "s2").read_text().splitlines()]
    order = load(repo / "trials/s2.toml")["order"]
    assert [(x["start"], x["arm"]) for x in recs[1:]] == [(s["start"], s["arm"]) for s in order]
    assert all(x["value"] == (1.0 if x["arm"] == "B" else 1.25) for x in recs[1:])
    assert all(x["metrics"]["fake_work_seconds_count"] == 3 for x in recs[1:])
    d = json.loads(run_frank("trial", "decide", "s2", "--json", cwd=repo).out)
    assert d["p_exact"] == "1/32" and d["verdict"] == "adopt" and d["crashed_starts"] == 1
    again = host_run("s2", "--workload", workload, cwd=repo)
    assert again.code == 0 and "ran 0 start(s)" in again.out
    assert not (repo / "trials/s2.run.lock").exists()
    (repo / "trials/s2.run.lock").write_text(f"{os.getpid()}\n")  # a live run holds it
    one_line_error(host_run("s2", "--workload", workload, cwd=repo),
                   "trials/s2.run.lock", f"pid {os.getpid()}")
    (repo / "trials/s2.run.lock").write_text("999999999\n")  # its process is gone: stale
    assert host_run("s2", "--workload", workload, cwd=repo).code == 0

    # A root stack that is arm A with no parts: adopting would leave a stack whose one-step
    # revert (drop the only part) cannot resolve, so adopt refuses and writes nothing.
    bare = (repo / "stacks/fake.toml").read_text().replace('cpu-experts-sched = "2"\n', "")
    (repo / "stacks/bare.toml").write_text(bare)
    before = snapshot(repo)
    one_line_error(run_frank("trial", "adopt", "s2", "--into", "stacks/bare.toml", cwd=repo),
                   "stacks/bare.toml", "revert", "one-step revert must stay intact")
    assert snapshot(repo) == before
    # The served stack is arm A: adopting drops its `remove`, giving exactly arm B.
    out = run_frank("trial", "adopt", "s2", "--into", "stacks/fake-a.toml", cwd=repo)
    assert out.code == 0, out.err
    text = (repo / "stacks/fake-a.toml").read_text()
    assert text.startswith("# served: the fake engine on schedule 1") and "remove" not in text
    assert json.loads((repo / "stacks/fake-a.lock").read_text())["digest"] == \
        load(repo / "trials/s2.toml")["arms"]["B"]["digest"]


def test_run_refuses_a_stack_whose_lock_changed_and_a_missing_metric(
        fake: tuple[Path, Path]) -> None:
    repo, tmp = fake
    for name, metric in (("s2", "fake_work_seconds_sum"), ("nm", "json:latency_ms")):
        r = run_frank("trial", "plan", "stacks/fake-a.toml", "stacks/fake.toml", "--name", name,
                      "--metric", metric, "--direction", "lower", "--blocks", "5", "--seal",
                      cwd=repo)
        assert r.code == 0, r.err
    workload = f"{sys.executable} {tmp / 'workload.py'}"
    # by default each arm starts from its image: none is built, so nothing starts
    one_line_error(run_frank("trial", "run", "s2", "--workload", workload, cwd=repo),
                   "out/fake-a/image", "arm A: no image built for stack fake-a",
                   "run `frank compose stacks/fake-a.toml`")
    assert not _results(repo, "s2").exists()
    nm = host_run("nm", "--workload", workload, cwd=repo)
    assert nm.code == 0, nm.err
    one_line_error(run_frank("trial", "decide", "nm", cwd=repo), "metric missing from start 1",
                   "latency_ms")
    stack = repo / "stacks/fake-a.toml"
    stack.write_text(stack.read_text() + '[env]\nEXTRA = "1"\n')
    one_line_error(host_run("s2", "--workload", workload, cwd=repo),
                   "arms.A.digest", "changed since sealing", "plan a new one (`frank trial "
                   "plan stacks/fake-a.toml", "or put stacks/fake-a.toml back")
    assert not _results(repo, "s2").exists()


def test_example_trials_in_the_repo_are_valid_and_sealed() -> None:
    from frank.trial.seal import load_sealed

    examples = sorted((Path(__file__).resolve().parent.parent / "trials").glob("*.toml"))
    assert examples
    for path in examples:
        trial, digest = load_sealed(path)
        assert trial.seal is not None and digest == trial.seal.hash


def test_adopt_a_version_change_and_revert_back(repo: Path) -> None:
    # Served today: the published expert plan (a child of served.toml); the candidate moves
    # it to the plan built from their own traffic (served.toml itself).
    (repo / "stacks/published.toml").write_text(
        '# served with the published expert plan\nextends = "served.toml"\n\n'
        '[replace]\nexpert-plan = "published"  # the plan shipped with the pack\n')
    r = run_frank("trial", "plan", "stacks/published.toml", "served", "--name", "plan",
                  "--metric", "json:verify_step_ms", "--direction", "lower", "--blocks", "5",
                  "--seed", "1", "--seal", cwd=repo)
    assert r.code == 0, r.err
    rows = rows_for(repo, "plan", {"A": [14.4, 14.5, 14.4, 14.6, 14.4],
                                   "B": [14.05, 14.1, 14.0, 14.2, 14.1]})
    assert run_frank("trial", "record", "plan", str(write_json(repo / "m.json", rows)),
                     cwd=repo).code == 0
    d = digests(repo, "plan")
    out = run_frank("trial", "adopt", "plan", "--into", "stacks/published.toml", cwd=repo)
    assert out.code == 0, out.err
    text = (repo / "stacks/published.toml").read_text()
    assert text.startswith("# served with the published expert plan") and "replace" not in text
    assert json.loads((repo / "stacks/published.lock").read_text())["digest"] == d["B"]
    m = load(repo / "parts/expert-plan/own-traffic.toml")
    assert m["status"] == "served" and "(-2.56%)" in m["evidence"][-1]["result"]
    assert m["revert"]["to"] == "published"
    hist = json.loads((repo / "stacks/published.history.jsonl").read_text().splitlines()[-1])
    assert hist["action"] == "adopt:version" and hist["from"] == "published"
    back = run_frank("revert", "expert-plan", "--stack", "stacks/published.toml", cwd=repo)
    assert back.code == 0, back.err
    assert json.loads((repo / "stacks/published.lock").read_text())["digest"] == d["A"]




def test_failing_workload_is_a_crash_and_keep_going_records_every_start(
        fake: tuple[Path, Path]) -> None:
    repo, tmp = fake
    r = run_frank("trial", "plan", "stacks/fake-a.toml", "stacks/fake.toml", "--name", "w",
                  "--metric", "fake_work_seconds_sum", "--direction", "lower", "--blocks", "5",
                  "--seal", cwd=repo)
    assert r.code == 0, r.err
    out = host_run("w", "--keep-going", "--no-progress", "--workload",
                    "echo boom >&2; exit 3", cwd=repo)
    assert out.code == 1 and "ran 10 start(s), 10 crashed" in out.out, out.err
    recs = [json.loads(x) for x in _results(repo, "w").read_text().splitlines()]
    assert [x["start"] for x in recs] == list(range(1, 11))
    assert all(x["status"] == "crash" and x["error"] == "workload exited with code 3: boom"
               for x in recs)
    assert all(x["ready"] is not None for x in recs)  # the engine was up each time
    assert processes_mentioning(str(tmp / "fake_engine.py")) == []  # every engine stopped
    log = (repo / "trials/w.logs/start-001.workload.log").read_text()
    assert "boom" in log


def test_workload_past_its_timeout_is_a_crash_and_leaves_nothing_running(
        fake: tuple[Path, Path]) -> None:
    repo, _ = fake
    r = run_frank("trial", "plan", "stacks/fake-a.toml", "stacks/fake.toml", "--name", "t",
                  "--metric", "fake_work_seconds_sum", "--direction", "lower", "--blocks", "5",
                  "--seal", cwd=repo)
    assert r.code == 0, r.err
    marker = f"sleep 300.{os.getpid()}"  # a command line only this test runs
    out = host_run("t", "--no-progress", "--workload-timeout", "1",
                    "--workload", f"{marker} & {marker}", cwd=repo)
    one_line_error(out, "start 1", "workload ran past 1 s", after_progress=True)
    assert processes_mentioning(marker) == []


def test_decide_refuses_an_arm_whose_starts_ran_two_images(smoke: Path) -> None:
    assert plan(smoke, "two", "--blocks", "5").code == 0
    rows = rows_for(smoke, "two", {"A": [2.0] * 5, "B": [1.0] * 5})
    images = {"A": "sha256:" + "a" * 64, "B": "sha256:" + "b" * 64}
    for row in rows:
        row["image"] = images[row["arm"]]
    assert run_frank("trial", "record", "two", str(write_json(smoke / "r.json", rows)),
                     cwd=smoke).code == 0
    decided = json.loads(run_frank("trial", "decide", "two", "--json", cwd=smoke).out)
    assert decided["images"] == images
    assert f"image B: {images['B']}" in run_frank("trial", "decide", "two", cwd=smoke).out
    results = smoke / "trials/two.results.jsonl"
    lines = results.read_text().splitlines()
    last_a = max(i for i, x in enumerate(lines) if json.loads(x)["arm"] == "A")
    lines[last_a] = lines[last_a].replace("a" * 64, "c" * 64)
    results.write_text("\n".join(lines) + "\n")
    one_line_error(run_frank("trial", "decide", "two", cwd=smoke), "two.results.jsonl",
                   "image", "arm A's starts ran different images", "c" * 64)
    bad = [{**rows[0], "image": "latest"}]
    one_line_error(run_frank("trial", "record", "two", str(write_json(smoke / "b.json", bad)),
                             cwd=smoke), "starts[0].image", "not an image digest")


def test_a_results_file_nested_100000_deep_is_one_line_naming_it(smoke: Path) -> None:
    """Issue 53: a record frank reads, nested deeper than the JSON reader copes with."""
    assert plan(smoke, "rc", "--blocks", "5").code == 0
    deep = "[" * 100_000 + "]" * 100_000
    (smoke / "deep.json").write_text(deep)
    before = snapshot(smoke)
    one_line_error(run_frank("trial", "record", "rc", str(smoke / "deep.json"), cwd=smoke),
                   "deep.json", "nested too deeply")
    results = smoke / "trials/rc.results.jsonl"
    results.write_text(deep + "\n")
    one_line_error(run_frank("trial", "decide", "rc", cwd=smoke), results.name,
                   "nested too deeply")
    results.unlink()
    assert snapshot(smoke) == before
