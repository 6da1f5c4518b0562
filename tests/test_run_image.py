"""`frank run` starts a built image (issue 30, item 1): the exact container commands for each
engine, a tampered layer refused in one line before any engine runs, the launcher inside
the image finding the mounted hub cache, and a tiny engine in an image served until
SIGTERM or Ctrl-C, its working container removed every time.

Images are built once per module by the embedded builder (`frank compose`, seconds once
the test base is cached); anything that runs a container needs buildah.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from frank.assemble.engines import storage_driver
from frank.store.blobs import leave_users
from tests.fixtures.local_hub import publish
from tests.fixtures.tiny_model import build_tiny_model
from tests.spine_helpers import copy_repo, processes_mentioning

pytestmark = pytest.mark.slow
needs_buildah = pytest.mark.skipif(shutil.which("buildah") is None,
                                   reason="buildah not installed (scripts/setup installs it)")

REVISION = "e8a00a84f4fe6e411c6fa5e99bd2beb39182fcfd"
# A stand-in engine, kept in the (mounted) model folder as engine.py: answers every GET with
# what it was given (its model folder's config.json, an env value), and exits 0 on SIGTERM
# or SIGINT as vLLM does. A stack's command may hold no newline, hence the exec.
TINY_ENGINE = "import sys; exec(open(sys.argv[1] + '/engine.py').read())"
ENGINE_PY = "\n".join([
    "import http.server, json, os, pathlib, signal, sys",
    "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))",
    "signal.signal(signal.SIGINT, lambda *a: sys.exit(0))",
    "args = sys.argv",
    "port = int(args[args.index('--port') + 1])",
    "body = json.dumps({'model': args[1], 'mark': os.environ.get('FRANK_TEST_MARK', ''),",
    "                   'config': pathlib.Path(args[1], 'config.json').read_text()}).encode()",
    "class H(http.server.BaseHTTPRequestHandler):",
    "    def do_GET(self):",
    "        self.send_response(200); self.end_headers(); self.wfile.write(body)",
    "    def log_message(self, *a): pass",
    "print('tiny engine on', port, flush=True)",
    "http.server.HTTPServer(('127.0.0.1', port), H).serve_forever()",
]) + "\n"
DYING_ENGINE = "import sys; print('boom: this engine gives up', file=sys.stderr); sys.exit(3)"
SILENT_ENGINE = "import time; print('silent engine', flush=True); time.sleep(600)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def frank(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    return subprocess.run([sys.executable, "-m", "frank", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env={**env, "COLUMNS": "200"})


def compose(repo: Path, stack: str) -> str:
    result = frank("compose", stack, "--json", cwd=repo)
    assert result.returncode == 0, result.stderr
    return str(json.loads(result.stdout)["image"]["layout"])


def local_weights(repo: Path, folder: Path) -> None:
    """A weights part that is a local folder: a config and the stand-in engine."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"hidden_size": 128}\n')
    (folder / "engine.py").write_text(ENGINE_PY)
    files = "".join(f'"{p.name}" = "{hashlib.sha256(p.read_bytes()).hexdigest()}"\n'
                    for p in sorted(folder.iterdir()))
    (repo / "parts/my-model").mkdir()
    (repo / "parts/my-model/1.toml").write_text(
        'kind = "weights"\nname = "my-model"\nversion = "1"\nsummary = "a folder"\n'
        f'status = "served"\npath = "{folder}"\nserved_model_name = "mine"\n'
        f'[files]\n{files}[provenance]\nlicence = "Apache-2.0"\n[revert]\naction = "remove"\n')


def engine_stack(repo: Path, name: str, script: str, port: int, extra: str = "") -> None:
    command = json.dumps(["python3", "-c", script])
    (repo / f"stacks/{name}.toml").write_text(
        f'extends = "smoke-cpu.toml"\ncommand = {command}\nremove = ["tiny-llama"]\n'
        f'[add]\nmy-model = "1"\n[flags]\nport = {port}\n{extra}')


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A repo copy with smoke-cpu, stacks of a tiny engine, one that dies and one that
    never answers, and a GPU stack bound to all interfaces, composed; and a hub cache
    holding the tiny model."""
    repo = copy_repo(tmp_path_factory.mktemp("run") / "repo")
    local_weights(repo, tmp_path_factory.mktemp("weights") / "my-model")
    engine_stack(repo, "tiny", TINY_ENGINE, free_port())
    engine_stack(repo, "dying", DYING_ENGINE, free_port())
    engine_stack(repo, "silent", SILENT_ENGINE, free_port())
    (repo / "stacks/gpu.toml").write_text(
        'extends = "smoke-cpu.toml"\n[target]\narch = "cpu"\ngpus = 2\n'
        '[flags]\nhost = "0.0.0.0"\n')
    out = {name: Path(compose(repo, f"stacks/{name}.toml"))
           for name in ("smoke-cpu", "tiny", "dying", "silent", "gpu")}
    model = build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    hub = tmp_path_factory.mktemp("hub")
    assert publish(model, hub, "frank-test/tiny-llama") == REVISION
    return {"repo": repo, "hub": hub, "model": model, **out}


def one_line(result: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("frank: error: "), result.stderr
    for needle in needles:
        assert needle in last, (needle, last)
    return last


def frank_containers() -> set[str]:
    engine = subprocess.run([sys.executable, "-c", "from frank.assemble.engines import "
                             "get_engine; print(' '.join(get_engine('buildah').base_args()))"],
                            capture_output=True, text=True, check=True).stdout.split()
    out = subprocess.run([*engine, "containers", "--format", "{{.ContainerName}}"],
                         capture_output=True, text=True, check=True).stdout.split()
    return {name for name in out if name.startswith("frank-run-")}


# --- --print: the exact commands, per engine -------------------------------------------------


def test_print_buildah_from_run_rm(built: dict[str, Path]) -> None:
    result = frank("run", "stacks/smoke-cpu.toml", "--print", "--json", "--engine", "buildah",
                   "--hub-cache", str(built["hub"]), "--env", "EXTRA=1", cwd=built["repo"])
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    ctr, layout = plan["container"], str(built["smoke-cpu"])
    # the image is reached through a link named by its digest: buildah keeps what it imported
    # under that name, and the next run of the same image reuses it (--pull=false)
    link = f"/tmp/frank-oci-{plan['image'].split(':')[1][:24]}/image"
    assert plan["prepare"] == [[*plan["engine_args"], "from", "--quiet", "--pull=false",
                                "--name", ctr, f"oci:{link}"]]
    assert Path(plan["layout"]) == Path(layout)
    assert plan["engine_args"][1:] == ["--root", plan["engine_args"][2], "--runroot",
                                       plan["engine_args"][4], "--storage-driver",
                                       storage_driver()]
    run = plan["run"]
    assert run[:len(plan["engine_args"]) + 3] == [*plan["engine_args"], "run", "--isolation",
                                                  "chroot"]
    volumes = [run[i + 1] for i, a in enumerate(run) if a == "--volume"]
    digest = plan["image"].split(":")[1][:24]
    # bytecode and vLLM's cache root (model-class info), kept per image digest
    assert volumes[0].endswith(f"/run-cache/{digest}:/frank/cache")
    assert volumes[1:] == [f"{built['hub']}:/frank/hub:ro"]
    envs = [run[i + 1] for i, a in enumerate(run) if a == "--env"]
    assert envs == ["EXTRA=1", f"FRANK_RUN={ctr}", "HF_HUB_CACHE=/frank/hub",
                    "HF_HUB_OFFLINE=1", "PYTHONPYCACHEPREFIX=/frank/cache/pycache",
                    "VLLM_CACHE_ROOT=/frank/cache/vllm"]
    assert run[run.index(ctr):] == [ctr, "--", "python3", "/opt/frank/bin/frank-launch",
                                    "--lock", "/etc/frank/frank.lock", "--cache-dir",
                                    "/frank/hub"]
    assert "-p" not in run and "--device" not in run  # host network, no GPU on a CPU target
    assert plan["cleanup"] == [[*plan["engine_args"], "rm", ctr]]
    assert plan["url"] == "http://127.0.0.1:8000/health" and plan["gpus"] == 0
    lock = json.loads((built["repo"] / "stacks/smoke-cpu.lock").read_text())
    assert plan["lock_digest"] == lock["digest"]
    text = frank("run", "stacks/smoke-cpu.toml", "--print", "--hub-cache", str(built["hub"]),
                 cwd=built["repo"])
    assert text.returncode == 0 and " run --isolation chroot " in text.stdout
    assert " from --quiet --pull=false --name frank-run-" in text.stdout


def test_print_podman(built: dict[str, Path]) -> None:
    """Loopback bind (smoke-cpu): the host's network; all interfaces with GPUs: a port
    published on 127.0.0.1 and the GPUs passed through. (Untested here: no GPU.)"""
    loop = json.loads(frank("run", "stacks/smoke-cpu.toml", "--print", "--json", "--engine",
                            "podman", "--hub-cache", str(built["hub"]), cwd=built["repo"]).stdout)
    [create] = loop["prepare"]  # made first: its root is checked before it starts
    assert create[len(loop["engine_args"]):][:2] == ["create", "--pull=always"]
    assert create[create.index("--network") + 1] == "host" and "-p" not in create
    assert create[-2:] == ["--cache-dir", "/frank/hub"]  # the image's entrypoint, these args
    assert loop["run"] == [*loop["engine_args"], "start", "--attach", loop["container"]]
    assert loop["cleanup"] == [[*loop["engine_args"], "rm", "-f", loop["container"]]]
    gpu = json.loads(frank("run", "stacks/gpu.toml", "--print", "--json", "--engine", "podman",
                           "--hub-cache", str(built["hub"]), cwd=built["repo"]).stdout)
    [run] = gpu["prepare"]
    assert run[run.index("-p") + 1] == "127.0.0.1:8000:8000" and "--network" not in run
    assert run[run.index("--device") + 1] == "nvidia.com/gpu=all"
    assert f"oci:{built['gpu']}" in run and "--pull=always" in run


def test_print_docker(built: dict[str, Path]) -> None:
    """docker goes through the SDK: the plan holds what the SDK is given (network, /dev/shm,
    ipc, the lock's GPU count as a device request) and the equivalent `docker run` line."""
    loop = json.loads(frank("run", "stacks/smoke-cpu.toml", "--print", "--json", "--engine",
                            "docker", "--hub-cache", str(built["hub"]), cwd=built["repo"]).stdout)
    assert loop["prepare"] == [] and loop["link"] is None
    spec = loop["docker"]
    assert spec["network"] == "host" and spec["gpus"] == 0
    assert spec["command"] == ["--cache-dir", "/frank/hub"]
    assert (spec["shm_size"], spec["ipc"]) == ("1g", "private")
    run = loop["run"]
    assert run[:2] == ["docker", "run"] and run[run.index("--network") + 1] == "host"
    assert f"frank-run:{loop['image'].split(':')[1]}" in run and "--gpus" not in run
    gpu = json.loads(frank("run", "stacks/gpu.toml", "--print", "--json", "--engine", "docker",
                           "--shm-size", "8g", "--ipc", "host", "--hub-cache",
                           str(built["hub"]), cwd=built["repo"]).stdout)
    spec, run = gpu["docker"], gpu["run"]
    assert spec["network"] == "publish" and run[run.index("-p") + 1] == "127.0.0.1:8000:8000"
    assert spec["gpus"] == 2 and run[run.index("--gpus") + 1] == "2"
    assert (spec["shm_size"], spec["ipc"]) == ("8g", "host")
    one_line(frank("run", "stacks/gpu.toml", "--print", "--engine", "docker", "--shm-size",
                   "lots", cwd=built["repo"]), "--shm-size", "not a size")


def test_print_links_a_layout_whose_path_is_not_an_image_name(built: dict[str, Path],
                                                              tmp_path: Path) -> None:
    odd = tmp_path / "Images" / "smoke"
    shutil.copytree(built["smoke-cpu"], odd, copy_function=os.link)
    plan = json.loads(frank("run", str(odd), "--print", "--json", "--hub-cache",
                            str(built["hub"]), cwd=built["repo"]).stdout)
    assert plan["link"] == f"/tmp/frank-oci-{plan['image'].split(':')[1][:24]}/image"
    assert plan["prepare"][0][-1] == f"oci:{plan['link']}"


def test_model_dir_is_mounted_as_the_pinned_snapshot(built: dict[str, Path]) -> None:
    plan = json.loads(frank("run", "stacks/smoke-cpu.toml", "--print", "--json", "--model-dir",
                            str(built["model"]), cwd=built["repo"]).stdout)
    snapshot = f"/frank/hub/models--frank-test--tiny-llama/snapshots/{REVISION}"
    assert plan["mounts"] == [{"host": str(built["model"]), "container": snapshot}]
    assert plan["run"][-2:] == ["--cache-dir", "/frank/hub"]
    # a hub snapshot's files are links into blobs/, outside the folder that would be mounted
    linked = built["hub"] / f"models--frank-test--tiny-llama/snapshots/{REVISION}"
    one_line(frank("run", "stacks/smoke-cpu.toml", "--model-dir", str(linked),
                   cwd=built["repo"]), "links out of the mounted folder")


# --- refusals, in one line, before anything runs ----------------------------------------------


@pytest.fixture
def no_engine_runs(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """PATH with a buildah that only records that it was called."""
    bin_dir, record = tmp_path / "bin", tmp_path / "engine-called"
    bin_dir.mkdir()
    (bin_dir / "buildah").write_text(f"#!/bin/sh\ntouch {record}\nexit 1\n")
    (bin_dir / "buildah").chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}, record


def tampered(layout: Path, dest: Path, digest: str) -> Path:
    """A copy of ``layout`` (hard links) with one byte of blob ``digest`` flipped."""
    shutil.copytree(layout, dest, copy_function=os.link)
    blob = dest / "blobs/sha256" / digest.split(":")[1]
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0x01
    blob.unlink()  # a new file: the original, linked, stays intact
    blob.write_bytes(bytes(data))
    return dest


def manifest(layout: Path) -> dict:
    index = json.loads((layout / "index.json").read_text())
    digest = index["manifests"][0]["digest"].split(":")[1]
    return json.loads((layout / "blobs/sha256" / digest).read_bytes())


def test_tampered_layer_refuses_to_run_naming_the_layer(
        built: dict[str, Path], tmp_path: Path,
        no_engine_runs: tuple[dict[str, str], Path]) -> None:
    env, record = no_engine_runs
    layer = manifest(built["smoke-cpu"])["layers"][1]["digest"]
    bad = tampered(built["smoke-cpu"], tmp_path / "bad", layer)
    result = subprocess.run([sys.executable, "-m", "frank", "run", str(bad), "--hub-cache",
                             str(built["hub"])], cwd=built["repo"], capture_output=True,
                            text=True, timeout=60, env={**os.environ, **env})
    line = one_line(result, "layer 1 (frank: plugin:region-cache)", layer, "refusing to run")
    assert result.stderr.strip() == line and result.stdout == ""
    assert not record.exists()  # no engine was asked for anything


def test_tampered_config_refuses_to_run(built: dict[str, Path], tmp_path: Path,
                                        no_engine_runs: tuple[dict[str, str], Path]) -> None:
    env, record = no_engine_runs
    config = manifest(built["smoke-cpu"])["config"]["digest"]
    bad = tampered(built["smoke-cpu"], tmp_path / "bad", config)
    result = subprocess.run([sys.executable, "-m", "frank", "run", str(bad), "--print"],
                            cwd=built["repo"], capture_output=True, text=True, timeout=60,
                            env={**os.environ, **env})
    assert result.stderr.strip() == one_line(result, "config", config)
    assert not record.exists()


def test_stack_whose_image_is_stale_says_compose(built: dict[str, Path]) -> None:
    stack = built["repo"] / "stacks/gpu.toml"
    original = stack.read_text()
    try:
        stack.write_text(original + '[env]\nFRANK_RUN_TEST = "changed"\n')
        one_line(frank("run", "stacks/gpu.toml", "--print", cwd=built["repo"]),
                 "run `frank compose stacks/gpu.toml`", "the image was built from lock")
    finally:
        stack.write_text(original)


def test_bad_inputs_are_one_line(built: dict[str, Path], tmp_path: Path) -> None:
    repo = built["repo"]
    one_line(frank("run", "stacks/smoke-cpu.toml", "--hub-cache", str(tmp_path / "none"),
                   cwd=repo), "no such folder to mount at /frank/hub")
    one_line(frank("run", "stacks/smoke-cpu.toml", "--hub-cache", str(tmp_path), cwd=repo),
             "config.json is not here")
    one_line(frank("run", "stacks/smoke-cpu.toml", "--print", "--env", "1X=2", cwd=repo),
             "--env", "not KEY=VALUE")
    one_line(frank("run", str(tmp_path), cwd=repo), "not an OCI layout")
    one_line(frank("run", "stacks/tiny.toml", "--print", "--hub-cache", str(tmp_path),
                   cwd=repo), "local directory", "--hub-cache")


# --- real runs through buildah ----------------------------------------------------------------


@needs_buildah
def test_launcher_in_the_image_finds_the_mounted_hub_cache(built: dict[str, Path]) -> None:
    before = frank_containers()
    result = frank("run", "stacks/smoke-cpu.toml", "--hub-cache", str(built["hub"]), "--",
                   "--print", cwd=built["repo"])
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    folder = f"/frank/hub/models--frank-test--tiny-llama/snapshots/{REVISION}"
    assert shown["weights"] == {"folder": folder, "part": "tiny-llama", "present": True,
                                "source": f"frank-test/tiny-llama@{REVISION}"}
    assert shown["command"][shown["command"].index("--model") + 1] == folder
    lock = json.loads((built["repo"] / "stacks/smoke-cpu.lock").read_text())
    assert shown["lock_digest"] == lock["digest"] and shown["env"]["HF_HUB_OFFLINE"] == "1"
    assert frank_containers() == before


def wait_for_line(proc: subprocess.Popen[str], needle: str, timeout: float) -> list[str]:
    assert proc.stderr is not None
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line and proc.poll() is not None:
            break
        seen.append(line.rstrip())
        if needle in line:
            return seen
    raise AssertionError(f"no {needle!r} in {seen}")


@needs_buildah
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_tiny_engine_serves_until_signalled_and_leaves_nothing(built: dict[str, Path],
                                                               signum: int) -> None:
    lock = json.loads((built["repo"] / "stacks/tiny.lock").read_text())
    port, folder = lock["flags"]["port"], lock["parts"][-1]["spec"]["path"]
    mark = uuid.uuid4().hex
    before = frank_containers()
    proc = subprocess.Popen([sys.executable, "-m", "frank", "run", "stacks/tiny.toml",
                             "--wait-ready", "60", "--env", f"FRANK_TEST_MARK={mark}"],
                            cwd=built["repo"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        wait_for_line(proc, "frank: ready: tiny image sha256:", 60)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
            body = json.loads(resp.read())
        # the folder mounted read-only at its locked path, the --env value inside
        assert body == {"model": folder, "mark": mark, "config": '{"hidden_size": 128}\n'}
        assert processes_mentioning(mark)  # buildah run, given the mark as --env
        proc.send_signal(signum)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert frank_containers() == before
    deadline = time.monotonic() + 5
    while processes_mentioning(mark) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not processes_mentioning(mark)


@needs_buildah
def test_an_engine_that_dies_first_is_one_line_quoting_it(built: dict[str, Path]) -> None:
    before = frank_containers()
    result = frank("run", "stacks/dying.toml", "--wait-ready", "60", cwd=built["repo"])
    line = one_line(result, "the container exited 3 before", "boom: this engine gives up")
    assert line == result.stderr.strip().splitlines()[-1]
    assert frank_containers() == before


@needs_buildah
def test_an_engine_that_never_answers_is_stopped_at_the_deadline(built: dict[str, Path]) -> None:
    lock = json.loads((built["repo"] / "stacks/silent.lock").read_text())
    before = frank_containers()
    start = time.monotonic()
    result = frank("run", "stacks/silent.toml", "--wait-ready", "4", cwd=built["repo"])
    one_line(result, "--wait-ready", "did not answer 200 within 4 s; stopped the container",
             "silent engine")
    assert time.monotonic() - start < 40
    assert frank_containers() == before
    assert not processes_mentioning(f"--port {lock['flags']['port']}")


# --- issue 53: a run killed by SIGKILL takes its engine with it; gc stops orphans -------------

def engine_root() -> str:
    out = subprocess.run([sys.executable, "-c", "from frank.assemble.engines import get_engine; "
                          "print(get_engine('buildah').root)"],
                         capture_output=True, text=True, check=True).stdout.strip()
    return out


def mounts_below(root: str) -> set[str]:
    """Mount points strictly below the engine storage's driver folder (a container's root);
    the driver folder's own bind mount stays between runs."""
    points = {line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()}
    return {p for p in points if p.startswith(root + "/") and p.count("/") > root.count("/") + 1}


def answers(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def holding(mark: str) -> list[int]:
    """Processes that name ``mark`` in their command line (the engine's client, given it as
    --env) or have it in their environment (everything in the container)."""
    out = set(processes_mentioning(mark))
    for p in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if p.name.isdigit() and mark.encode() in (p / "environ").read_bytes():
                out.add(int(p.name))
    out.discard(os.getpid())
    return sorted(out)


def kill_all(mark: str) -> None:
    """What a failed test left: the clients that name ``mark`` and all below them (the
    engine's command line does not name it)."""
    parents = {}
    for p in Path("/proc").iterdir():
        with contextlib.suppress(OSError, IndexError, ValueError):
            parents[int(p.name)] = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
    doomed = set(holding(mark))
    while grown := {pid for pid, up in parents.items() if up in doomed} - doomed:
        doomed |= grown
    for pid in doomed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def start_tiny(built: dict[str, Path], mark: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-m", "frank", "run", "stacks/tiny.toml",
                             "--wait-ready", "60", "--env", f"FRANK_TEST_MARK={mark}"],
                            cwd=built["repo"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    wait_for_line(proc, "frank: ready: tiny image sha256:", 60)
    return proc


def gone_within(seconds: float, *checks: object) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not all(c() for c in checks):  # type: ignore[operator]
        time.sleep(0.2)


@needs_buildah
def test_a_run_killed_by_sigkill_takes_its_engine_container_and_mounts(
        built: dict[str, Path]) -> None:
    """SIGKILL gives frank no chance to clean up: its watchdog (``run.watchdog``), which
    sees frank's end of a pipe close, stops the engine and removes the container."""
    port = json.loads((built["repo"] / "stacks/tiny.lock").read_text())["flags"]["port"]
    root, mark = engine_root(), uuid.uuid4().hex
    before, mounts = frank_containers(), mounts_below(engine_root())
    proc = start_tiny(built, mark)
    try:
        assert answers(port) and processes_mentioning(mark)
        proc.kill()
        proc.wait()
        gone_within(15, lambda: not holding(mark), lambda: not answers(port),
                    lambda: frank_containers() == before,
                    lambda: mounts_below(root) <= mounts)
        assert not holding(mark), "the engine outlived its frank run"
        assert not answers(port)
        assert frank_containers() == before
        assert mounts_below(root) <= mounts
    finally:
        kill_all(mark)


@needs_buildah
def test_gc_stops_an_engine_whose_run_is_gone_and_removes_its_container(
        built: dict[str, Path]) -> None:
    """The watchdog killed too (a whole session SIGKILLed): the engine is an orphan, named
    by a live process, its run's lock held by nobody. gc stops it, then removes it."""
    port = json.loads((built["repo"] / "stacks/tiny.lock").read_text())["flags"]["port"]
    mark = uuid.uuid4().hex
    before = frank_containers()
    proc = start_tiny(built, mark)
    try:
        for pid in processes_mentioning("frank.run.watchdog"):
            if str(proc.pid) in Path(f"/proc/{pid}/stat").read_text().split()[3:4]:
                os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.wait()
        time.sleep(2)
        assert answers(port) and holding(mark)  # an orphan, still serving
        # an earlier test of this session may have used the store in this process: its
        # shared hold would keep gc waiting (as it should for a live frank command)
        leave_users(Path(os.environ["FRANK_CACHE"]))
        result = frank("gc", "--keep-days", "100000", "--wait", "120", cwd=built["repo"],
                       timeout=300)
        assert result.returncode == 0, result.stderr
        assert "the engine of a run that was killed" in result.stdout, result.stdout
        assert not holding(mark) and not answers(port)
        assert frank_containers() == before
    finally:
        kill_all(mark)


def test_an_audit_record_nested_100000_deep_is_audited_again(built: dict[str, Path]) -> None:
    """Issue 53: a kept audit record nested deeper than the JSON reader copes with is no
    record (the image is audited again), not a line that names no file."""
    record = built["smoke-cpu"].parent / "audit.json"
    saved = record.read_bytes() if record.exists() else None
    record.write_text("[" * 100_000 + "]" * 100_000)
    try:
        result = frank("run", "stacks/smoke-cpu.toml", "--print", cwd=built["repo"])
        assert result.returncode == 0, result.stderr
        assert json.loads(record.read_text())["ok"] is True  # the new audit, recorded
    finally:
        if saved is None:
            record.unlink(missing_ok=True)
        else:
            record.write_bytes(saved)
