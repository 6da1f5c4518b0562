"""Derived parts (issue 43): a file made at lock time by a repo program from pinned inputs.

Each test runs the real CLI on a private copy of the repo with its own FRANK_CACHE; the
program is the shipped expert-plan builder (or a small bad one written here). A run is
told from a reuse by ``$FRANK_CACHE/derived/runs.jsonl`` (one line per derivation).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.spine_helpers import REPO, frank, snapshot

BUILDER = REPO / "builders" / "expert-plan" / "plan.py"
STACK = """extends = "smoke-cpu.toml"
description = "smoke-cpu + a derived expert plan"

[add]
expert-plan = "{version}"
"""


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "cache"
    monkeypatch.setenv("FRANK_CACHE", str(path))
    return path


def runs(cache: Path) -> list[dict[str, object]]:
    path = cache / "derived" / "runs.jsonl"
    if not path.is_file():
        return []
    return [json.loads(x) for x in path.read_text().splitlines()]


def write_stack(repo: Path, version: str, name: str = "plan-smoke") -> Path:
    path = repo / "stacks" / f"{name}.toml"
    path.write_text(STACK.format(version=version))
    return path


def locked_part(repo: Path, stack: str = "plan-smoke") -> dict[str, object]:
    lock = json.loads((repo / "stacks" / f"{stack}.lock").read_text())
    part: dict[str, object] = next(p for p in lock["parts"] if p["name"] == "expert-plan")
    return part


def by_hand(repo: Path, tmp: Path, *args: str) -> bytes:
    """The builder run directly (no frank), as a person would: the reference output."""
    out = tmp / "by-hand.json"
    traces = [str(repo / "parts/expert-plan/traces" / f"replay-{n}.json") for n in (1, 2)]
    subprocess.run([sys.executable, str(BUILDER), "--out", str(out), *args, *traces],
                   check=True, cwd=tmp)
    return out.read_bytes()


def test_lock_derives_once_then_check_and_relock_reuse(repo: Path, cache: Path,
                                                        tmp_path: Path) -> None:
    write_stack(repo, "from-traces")
    r = frank("lock", "plan-smoke", cwd=repo)
    assert r.code == 0, r.err
    assert len(runs(cache)) == 1
    derived = locked_part(repo)["derived"]
    assert isinstance(derived, dict)
    # the recorded output is the builder's own output on those traces and parameters
    # (run by hand: the manifest's params become --name value, traces in declared order)
    want = by_hand(repo, tmp_path, "--cpu-experts", "5296", "--experts", "384",
                   "--layers", "40", "--split", "global")
    assert derived["sha256"] == hashlib.sha256(want).hexdigest()
    assert derived["size"] == len(want)
    kept = cache / "blobs" / "sha256" / str(derived["sha256"])
    assert kept.read_bytes() == want
    # lock --check and a second lock: keys checked, nothing run
    assert frank("lock", "--check", "plan-smoke", cwd=repo).code == 0
    assert frank("lock", "plan-smoke", cwd=repo).out.strip().endswith(
        f"({json.loads((repo / 'stacks/plan-smoke.lock').read_text())['digest']})")
    assert len(runs(cache)) == 1
    # an input changed: --check says stale and still runs nothing; lock runs it again
    trace = repo / "parts/expert-plan/traces/replay-2.json"
    trace.write_text(trace.read_text().replace('"0": [', '"0": [7', 1))
    r = frank("lock", "--check", "plan-smoke", cwd=repo)
    assert r.code == 1 and "stale" in r.out
    assert len(runs(cache)) == 1
    assert frank("lock", "plan-smoke", cwd=repo).code == 0
    assert len(runs(cache)) == 2
    assert locked_part(repo)["derived"]["sha256"] != derived["sha256"]  # type: ignore[index]


def test_output_is_placed_like_a_data_file(repo: Path, cache: Path, tmp_path: Path) -> None:
    """The plan places the kept bytes at dest, and the engine's variable points at them; a
    fresh store (another machine, a clone) makes them again and gets the same bytes."""
    from frank.assemble.context import stage_layer
    from frank.assemble.plan import BuildPlan

    write_stack(repo, "from-traces")
    assert frank("lock", "plan-smoke", cwd=repo).code == 0
    sha = locked_part(repo)["derived"]["sha256"]  # type: ignore[index]
    for fresh in (False, True):
        if fresh:  # the store is gone: compose derives again, offline, and must match
            import shutil

            shutil.rmtree(cache)
        r = frank("compose", "stacks/plan-smoke.toml", "--locked", "--builder", "none",
                  cwd=repo)
        assert r.code == 0, r.err
        plan = BuildPlan.model_validate_json((repo / "out/plan-smoke/plan.json").read_text())
        layer = next(x for x in plan.layers if x.name == "derived:expert-plan")
        rootfs = tmp_path / f"rootfs-{fresh}"
        stage_layer(layer, repo, rootfs)
        placed = (rootfs / "opt/frank/data/expert-plan.json").read_bytes()
        assert hashlib.sha256(placed).hexdigest() == sha
        assert plan.config.env["EXL3_CPU_EXPERTS_PLAN"] == "/opt/frank/data/expert-plan.json"
    assert len(runs(cache)) == 1  # the fresh store's one run


def test_tampered_kept_output_is_not_used(repo: Path, cache: Path) -> None:
    """The store is not trusted: a kept output whose bytes changed is made again."""
    write_stack(repo, "from-traces")
    assert frank("lock", "plan-smoke", cwd=repo).code == 0
    sha = str(locked_part(repo)["derived"]["sha256"])  # type: ignore[index]
    blob = cache / "blobs" / "sha256" / sha
    blob.write_bytes(blob.read_bytes().replace(b"5296", b"5297", 1))
    (repo / "stacks/plan-smoke.lock").unlink()
    assert frank("lock", "plan-smoke", cwd=repo).code == 0
    assert len(runs(cache)) == 2
    assert hashlib.sha256(blob.read_bytes()).hexdigest() == sha


def _second_version(repo: Path) -> None:
    """expert-plan fewer-cpu: the same traces, a smaller budget, reverting to from-traces."""
    text = (repo / "parts/expert-plan/from-traces.toml").read_text()
    text = text.replace('version = "from-traces"', 'version = "fewer-cpu"')
    text = text.replace("cpu-experts = 5296", "cpu-experts = 4000")
    text = text.replace('to = "published"', 'to = "from-traces"')
    (repo / "parts/expert-plan/fewer-cpu.toml").write_text(text)


def test_revert_and_undo_get_the_kept_output_back_without_running(repo: Path,
                                                                  cache: Path) -> None:
    _second_version(repo)
    stack = write_stack(repo, "from-traces")
    assert frank("lock", "plan-smoke", cwd=repo).code == 0
    first = locked_part(repo)["derived"]
    write_stack(repo, "fewer-cpu")
    assert frank("lock", "plan-smoke", cwd=repo).code == 0
    second = locked_part(repo)["derived"]
    assert len(runs(cache)) == 2
    before = (repo / "stacks/plan-smoke.lock").read_text()
    (repo / "before.lock").write_text(before)

    r = frank("revert", "expert-plan", "--stack", str(stack), cwd=repo)
    assert r.code == 0, r.err
    assert locked_part(repo)["derived"] == first
    assert len(runs(cache)) == 2  # the kept output, found by its key: nothing ran

    # frank diff: which inputs changed, and the output's hash before and after
    r = frank("diff", "before.lock", "stacks/plan-smoke.lock", "--json", cwd=repo)
    assert r.code == 0, r.err
    part = next(p for p in json.loads(r.out)["parts"] if p["part"] == "expert-plan")
    fields = {f["field"]: (f["old"], f["new"]) for f in part["fields"]}
    assert fields["spec.params.cpu-experts"] == (4000, 5296)
    assert fields["output.sha256"] == (second["sha256"], first["sha256"])  # type: ignore[index]

    r = frank("revert", "--undo", "--stack", str(stack), cwd=repo)
    assert r.code == 0, r.err
    assert (repo / "stacks/plan-smoke.lock").read_text() == before
    assert len(runs(cache)) == 2


# --- bad input: one line naming file and field, exit 2, nothing kept ----------------------

def _bad_trace(repo: Path, edit: str) -> None:
    path = repo / "parts/expert-plan/traces/replay-2.json"
    doc = json.loads(path.read_text())
    if edit == "layer":
        doc["counts"]["40"] = [0] * 384
    elif edit == "expert":
        doc["counts"]["3"] = {"384": 5}
    elif edit == "negative":
        doc["counts"]["5"][17] = -3
    elif edit == "fraction":
        doc["counts"]["5"][17] = 1.5
    path.write_text(json.dumps(doc))


BAD_TRACES = [
    ("layer", "parts/expert-plan/traces/replay-2.json: counts.40: layer 40 is not in the model"),
    ("expert", "parts/expert-plan/traces/replay-2.json: counts.3.384: expert 384 is not in "
               "the model"),
    ("negative", "parts/expert-plan/traces/replay-2.json: counts.5[17]: -3 is negative"),
    ("fraction", "parts/expert-plan/traces/replay-2.json: counts.5[17]: 1.5 is not a whole "
                 "number of tokens"),
]


def _assert_refused(repo: Path, cache: Path, starts: str) -> None:
    before = snapshot(repo / "stacks")
    r = frank("lock", "plan-smoke", cwd=repo)
    assert r.code == 2, (r.out, r.err)
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.err, r.err
    assert lines[0].startswith("frank: error: " + starts), lines[0]
    assert snapshot(repo / "stacks") == before  # no lock written
    assert runs(cache) == []
    kept = cache / "derived"
    assert not kept.exists() or not list(kept.glob("*.json"))
    blobs = cache / "blobs" / "sha256"
    assert not blobs.exists() or not list(blobs.iterdir())


@pytest.mark.parametrize(("edit", "starts"), BAD_TRACES, ids=[b[0] for b in BAD_TRACES])
def test_bad_trace(repo: Path, cache: Path, edit: str, starts: str) -> None:
    write_stack(repo, "from-traces")
    _bad_trace(repo, edit)
    _assert_refused(repo, cache, starts)


@pytest.mark.parametrize(("budget", "why"), [("20000", "20000 experts is more than the model's "
                                               "15360 routed experts"),
                                              ("-1", "-1 experts is below zero")])
def test_bad_budget(repo: Path, cache: Path, budget: str, why: str) -> None:
    path = repo / "parts/expert-plan/from-traces.toml"
    path.write_text(path.read_text().replace("cpu-experts = 5296", f"cpu-experts = {budget}"))
    write_stack(repo, "from-traces")
    _assert_refused(repo, cache, f"parts/expert-plan/from-traces.toml: params.cpu-experts: "
                                 f"{why}")


BAD_PROGRAMS = {
    "nothing": ("pass\n", "output: parts/bad/prog/main.py wrote nothing at out/x.json"),
    "outside": ("import sys\nopen('../escaped.txt', 'w').write('x')\n",
                "program: parts/bad/prog/main.py writes outside its output: "),
    "beside": ("import sys\nout = sys.argv[2]\nopen(out, 'w').write('x')\n"
               "open(out + '.extra', 'w').write('y')\n",
               "output: parts/bad/prog/main.py wrote out/x.json.extra besides its output"),
    "network": ("import socket\nsocket.create_connection(('10.255.255.1', 80), timeout=1)\n",
                "program: parts/bad/prog/main.py reaches the network: socket."),
    "differs": ("import sys, time\nopen(sys.argv[2], 'w').write(str(time.time_ns()))\n",
                "output: parts/bad/prog/main.py gave two different outputs from the same "
                "inputs: byte "),
    "third-party": ("import numpy\n", "program: parts/bad/prog/main.py line 1 imports numpy, "
                                      "which is not in the standard library"),
    "undeclared": ("import sys\nopen('/etc/hostname').read()\nopen(sys.argv[2], 'w')\n",
                   "program: parts/bad/prog/main.py reads a file it did not declare: "
                   "/etc/hostname"),
    "fails": ("raise SystemExit('boom')\n", "program: parts/bad/prog/main.py exited 1: boom"),
}


@pytest.mark.parametrize("case", sorted(BAD_PROGRAMS))
def test_bad_program(repo: Path, cache: Path, case: str) -> None:
    source, starts = BAD_PROGRAMS[case]
    (repo / "parts/bad/prog").mkdir(parents=True)
    (repo / "parts/bad/prog/main.py").write_text(source)
    (repo / "parts/bad/in.txt").write_text("input\n")
    (repo / "parts/bad/1.toml").write_text("""kind = "derived"
name = "bad"
version = "1"
summary = "a program that misbehaves"
status = "candidate"
output = "x.json"
dest = "/opt/frank/data/x.json"
env_var = "BAD_FILE"
inputs = [{path = "parts/bad/in.txt"}]
program = {path = "parts/bad/prog", main = "main.py"}
provenance = {licence = "Apache-2.0"}
revert = {action = "remove"}
""")
    (repo / "stacks/plan-smoke.toml").write_text(
        'extends = "smoke-cpu.toml"\n\n[add]\nbad = "1"\n')
    _assert_refused(repo, cache, f"parts/bad/1.toml: {starts}")


def test_manifest_refuses_two_inputs_of_one_name(repo: Path, cache: Path) -> None:
    path = repo / "parts/expert-plan/from-traces.toml"
    path.write_text(path.read_text().replace("traces/replay-2.json", "traces/replay-1.json"))
    write_stack(repo, "from-traces")
    r = frank("lock", "plan-smoke", cwd=repo)
    assert r.code == 2 and "two inputs are named 'replay-1.json'" in r.err, r.err
    assert runs(cache) == []


def test_trial_plans_between_the_published_swap_on_the_cpu_twin(repo: Path,
                                                                cache: Path) -> None:
    """The shipped story: served-cpu-plan is served-cpu with the derived plan in place of
    the own-traffic file; a sealed trial plans between the two (one part changes)."""
    assert frank("lock", "served-cpu-plan", cwd=repo).code == 0
    r = frank("trial", "plan", "served-cpu", "served-cpu-plan", "--name", "plan-traces",
              "--metric", "json:verify_step_ms", "--direction", "lower", "--blocks", "5",
              "--subject", "expert-plan", "--seal", cwd=repo)
    assert r.code == 0, r.err
    assert "subject: expert-plan own-traffic -> from-traces" in r.out
    text = (repo / "trials/plan-traces.toml").read_text()
    digest = json.loads((repo / "stacks/served-cpu-plan.lock").read_text())["digest"]
    assert f'digest = "{digest}"' in text


def test_hub_input_pinned_by_sha256_comes_from_a_mirror_offline(
        repo: Path, cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hub input is fetched into the store by its sha256 (here from a mirror folder:
    files named by their sha256, as for an air-gapped build), and a wrong pin is refused."""
    trace = repo / "parts/expert-plan/traces/replay-2.json"
    sha = hashlib.sha256(trace.read_bytes()).hexdigest()
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / sha).write_bytes(trace.read_bytes())
    monkeypatch.setenv("FRANK_MIRROR", str(mirror))
    path = repo / "parts/expert-plan/from-traces.toml"
    hub = ('[[inputs]]\nsha256 = "{sha}"\nhub = {{repo_id = "frank-examples/routing", '
           'revision = "' + "a" * 40 + '", filename = "replay-2.json"}}\n')
    text = path.read_text()
    path.write_text(text.replace('[[inputs]]\npath = "parts/expert-plan/traces/replay-2.json"\n',
                                 hub.format(sha=sha)))
    write_stack(repo, "from-traces")
    assert frank("lock", "plan-smoke", cwd=repo).code == 0
    label = f"hub:frank-examples/routing@{'a' * 40}/replay-2.json"
    assert locked_part(repo)["inputs"][label] == sha  # type: ignore[index]
    # the same output as the repo-file version: the program saw the same bytes
    want = by_hand(repo, tmp_path, "--cpu-experts", "5296", "--experts", "384",
                   "--layers", "40")
    assert locked_part(repo)["derived"]["sha256"] == hashlib.sha256(want).hexdigest()  # type: ignore[index]
    path.write_text(text.replace('[[inputs]]\npath = "parts/expert-plan/traces/replay-2.json"\n',
                                 hub.format(sha="0" * 64)))
    (repo / "stacks/plan-smoke.lock").unlink()
    r = frank("lock", "plan-smoke", cwd=repo)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1, r.err


def _file_in_image(layout: Path, name: str) -> tuple[bytes, list[str]]:
    """A file's bytes from an OCI layout's layers, and the image config's env."""
    import tarfile

    def blob(digest: str) -> Path:
        return layout / "blobs" / "sha256" / digest.split(":", 1)[1]

    index = json.loads((layout / "index.json").read_text())
    manifest = json.loads(blob(index["manifests"][0]["digest"]).read_text())
    env = json.loads(blob(manifest["config"]["digest"]).read_text())["config"]["Env"]
    found = b""
    for layer in manifest["layers"]:
        with tarfile.open(blob(layer["digest"])) as tar:
            for member in tar.getmembers():
                if member.name == name:
                    handle = tar.extractfile(member)
                    assert handle is not None
                    found = handle.read()
    return found, env


@pytest.mark.slow
def test_image_holds_the_derived_file_and_a_fresh_store_gives_the_same_image(
        repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real OCI image (embedded builder, smoke-cpu + the derived plan): the file at dest
    is the locked output and the env var points at it; with the kept output gone (another
    machine), compose makes it again and builds the same image digest. The session's
    FRANK_CACHE (a warm base, as test_compose_image's) when one is set; about 30 s then."""
    import os

    cache = Path(os.environ.get("FRANK_CACHE") or tmp_path / "cache")
    monkeypatch.setenv("FRANK_CACHE", str(cache))
    write_stack(repo, "from-traces")
    assert frank("lock", "plan-smoke", cwd=repo).code == 0
    sha = str(locked_part(repo)["derived"]["sha256"])  # type: ignore[index]
    r = frank("compose", "stacks/plan-smoke.toml", "--locked", "--json", cwd=repo)
    assert r.code == 0, r.err
    digest = json.loads(r.out)["image"]["digest"]
    data, env = _file_in_image(repo / "out/plan-smoke/image", "opt/frank/data/expert-plan.json")
    assert hashlib.sha256(data).hexdigest() == sha
    assert "EXL3_CPU_EXPERTS_PLAN=/opt/frank/data/expert-plan.json" in env
    (cache / "blobs" / "sha256" / sha).unlink()
    for index in (cache / "derived").glob("*.json"):
        index.unlink()
    n = len(runs(cache))
    r = frank("compose", "stacks/plan-smoke.toml", "--locked", "--json", "--out",
              str(tmp_path / "elsewhere"), cwd=repo)
    assert r.code == 0, r.err
    assert json.loads(r.out)["image"]["digest"] == digest
    assert len(runs(cache)) == n + 1
