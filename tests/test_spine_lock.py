"""Resolve and lock: byte-identical, digest from content only, --check catches drift."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.spine_helpers import copy_repo, frank


def test_lock_is_byte_identical_across_runs_and_clones(tmp_path: Path) -> None:
    a, b = copy_repo(tmp_path / "a"), copy_repo(tmp_path / "clone-b")
    for stack in ("served", "candidate"):
        (a / "stacks" / f"{stack}.lock").unlink(missing_ok=True)
        (b / "stacks" / f"{stack}.lock").unlink(missing_ok=True)
    assert frank("lock", cwd=a).code == 0
    first = (a / "stacks/served.lock").read_bytes()
    assert frank("lock", cwd=a).code == 0
    assert (a / "stacks/served.lock").read_bytes() == first
    assert frank("lock", cwd=b).code == 0
    assert (b / "stacks/served.lock").read_bytes() == first
    assert (b / "stacks/candidate.lock").read_bytes() == (a / "stacks/candidate.lock").read_bytes()


def test_lock_records_every_input_hash(repo: Path) -> None:
    assert frank("lock", "stacks/candidate.toml", cwd=repo).code == 0
    lock = json.loads((repo / "stacks/candidate.lock").read_text())
    parts = {p["name"]: p for p in lock["parts"]}
    assert set(parts) >= {"vllm-base", "mhc-overlap", "region-cache", "expert-plan", "rs8"}
    assert parts["expert-plan"]["inputs"] == {
        "parts/expert-plan/own-traffic.plan.json":
            "0b38192e126d903f9e12daba72e1c703783cf21ca54b2f84a0559ece9fb054bd"}
    assert "kernels/rs8" in parts["rs8"]["inputs"]
    assert "plugins/region_cache" in parts["region-cache"]["inputs"]
    assert parts["mhc-overlap"]["inputs"]  # the patch's sha256 keys it
    for p in lock["parts"]:
        assert len(p["manifest_sha256"]) == 64
    assert lock["digest"].startswith("sha256:")


def test_digest_depends_on_content_not_name(repo: Path) -> None:
    shutil.copy(repo / "stacks/served.toml", repo / "stacks/same-as-served.toml")
    served = frank("lock", "--json", "stacks/served.toml", cwd=repo)
    twin = frank("lock", "--json", "stacks/same-as-served.toml", cwd=repo)
    assert json.loads(served.out)[0]["digest"] == json.loads(twin.out)[0]["digest"]
    candidate = frank("lock", "--json", "stacks/candidate.toml", cwd=repo)
    assert json.loads(candidate.out)[0]["digest"] != json.loads(served.out)[0]["digest"]


def test_comment_edit_keeps_digest_but_check_sees_it(repo: Path) -> None:
    assert frank("lock", cwd=repo).code == 0
    digest = json.loads((repo / "stacks/served.lock").read_text())["digest"]
    manifest = repo / "parts/cpu-experts-sched/2.toml"
    manifest.write_text("# a new comment\n" + manifest.read_text())
    check = frank("lock", "--check", cwd=repo)
    assert check.code == 1 and "served.lock: stale" in check.out
    assert frank("lock", cwd=repo).code == 0
    assert json.loads((repo / "stacks/served.lock").read_text())["digest"] == digest


def test_check_fails_when_an_input_changes(repo: Path) -> None:
    assert frank("lock", cwd=repo).code == 0
    assert frank("lock", "--check", cwd=repo).code == 0
    before = (repo / "stacks/candidate.lock").read_bytes()
    (repo / "kernels/rs8/EXTRA.txt").write_text("changes the kernel source tree\n")
    check = frank("lock", "--check", cwd=repo)
    assert check.code == 1
    assert "candidate.lock: stale" in check.out and "served.lock: up to date" in check.out
    assert (repo / "stacks/candidate.lock").read_bytes() == before  # --check writes nothing


def test_shipped_locks_are_current() -> None:
    from tests.spine_helpers import REPO

    result = frank("lock", "--check", cwd=REPO)
    assert result.code == 0, result.out + result.err


def test_check_trusts_the_pylock_only_as_the_lock_recorded_it(
        repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """lock --check takes the pylock's freshness from the stack's lock (its request and
    sha256) rather than parsing it; a pylock edited by hand, trailer kept, is still stale,
    and so is one whose lock records another request."""
    monkeypatch.setenv("FRANK_NO_ANSWER_CACHE", "1")
    assert frank("lock", "--check", "stacks/served.toml", cwd=repo).code == 0
    pylock = repo / "stacks/pylock.served.toml"
    text = pylock.read_text()
    first = text.index('sha256 = "') + len('sha256 = "')
    pylock.write_text(text[:first] + "0" + text[first + 1:])  # one wheel's hash
    edited = frank("lock", "--check", "stacks/served.toml", cwd=repo)
    assert edited.code == 1 and "served.lock: stale" in edited.out
    pylock.write_text(text)
    lock = repo / "stacks/served.lock"
    locked = lock.read_text()
    request = json.loads(locked)["python_closure"]["request"]
    lock.write_text(locked.replace(request, "0" * len(request)))
    other = frank("lock", "--check", "stacks/served.toml", cwd=repo)
    assert other.code == 1 and "served.lock: stale" in other.out
