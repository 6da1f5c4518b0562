"""Read commands start fast (issue 31, item 15) and a kept answer is never a wrong one.

`frank lock --check` and `frank diff` keep their answer with everything the work read
(frank.store.memo); these tests change each kind of thing an answer depends on and check that
the next run sees it, and that a run whose inputs did not change imports no pydantic.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest

from frank.cli import COMMANDS, SUMMARIES, cli
from tests.spine_helpers import frank


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache of answers of this test's own."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("FRANK_CACHE_DIR", str(folder))
    monkeypatch.delenv("FRANK_NO_ANSWER_CACHE", raising=False)
    return folder


def imports(repo: Path, *args: str) -> tuple[int, set[str]]:
    """Exit code and the top-level modules a frank run imported."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "frank", *args],
                          cwd=repo, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200"})
    mods = {line.rsplit("|", 1)[-1].strip().split(".")[0]
            for line in proc.stderr.splitlines() if line.startswith("import time:")}
    return proc.returncode, mods


def settled() -> None:
    """Let file times move past the window in which a kept answer is refused as racy."""
    time.sleep(0.12)


def test_a_kept_answer_imports_no_pydantic(repo: Path, cache: Path) -> None:
    settled()
    for args in (("lock", "--check", "stacks/served.toml"), ("diff", "served", "candidate")):
        code, first = imports(repo, *args)
        assert "pydantic" in first  # worked out
        code2, again = imports(repo, *args)
        assert code2 == code
        assert "pydantic" not in again and "rich" not in again and "tomlkit" not in again
    assert len(list(cache.glob("answers/*.json"))) == 2


def test_no_answer_cache_works_everything_out(repo: Path, cache: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRANK_NO_ANSWER_CACHE", "1")
    settled()
    for _ in range(2):
        assert "pydantic" in imports(repo, "lock", "--check", "stacks/served.toml")[1]
    assert not cache.exists()


def check(repo: Path) -> int:
    return frank("lock", "--check", "stacks/served.toml", cwd=repo).code


@pytest.mark.parametrize("change", [
    "manifest-history", "data-file", "tree-file-added", "tree-mode", "stack-file",
    "base-image", "pylock",
])
def test_lock_check_sees_every_change(repo: Path, cache: Path, change: str) -> None:
    assert frank("lock", "stacks/served.toml", cwd=repo).code == 0
    settled()
    assert check(repo) == 0 and check(repo) == 0  # the second from the kept answer
    plugin = repo / "plugins/region_cache/frank_region_cache"
    if change == "manifest-history":  # not in the digest, but in the lock's text
        path = repo / "parts/region-cache/1.toml"
        path.write_text(path.read_text().replace('summary = "Bounded', 'summary = "A bounded'))
    elif change == "data-file":
        path = repo / "parts/expert-plan/own-traffic.plan.json"
        path.write_text(path.read_text() + " ")
        path = repo / "parts/expert-plan/own-traffic.toml"
        text = path.read_text()
        path.write_text(text.replace(text.split('sha256 = "')[1].split('"')[0],
                                     __import__("hashlib").sha256(
                                         (repo / "parts/expert-plan/own-traffic.plan.json")
                                         .read_bytes()).hexdigest()))
    elif change == "tree-file-added":
        (plugin / "extra.py").write_text("X = 1\n")
    elif change == "tree-mode":
        (plugin / "core.py").chmod(0o755)
    elif change == "stack-file":
        path = repo / "stacks/served.toml"
        path.write_text(path.read_text().replace("port = 8000", "port = 8001"))
    elif change == "base-image":
        path = repo / "images/bookworm-python-cc.toml"  # served's base
        path.write_text(path.read_text() + "\n# a comment changes the definition's hash\n")
    elif change == "pylock":
        path = repo / "stacks/pylock.served.toml"
        path.write_text(path.read_text() + "\n")
    assert check(repo) == 1
    assert frank("lock", "stacks/served.toml", cwd=repo).code == 0
    settled()
    assert check(repo) == 0 and check(repo) == 0


def test_a_file_beside_one_read_is_seen(repo: Path, cache: Path) -> None:
    """setup.py next to a plugin's pyproject.toml makes the plugin unbuildable: a kept
    'up to date' must not hide that."""
    settled()
    assert check(repo) == 0 and check(repo) == 0
    (repo / "plugins/region_cache/setup.py").write_text("raise SystemExit\n")
    result = frank("lock", "--check", "stacks/served.toml", cwd=repo)
    assert result.code == 2 and "setup.py" in result.err


def test_errors_are_never_kept(repo: Path, cache: Path) -> None:
    path = repo / "parts/region-cache/1.toml"
    path.write_text(path.read_text().replace('status = "served"', 'status = "served'))
    settled()
    for _ in range(2):
        result = frank("lock", "--check", "stacks/served.toml", cwd=repo)
        assert result.code == 2 and "TOML syntax error" in result.err
    assert not list(cache.glob("answers/*.json"))


def test_diff_sees_a_change(repo: Path, cache: Path) -> None:
    settled()
    before = json.loads(frank("diff", "served", "candidate", "--json", cwd=repo).out)
    assert json.loads(frank("diff", "served", "candidate", "--json", cwd=repo).out) == before
    path = repo / "stacks/candidate.toml"
    path.write_text(path.read_text() + '[flags]\nport = 9000\n')
    after = json.loads(frank("diff", "served", "candidate", "--json", cwd=repo).out)
    assert {"field": "flags.port", "old": 8000, "new": 9000} in after["config"]
    assert after != before


def test_help_lists_commands_without_importing_them(repo: Path) -> None:
    code, mods = imports(repo, "--help")
    assert code == 0 and "pydantic" not in mods
    ctx = click.Context(cli)
    for name in COMMANDS:  # the summaries are each command's own first paragraph
        command = cli.get_command(ctx, name)
        assert command is not None and command.help is not None
        assert " ".join(command.help.split("\n\n")[0].split()) == SUMMARIES[name], name
    assert set(SUMMARIES) == set(COMMANDS)


def test_the_answer_folder_stays_small(tmp_path: Path) -> None:
    from frank.store import memo

    folder = tmp_path / "answers"
    folder.mkdir()
    for n in range(memo.KEEP):
        (folder / f"{n:04d}.json").write_text("{}")
        os.utime(folder / f"{n:04d}.json", ns=(n * 10**9, n * 10**9))
    memo._keep(folder / "new.json", {"format": memo.FORMAT})
    left = sorted(p.name for p in folder.glob("*.json"))
    assert len(left) == memo.KEEP + 1 - (memo.KEEP + 1) // 2
    assert "new.json" in left and "0000.json" not in left


def test_work_that_writes_runs_or_reads_a_fresh_file_is_not_kept(
        tmp_path: Path, cache: Path) -> None:
    from frank.store import memo

    data = tmp_path / "in" / "data.txt"  # not beside the cache: its folder is listed
    data.parent.mkdir()
    data.write_text("one")
    calls: list[str] = []

    def reads() -> str:
        calls.append("reads")
        return data.read_text()

    assert memo.answer("t", ["fresh"], reads) == "one"  # written just now: racy, not kept
    assert not list(cache.glob("answers/*.json"))
    settled()
    assert memo.answer("t", ["read"], reads) == "one"
    assert memo.answer("t", ["read"], reads) == "one"
    assert calls == ["reads", "reads"]  # the third came from the kept answer
    data.write_text("two")
    assert memo.answer("t", ["read"], reads) == "two"

    def writes() -> int:
        return (tmp_path / "out.txt").write_text("x")

    def runs() -> int:
        return subprocess.run(["true"], check=True).returncode

    for name, work in (("writes", writes), ("runs", runs)):
        memo.answer("t", [name], work)
        assert not (cache / "answers").exists() or \
            len(list(cache.glob("answers/*.json"))) == 1, name


def test_frank_cache_alone_keeps_answers_out_of_the_home_folder(
        repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 53: with FRANK_CACHE set (and nothing else), `lock --check` and `diff` keep
    their answers there; the home folder (watched: it must stay empty) gets nothing."""
    home, store = tmp_path / "home", tmp_path / "store"
    home.mkdir()
    for var in ("FRANK_CACHE_DIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME",
                "FRANK_NO_ANSWER_CACHE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("FRANK_CACHE", str(store))
    settled()
    for args in (("lock", "--check", "stacks/served.toml"), ("diff", "served", "candidate")):
        result = frank(*args, cwd=repo)
        assert result.code in (0, 1), result.err
    assert sorted(home.rglob("*")) == []
    assert len(list(store.glob("answers/*.json"))) == 2
