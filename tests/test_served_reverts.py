"""Issue 31 item 14: every seed part of served is one step back, or says why it is not.

Each revert runs in a private copy of the repo through the real CLI, then the stack
composes (plan + Dockerfile context, ``--builder none``) and its lock checks. The patch
comes out without an edit of the engine part; the base pin has no step back and says so;
a part others require names every dependent and goes back with them in one step
(``--with-dependents``, one history entry), and ``--undo`` steps forward again.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.spine_helpers import frank

SEED = ["mhc-overlap", "exl3-runtime", "exl3-pack", "cpu-experts-sched", "region-cache",
        "expert-plan", "exl3-ext"]  # exl3-ext: issue 52's extension, built on the host


def history(repo: Path) -> list[dict]:  # type: ignore[type-arg]
    path = repo / "stacks" / "served.history.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() \
        else []


@pytest.mark.parametrize("name", SEED)
def test_each_seed_part_of_served_reverts_in_one_step_and_composes(
        repo: Path, name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # an empty cache and no mirror: the undo must not need the mhc-overlap patch's bytes
    # (its URL is unreachable here) to re-check the touches_compiled the revert took out
    monkeypatch.setenv("FRANK_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.delenv("FRANK_MIRROR", raising=False)
    before = json.loads((repo / "stacks/served.lock").read_text())["digest"]
    engine = (repo / "parts/vllm-base/v0.24.0.toml").read_bytes()
    args = ["revert", name, "--stack", "stacks/served.toml", "--json"]
    if name == "exl3-runtime":
        args.append("--with-dependents")
    done = frank(*args, cwd=repo)
    if done.code != 0 and "resolving the Python closure failed" in done.err \
            and ("Failed to fetch" in done.err or "dns" in done.err.lower()):
        pytest.skip("PyPI is not reachable (the closure changes): " + done.err[:200])
    assert done.code == 0, done.err
    out = json.loads(done.out)
    assert out["digest_before"] == before and out["digest_after"] != before
    assert (repo / "parts/vllm-base/v0.24.0.toml").read_bytes() == engine  # no engine edit
    assert len(history(repo)) == 1
    assert frank("lock", "--check", cwd=repo).code == 0
    composed = frank("compose", "stacks/served.toml", "--locked", "--builder", "none",
                     "--out", str(tmp_path / "out"), cwd=repo)
    assert composed.code == 0, composed.err
    lock = json.loads((tmp_path / "out/frank.lock").read_text())
    assert lock["digest"] == out["digest_after"]
    names = {p["name"] for p in lock["parts"]}
    if name == "expert-plan":  # a version step: back to the published plan
        assert next(p for p in lock["parts"] if p["name"] == name)["version"] == "published"
    else:
        assert name not in names
    if name == "exl3-runtime":
        assert "exl3-pack" not in names and "exl3-ext" not in names
        assert out["with_dependents"] == ["exl3-ext", "exl3-pack"]
        assert history(repo)[0]["with_dependents"] == ["exl3-ext@1", "exl3-pack@2bpw-982b7045"]
    # and one step forward again
    undo = frank("revert", "--undo", "--stack", "stacks/served.toml", "--json", cwd=repo)
    assert undo.code == 0, undo.err
    assert json.loads(undo.out)["digest_after"] == before
    assert json.loads((repo / "stacks/served.lock").read_text())["digest"] == before
    assert frank("lock", "--check", cwd=repo).code == 0


def test_the_base_pin_says_it_has_no_step_back(repo: Path) -> None:
    before = (repo / "stacks/served.toml").read_bytes()
    for extra in ((), ("--with-dependents",)):
        done = frank("revert", "vllm-base", "--stack", "stacks/served.toml", *extra, cwd=repo)
        assert done.code == 2
        assert done.err.startswith("frank: error: parts/vllm-base/v0.24.0.toml: revert.action: "
                                   "vllm-base v0.24.0 cannot be reverted: the engine base has "
                                   "no step back")
        assert len(done.err.strip().splitlines()) == 1
    assert (repo / "stacks/served.toml").read_bytes() == before
    assert history(repo) == []


def test_a_required_part_names_every_dependent_and_offers_the_chain(repo: Path) -> None:
    before = (repo / "stacks/served.toml").read_bytes()
    done = frank("revert", "exl3-runtime", "--stack", "stacks/served.toml", cwd=repo)
    assert done.code == 2
    assert done.err.strip() == (
        "frank: error: stacks/served.toml: parts.exl3-runtime: exl3-runtime is required by "
        "exl3-ext (requires exl3-runtime), exl3-pack (requires exl3-runtime): revert them "
        "together with --with-dependents (one step back, one history entry)")
    assert (repo / "stacks/served.toml").read_bytes() == before


def test_dependents_are_found_through_the_chain(repo: Path) -> None:
    """A part required by a part that is itself required: both named, nearest first."""
    from frank.history.revert import dependents_of

    assert dependents_of("a", {"a": [], "b": ["a"], "c": ["b"], "d": ["x"]}) == ["b", "c"]
    assert dependents_of("vllm-base", {"mhc-overlap": ["vllm-base"],
                                       "exl3-runtime": ["vllm-base"],
                                       "exl3-pack": ["exl3-runtime"]}) == \
        ["exl3-runtime", "mhc-overlap", "exl3-pack"]


def test_a_dry_run_that_moves_the_closure_writes_nothing(repo: Path) -> None:
    """Taking exl3-runtime back changes the Python closure: it is resolved in a temp copy,
    so a dry run (or a refusal) leaves every file as it was."""
    files = {p: p.read_bytes() for p in (repo / "stacks").iterdir()}
    done = frank("revert", "exl3-runtime", "--with-dependents", "--dry-run", "--json",
                 "--stack", "stacks/served.toml", cwd=repo)
    if done.code != 0 and ("Failed to fetch" in done.err or "dns" in done.err.lower()):
        pytest.skip("PyPI is not reachable: " + done.err[:200])
    assert done.code == 0, done.err
    assert {c["distribution"] for c in json.loads(done.out)["diff"]["closure"]} >= {"exllamav3"}
    assert {p: p.read_bytes() for p in (repo / "stacks").iterdir()} == files
