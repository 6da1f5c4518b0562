"""`frank warm` then `frank run` of a real image: the engine starts from the warm cache.

One image (served-cpu-compiled with enforce-eager, so the test does not wait for Inductor: the
warm cache then holds vLLM's model info, bytecode and the rest of its caches), two engine
starts: `frank warm` makes the artifact with the workload the stack names (``[warm]``: one
request of one token, the smallest), and `frank run` says "warm cache sha256:... (made on
...)" and the engine reads the folder the artifact unpacked into. The refusals (a cut or
corrupted layer, another device, another image, a forged manifest, a missing or foreign
signature) are tests/test_warm_cache.py's and tests/test_warm_sign.py's, without an engine:
what they decide is the ready line's note, which this start shows reaching the ready line.
Slow (a build and two engine starts); it needs buildah.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.local_hub import publish
from tests.fixtures.tiny_model import build_tiny_model
from tests.spine_helpers import copy_repo
from tests.vllm_server import free_port

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("buildah") is None, reason="needs buildah")]

STACK = "stacks/warm-e2e.toml"


def cli(root: Path, *args: str, timeout: float = 1200) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "frank", *args], cwd=root, text=True,
                          capture_output=True, timeout=timeout, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def ready_line(root: Path, hub: Path, log: Path) -> str:
    """Start `frank run`, return its ready line, stop it (SIGTERM, exit 0 or 143)."""
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "frank", "run", STACK, "--hub-cache",
                                 str(hub), "--wait-ready", "600"], cwd=root, stdout=out,
                                stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 660
        line = ""
        while time.monotonic() < deadline and not line:
            found = re.search(r"^frank: ready: .*$", log.read_text(errors="replace"), re.M)
            line = found.group(0) if found else ""
            if proc.poll() is not None:
                break
            time.sleep(1)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    assert line, log.read_text(errors="replace")[-3000:]
    return line


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, object]]:
    base = tmp_path_factory.mktemp("warm-start")
    root = copy_repo(base / "repo")
    (root / STACK).write_text('extends = "served-cpu-compiled.toml"\n'
                              f"[flags]\nport = {free_port()}\nenforce-eager = true\n"
                              "[warm]\nprompts = [8]\nmax_tokens = 1\n")
    cli(root, "lock", STACK)
    cli(root, "compose", STACK)
    publish(build_tiny_model(base / "model"), base / "hub", "frank-test/tiny-llama")
    out = cli(root, "warm", STACK, "--hub-cache", str(base / "hub"), "--json")
    return root, base / "hub", json.loads(out.stdout)


def test_run_starts_from_the_warm_cache(made: tuple[Path, Path, dict[str, object]],
                                        tmp_path: Path) -> None:
    root, hub, art = made
    store = Path(os.environ["FRANK_CACHE"])
    entry = store / "warm" / str(art["image"]).split(":")[1] / str(art["device_key"])
    assert entry.read_text().strip() == art["artifact"]
    assert art["workload"] == {"prompts": [8], "max_tokens": 1} and art["requests"] == 1
    line = ready_line(root, hub, tmp_path / "warm.log")
    assert f"; warm cache {art['artifact']} (made on {art['made_on']}" in line, line
