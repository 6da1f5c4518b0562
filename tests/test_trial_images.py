"""`frank trial run` starts each arm from its image (issue 30, item 5): a trial between two
small stand-in images that differ by one env part, each start recording the manifest digest
of the image it ran; an image not built from the sealed lock, a tampered blob and an image
that changed between starts are refused in one line before the next start.

The two images are composed once per module by the embedded builder (seconds once the test
base is cached): test_run_image's stand-in stack (a local weights folder, mounted read-only)
with an engine that serves /health and a metric.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.spine_helpers import copy_repo, processes_mentioning
from tests.test_run_image import (
    engine_stack,
    frank,
    free_port,
    local_weights,
    manifest,
    one_line,
    tampered,
)

pytestmark = pytest.mark.skipif(shutil.which("buildah") is None,
                                reason="buildah not installed (scripts/setup installs it)")

# The stand-in engine, run from the stack's command (which may hold no newline, hence exec of
# its repr): 1.00 s of "work" per request with EXL3_CPU_EXPERTS_SCHED=2 (the env part arm B
# adds), else 1.25 s, as Prometheus series. The weights are test_run_image's local folder.
ENGINE_PY = r'''
import http.server, os, signal, sys
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
port = int(sys.argv[sys.argv.index("--port") + 1])
cost = 1.0 if os.environ.get("EXL3_CPU_EXPERTS_SCHED") == "2" else 1.25
state = {"sum": 0.0, "count": 0}
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def reply(self, body):
        data = body.encode()
        self.send_response(200); self.send_header("Content-Length", str(len(data)))
        self.end_headers(); self.wfile.write(data)
    def do_GET(self):
        if self.path == "/metrics":
            return self.reply(f"stand_in_work_seconds_sum {state['sum']}\n"
                              f"stand_in_work_seconds_count {state['count']}\n")
        self.reply("")
    def do_POST(self):
        state["sum"] += cost; state["count"] += 1
        self.reply("{}")
print("stand-in engine on", port, flush=True)
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
'''
WORKLOAD = r'''
import json, os, sys, urllib.request
for _ in range(3):
    urllib.request.urlopen(urllib.request.Request(
        os.environ["FRANK_TRIAL_BASE_URL"] + "/work", data=b"{}"), timeout=10).read()
print(json.dumps({"image": os.environ.get("FRANK_TRIAL_IMAGE")}))
fail = os.environ.get("FAIL_START")
sys.exit(3 if fail and os.environ["FRANK_TRIAL_START"] == fail else 0)
'''
METRIC = "stand_in_work_seconds_sum / stand_in_work_seconds_count"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A repo copy with stacks img-a (the stand-in engine) and img-b (img-a + the schedule
    env part), both composed; the workload script beside it."""
    tmp = tmp_path_factory.mktemp("trial-images")
    repo = copy_repo(tmp / "repo")
    local_weights(repo, tmp / "weights" / "my-model")
    engine_stack(repo, "img-a", f"exec({ENGINE_PY!r})", free_port())
    (repo / "stacks/img-b.toml").write_text(
        '# img-a on schedule 2\nextends = "img-a.toml"\n[add]\ncpu-experts-sched = "2"\n')
    layouts = {}
    for arm, stack in (("A", "img-a"), ("B", "img-b")):
        result = frank("compose", f"stacks/{stack}.toml", "--json", cwd=repo, timeout=300)
        assert result.returncode == 0, result.stderr
        layouts[arm] = Path(json.loads(result.stdout)["image"]["layout"])
    workload = tmp / "workload.py"
    workload.write_text(WORKLOAD)
    yield {"repo": repo, "layouts": layouts, "tmp": tmp,
           "workload": f"{sys.executable} {workload}"}
    assert containers_of(tmp) == []  # every start's working container was removed


def containers_of(tmp: Path) -> list[str]:
    """Working containers (and images) of this module's layouts: other tests may be running
    their own in the same storage."""
    engine = subprocess.run([sys.executable, "-c", "from frank.assemble.engines import "
                             "get_engine; print(' '.join(get_engine('buildah').base_args()))"],
                            capture_output=True, text=True, check=True).stdout.split()
    out = []
    for what, fmt in (("containers", "{{.ImageName}}"), ("images", "{{.Name}}")):
        listed = subprocess.run([*engine, what, "--format", fmt], capture_output=True,
                                text=True, check=True).stdout.split()
        out += [name for name in listed if str(tmp) in name]
    return out


def sealed_order(repo: Path, name: str) -> list[tuple[int, str]]:
    sealed = tomllib.loads((repo / f"trials/{name}.toml").read_text())
    return [(s["start"], s["arm"]) for s in sealed["order"]]


def image_digest(layout: Path) -> str:
    return str(json.loads((layout / "index.json").read_text())["manifests"][0]["digest"])


def plan(repo: Path, name: str, blocks: int = 1) -> None:
    """A 1-block trial at alpha 0.5 (2 starts), or 2 blocks at 0.25 (4 starts)."""
    alpha = {1: "0.5", 2: "0.25"}[blocks]
    result = frank("trial", "plan", "stacks/img-a.toml", "stacks/img-b.toml", "--name", name,
                   "--metric", METRIC, "--direction", "lower", "--blocks", str(blocks),
                   "--alpha", alpha, "--seed", "3", "--seal", cwd=repo)
    assert result.returncode == 0, result.stderr


def run(built: dict[str, Any], name: str, *extra: str,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-m", "frank", "trial", "run", name, "--no-progress",
            "--ready-timeout", "60", "--workload", built["workload"], *extra]
    return subprocess.run(args, cwd=built["repo"], capture_output=True, text=True,
                          timeout=240, env={**os.environ, "COLUMNS": "200", **(env or {})})


def records(repo: Path, name: str) -> list[dict[str, Any]]:
    path = repo / f"trials/{name}.results.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def swapped(built: dict[str, Any]) -> Iterator[Any]:
    """Put another layout at an arm's image path for one test, the original back after."""
    moved: list[tuple[Path, Path]] = []

    def swap(arm: str, make: Any) -> Path:
        layout: Path = built["layouts"][arm]
        keep = layout.with_name("image.kept")
        layout.rename(keep)
        moved.append((keep, layout))
        make(keep, layout)
        return layout

    yield swap
    for keep, layout in moved:
        shutil.rmtree(layout, ignore_errors=True)
        keep.rename(layout)


def link_copy(src: Path, dest: Path) -> None:
    shutil.copytree(src, dest, copy_function=os.link)


def rewrite_blob(layout: Path, digest: str, data: bytes) -> str:
    """Replace blob ``digest`` by ``data`` (a new file: linked originals stay intact)."""
    old = layout / "blobs/sha256" / digest.split(":")[1]
    old.unlink()
    new = "sha256:" + hashlib.sha256(data).hexdigest()
    (layout / "blobs/sha256" / new.split(":")[1]).write_bytes(data)
    return new


def reannotated(src: Path, dest: Path) -> None:
    """A valid copy of ``src`` with another manifest digest (one annotation more), the same
    lock digest: what a rebuild by a non-reproducible builder gives."""
    link_copy(src, dest)
    index = json.loads((dest / "index.json").read_text())
    desc = index["manifests"][0]
    man = manifest(dest)
    man.setdefault("annotations", {})["test.rebuilt"] = "yes"
    data = json.dumps(man).encode()
    desc["digest"], desc["size"] = rewrite_blob(dest, desc["digest"], data), len(data)
    (dest / "index.json").unlink()
    (dest / "index.json").write_text(json.dumps(index))


# --- tests -------------------------------------------------------------------------------------


def test_each_start_runs_its_arms_image_and_records_its_digest(built: dict[str, Any]) -> None:
    repo = built["repo"]
    plan(repo, "sched", blocks=2)
    result = run(built, "sched")
    assert result.returncode == 0, result.stderr
    assert "ran 4 start(s), 0 crashed" in result.stdout
    want = {arm: image_digest(layout) for arm, layout in built["layouts"].items()}
    assert want["A"] != want["B"]
    recs = records(repo, "sched")
    assert [(r["start"], r["arm"]) for r in recs] == sealed_order(repo, "sched")
    for r in recs:
        assert r["status"] == "ok" and r["image"] == want[r["arm"]], r
        assert r["value"] == (1.0 if r["arm"] == "B" else 1.25)
        log = (repo / f"trials/sched.logs/start-{r['start']:03d}.workload.log").read_text()
        assert json.dumps({"image": want[r["arm"]]}) in log  # FRANK_TRIAL_IMAGE
        shown = json.loads((repo / f"trials/sched.logs/start-{r['start']:03d}.run.json")
                           .read_text())
        assert shown["image"] == want[r["arm"]] and shown["engine"] == "buildah"
        assert f"image {want[r['arm']]}" in result.stderr
    decided = json.loads(frank("trial", "decide", "sched", "--json", cwd=repo).stdout)
    assert decided["images"] == want and decided["verdict"] == "adopt"
    table = frank("trial", "decide", "sched", cwd=repo).stdout
    assert f"image A: {want['A']}" in table and f"image B: {want['B']}" in table
    assert not processes_mentioning("stand-in engine")


def test_an_image_not_built_from_the_sealed_lock_is_refused_before_any_start(
        built: dict[str, Any], swapped: Any) -> None:
    repo = built["repo"]
    plan(repo, "wrong")
    swapped("A", lambda _keep, dest: link_copy(built["layouts"]["B"], dest))
    line = one_line(run(built, "wrong"), "arm A: the image was built from lock",
                    "run `frank compose stacks/img-a.toml`", "out/img-a/image")
    assert json.loads((repo / "stacks/img-b.lock").read_text())["digest"] in line
    assert records(repo, "wrong") == [] and containers_of(built["tmp"]) == []
    shutil.rmtree(built["layouts"]["A"])
    one_line(run(built, "wrong"), "arm A: no image built for stack img-a",
             "run `frank compose stacks/img-a.toml`")
    assert records(repo, "wrong") == []


def test_a_tampered_blob_is_refused_before_any_start(built: dict[str, Any],
                                                     swapped: Any) -> None:
    repo = built["repo"]
    plan(repo, "tampered")
    swapped("B", lambda keep, dest: tampered(keep, dest, manifest(keep)["layers"][-1]["digest"]))
    layer = manifest(built["layouts"]["B"])["layers"][-1]["digest"]
    one_line(run(built, "tampered"), "arm B: refusing to run: layer", layer,
             "changed after the image was built")
    assert records(repo, "tampered") == []


def test_an_arm_image_that_changed_between_starts_is_refused(built: dict[str, Any],
                                                             swapped: Any) -> None:
    repo = built["repo"]
    plan(repo, "changed")
    first_arm = sealed_order(repo, "changed")[0][1]
    crashed = run(built, "changed", env={"FAIL_START": "2"})  # start 1 ok, start 2 crashes
    assert crashed.returncode == 2, crashed.stderr
    recs = records(repo, "changed")
    assert [(r["start"], r["status"]) for r in recs] == [(1, "ok"), (2, "crash")]
    swapped(first_arm, reannotated)
    other = image_digest(built["layouts"][first_arm])
    assert other != recs[0]["image"]
    # start 2 (the other arm) must not run either: the run is refused as a whole
    one_line(run(built, "changed"), f"arm {first_arm}: start(s) 1 ran {recs[0]['image']}",
             f"this start would run {other}", "changed between starts")
    assert len(records(repo, "changed")) == 2


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_the_run_and_removes_the_container(built: dict[str, Any],
                                                          signum: int) -> None:
    repo = built["repo"]
    name = f"stopped-{signum}"
    plan(repo, name)
    marker = f"sleep 60.{os.getpid()}{signum}"  # a command line only this test runs
    proc = subprocess.Popen([sys.executable, "-m", "frank", "trial", "run", name,
                             "--no-progress", "--workload", marker], cwd=repo,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = repo / f"trials/{name}.logs/start-001.engine.log"

    def workload() -> list[int]:  # its processes, not frank's own (whose argv holds it too)
        return [pid for pid in processes_mentioning(marker) if pid != proc.pid]

    def ready() -> bool:
        return log.exists() and "frank: ready:" in log.read_text()

    # the signal is meant for a run whose engine is ready and whose workload runs: waiting
    # for a process with the marker alone raced under xdist (the engine log was still
    # empty when the signal went; likely a child forked by frank, which carries frank's
    # argv and so the marker until it execs)
    deadline = time.monotonic() + 90
    while not (ready() and workload()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ready() and workload(), log.read_text() if log.exists() else "no log"
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum, err
    assert "frank: interrupted" in err.strip().splitlines()[-1]
    assert records(repo, name) == []  # the start in flight is not recorded
    assert containers_of(built["tmp"]) == [] and not processes_mentioning(marker)
    assert "frank: ready:" in log.read_text()
