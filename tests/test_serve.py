"""`frank serve` and the image launcher: command line, environment, weights checks.

These run no engine: the stack's command is a tiny script that records how it was
started, so the launcher's exec, env and signal handling are exercised for real.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.local_hub import publish
from tests.fixtures.tiny_model import build_tiny_model
from tests.spine_helpers import frank, snapshot


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A hub cache holding the tiny model at the revision the tiny-llama part pins."""
    model = build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    cache = tmp_path_factory.mktemp("hub")
    revision = publish(model, cache, "frank-test/tiny-llama")
    assert revision == "e8a00a84f4fe6e411c6fa5e99bd2beb39182fcfd"  # the pinned one
    return cache


FAKE_ENGINE = """import json, os, sys
json.dump({"argv": sys.argv[1:], "env": {k: v for k, v in os.environ.items()
           if k.startswith(("VLLM_", "FRANK_", "HF_"))}}, open(os.environ["RECORD"], "w"))
"""


def fake_stack(repo: Path, tmp: Path) -> Path:
    """A child of smoke-cpu whose engine command is the recording script."""
    script = tmp / "engine.py"
    script.write_text(FAKE_ENGINE)
    stack = repo / "stacks/fake.toml"
    stack.write_text(f'extends = "smoke-cpu.toml"\ncommand = ["{sys.executable}", "{script}", '
                     '"--model"]\n[flags]\nport = 1\n')
    return stack


def serve(repo: Path, hub: Path, *args: str, record: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1",
           "RECORD": str(record)}
    return subprocess.run([sys.executable, "-m", "frank", "serve", *args], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=120)


def test_print_shows_command_and_env(repo: Path) -> None:
    assert frank("lock", "stacks/smoke-cpu.toml", cwd=repo).code == 0
    result = frank("serve", "stacks/smoke-cpu.toml", "--print", cwd=repo)
    assert result.code == 0, result.err
    shown = json.loads(result.out)
    assert shown["command"][:4] == ["python3", "-m", "vllm.entrypoints.openai.api_server",
                                    "--model"]
    assert "--served-model-name" in shown["command"] and "--enforce-eager" in shown["command"]
    assert shown["env"]["VLLM_PLUGINS"] == "region_cache"
    assert shown["env"]["FRANK_REGION_CACHE_MAX_ENTRIES"] == "4096"
    lock = json.loads((repo / "stacks/smoke-cpu.lock").read_text())
    assert shown["lock_digest"] == lock["digest"]


def test_serve_fetches_verifies_and_execs(repo: Path, hub: Path, tmp_path: Path) -> None:
    fake_stack(repo, tmp_path)
    record = tmp_path / "record.json"
    result = serve(repo, hub, "stacks/fake.toml", "--ready-timeout", "1", record=record)
    assert result.returncode == 0, result.stderr
    seen = json.loads(record.read_text())
    model = Path(seen["argv"][seen["argv"].index("--model") + 1])
    assert model.name == "e8a00a84f4fe6e411c6fa5e99bd2beb39182fcfd"
    assert (model / "model.safetensors").is_file()
    assert seen["env"]["VLLM_PLUGINS"] == "region_cache"


def test_serve_refuses_a_tampered_weight_file(repo: Path, hub: Path, tmp_path: Path) -> None:
    fake_stack(repo, tmp_path)
    snap = next(hub.glob("models--frank-test--tiny-llama/snapshots/*"))
    target = (snap / "config.json").resolve()
    original = target.read_bytes()
    try:
        target.write_bytes(original.replace(b"128", b"129", 1))
        record = tmp_path / "record.json"
        result = serve(repo, hub, "stacks/fake.toml", record=record)
        assert result.returncode == 2
        assert "config.json sha256 is" in result.stderr and "lock says 744bb0d1" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
        assert not record.exists()  # the engine never started
    finally:
        target.write_bytes(original)


def test_serve_refuses_missing_weights(repo: Path, tmp_path: Path) -> None:
    fake_stack(repo, tmp_path)
    record = tmp_path / "record.json"
    result = serve(repo, tmp_path / "empty-hub", "stacks/fake.toml", record=record)
    assert result.returncode == 2
    assert "are not in the hub cache and HF_HUB_OFFLINE=1" in result.stderr
    assert not record.exists()


def test_mutable_revision_never_reaches_the_launcher(repo: Path, hub: Path,
                                                     tmp_path: Path) -> None:
    fake_stack(repo, tmp_path)
    manifest = repo / "parts/tiny-llama/seed0.toml"
    manifest.write_text(manifest.read_text().replace(
        'revision = "e8a00a84f4fe6e411c6fa5e99bd2beb39182fcfd"', 'revision = "main"'))
    before = snapshot(repo)
    record = tmp_path / "record.json"
    result = serve(repo, hub, "stacks/fake.toml", record=record)
    assert result.returncode == 2 and "revision" in result.stderr
    assert not record.exists() and snapshot(repo) == before


def test_launcher_forwards_sigterm(repo: Path, hub: Path, tmp_path: Path) -> None:
    script = tmp_path / "sleeper.py"
    script.write_text("import signal, sys, time, os\n"
                      "signal.signal(signal.SIGTERM, lambda *a: (open(os.environ['RECORD'],"
                      "'w').write('term'), sys.exit(0)))\n"
                      "time.sleep(60)\n")
    (repo / "stacks/sleep.toml").write_text(
        f'extends = "smoke-cpu.toml"\ncommand = ["{sys.executable}", "{script}", "--model"]\n')
    record = tmp_path / "term.txt"
    env = {**os.environ, "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1", "RECORD": str(record)}
    proc = subprocess.Popen([sys.executable, "-m", "frank", "serve", "stacks/sleep.toml"],
                            cwd=repo, env=env, stderr=subprocess.PIPE, text=True)
    time.sleep(3)
    proc.terminate()
    assert proc.wait(timeout=30) == 0
    assert record.read_text() == "term"


def test_an_engine_killed_by_sigterm_exits_143_not_241(repo: Path, hub: Path,
                                                       tmp_path: Path) -> None:
    """An engine that does not handle SIGTERM dies of it: the launcher (frank serve, and the
    image's entrypoint) exits 128 + 15 as a shell would, not sys.exit(-15) = 241. One that
    stops cleanly exits 0 (test_launcher_forwards_sigterm)."""
    script = tmp_path / "plain.py"
    script.write_text("import os, time\nopen(os.environ['RECORD'], 'w').write('up')\n"
                      "time.sleep(60)\n")
    (repo / "stacks/plain.toml").write_text(
        f'extends = "smoke-cpu.toml"\ncommand = ["{sys.executable}", "{script}", "--model"]\n')
    record = tmp_path / "up.txt"
    env = {**os.environ, "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1", "RECORD": str(record)}
    proc = subprocess.Popen([sys.executable, "-m", "frank", "serve", "stacks/plain.toml"],
                            cwd=repo, env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not record.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert record.exists()
    proc.terminate()
    assert proc.wait(timeout=30) == 143
