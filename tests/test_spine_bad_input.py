"""Every bad input: one line naming the file and the field, exit 2, no traceback, no write."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.spine_helpers import frank, snapshot


def edit(path: str, old: str, new: str) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        target = root / path
        text = target.read_text()
        assert old in text, f"{old!r} not in {path}"
        target.write_text(text.replace(old, new, 1))
    return apply


def write(path: str, text: str) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return apply


SCHED = "parts/cpu-experts-sched/2.toml"
PLAN = "parts/expert-plan/own-traffic.toml"
BASE = "parts/vllm-base/v0.24.0.toml"
PACK = "parts/exl3-pack/2bpw-982b7045.toml"

CASES: dict[str, tuple[Callable[[Path], None], str, str]] = {
    # name: (break the repo, file named, field named)
    "toml-syntax": (edit(SCHED, 'status = "served"', 'status = "served'), SCHED,
                    "TOML syntax error"),
    "unknown-field": (edit(SCHED, 'status = "served"', 'status = "served"\ncolour = "red"'),
                      SCHED, "colour: unknown field"),
    "wrong-type": (edit("stacks/served.toml", "gpus = 2", 'gpus = "two"'),
                   "stacks/served.toml", "target.gpus"),
    "missing-file": (edit(PLAN, "own-traffic.plan.json", "gone.plan.json"), PLAN,
                     "source.path"),
    "hash-mismatch": (edit("parts/expert-plan/own-traffic.plan.json", '"layers"', '"layers" '),
                      PLAN, "sha256: sha256 mismatch"),
    "short-commit": (edit(BASE, "ee0da84ab9e04ac7610e28580af62c365e898389", "ee0da84ab"),
                     BASE, "commit"),
    "non-hex-commit": (edit(BASE, "ee0da84ab9e04ac7610e28580af62c365e898389",
                            "zz0da84ab9e04ac7610e28580af62c365e898389"), BASE, "commit"),
    "branch-as-revision": (edit(PACK, "982b70452f399814f56b46272fd30394ae10d58c", "main"),
                           PACK, "revision"),
    "path-escapes-repo": (edit(PLAN, 'path = "parts/expert-plan/own-traffic.plan.json"',
                               'path = "../../etc/passwd"'), PLAN, "escapes the repo"),
    "unknown-part": (edit("stacks/served.toml", 'region-cache = "1"', 'region-cache = "9"'),
                     "stacks/served.toml", "parts.region-cache"),
    "inheritance-cycle": (lambda root: (
        write("stacks/loop-a.toml", 'extends = "loop-b.toml"\n')(root),
        write("stacks/loop-b.toml", 'extends = "loop-a.toml"\n')(root)),
        "stacks/loop-", "extends: inheritance cycle: loop-"),
    "tag-only-base-image": (write("images/bookworm-python-cc.toml",  # served's base
                                  'name = "x"\nref = "debian:bookworm-slim"\n'),
                            "images/bookworm-python-cc.toml", "ref"),
    "unknown-kind": (edit(SCHED, 'kind = "env"', 'kind = "envv"'), SCHED, "kind"),
    "name-not-folder": (edit(SCHED, 'name = "cpu-experts-sched"', 'name = "sched"'), SCHED,
                        "name"),
    "revert-without-to": (edit(PLAN, 'to = "published"\n', ""), PLAN, "revert"),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("command", [("lock",), ("compose", "stacks/candidate.toml")])
def test_bad_input_is_one_clear_line(repo: Path, case: str, command: tuple[str, ...]) -> None:
    breaker, file_named, field_named = CASES[case]
    assert frank("lock", cwd=repo).code == 0
    breaker(repo)
    if case == "inheritance-cycle" and command[0] == "compose":
        command = ("compose", "stacks/loop-a.toml")
    before = snapshot(repo)
    result = frank(*command, cwd=repo)
    assert result.code == 2, result
    lines = result.err.strip().splitlines()
    assert len(lines) == 1, result.err
    assert "Traceback" not in result.err
    assert lines[0].startswith("frank: error: ")
    assert file_named in lines[0] and field_named in lines[0], lines[0]
    assert snapshot(repo) == before  # nothing written or changed


def test_check_validates_every_manifest(repo: Path) -> None:
    assert frank("check", cwd=repo).code == 0
    edit("parts/splitk-reduce/1.toml", 'status = "parked"', 'status = "served"')(repo)
    result = frank("check", cwd=repo)
    assert result.code == 2
    assert re.search(r"parts/splitk-reduce/1\.toml: source is required for a served part",
                     result.err), result.err


def test_parked_part_cannot_enter_a_stack(repo: Path) -> None:
    edit("stacks/candidate.toml", 'rs8 = "1"', 'rs8 = "1"\nworker-isolation = "1"')(repo)
    result = frank("lock", "stacks/candidate.toml", cwd=repo)
    assert result.code == 2
    assert "candidate.toml: add.worker-isolation: worker-isolation 1 is parked and has no " \
           "variables" in result.err
