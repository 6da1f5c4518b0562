"""`frank diff` as a user reads it (issue 31, item 13): what an added or removed part is,
a part that only moved to another name, and history kept apart from what gets built."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.spine_helpers import frank


def diff_json(repo: Path, a: str, b: str) -> dict:
    result = frank("diff", a, b, "--json", cwd=repo)
    assert result.code == 0, result.err
    return json.loads(result.out)


def part(diff: dict, name: str) -> dict:
    return next(p for p in diff["parts"] if p["part"] == name)


def fields(entry: dict, key: str = "fields") -> dict:
    return {f["field"]: (f["old"], f["new"]) for f in entry[key]}


def test_added_part_shows_its_kind_and_inputs(repo: Path) -> None:
    rs8 = part(diff_json(repo, "served", "candidate"), "rs8")
    assert rs8["change"] == "added" and rs8["kind"] == "kernel"
    got = fields(rs8)
    assert got["spec.source"] == (None, "kernels/rs8")
    assert got["spec.replaces_op"] == (None, "_C::top_k_per_row_decode")
    assert got["spec.archs"] == (None, ["sm_120", "sm_90a"])
    tree = got["inputs.kernels/rs8"]
    assert tree[0] is None and len(tree[1]) == 64
    # history is apart from what gets built
    assert not any(k.startswith(("spec.summary", "spec.evidence", "spec.revert",
                                 "spec.provenance", "spec.status")) for k in got)
    history = fields(rs8, "history")
    assert history["status"] == (None, "candidate")
    assert history["revert.action"] == (None, "remove")
    assert "evidence.rule" in history and "summary" in history


def test_removed_part_shows_what_it_was(repo: Path) -> None:
    rs8 = part(diff_json(repo, "candidate", "served"), "rs8")
    assert rs8["change"] == "removed" and rs8["kind"] == "kernel"
    assert fields(rs8)["spec.source"] == ("kernels/rs8", None)
    assert fields(rs8, "history")["status"] == ("candidate", None)


def test_same_content_under_two_names(repo: Path) -> None:
    # the region cache plugin, copied under a new name, in place of the old one
    shutil.copytree(repo / "parts/region-cache", repo / "parts/prompt-cache")
    manifest = repo / "parts/prompt-cache/1.toml"
    manifest.write_text(manifest.read_text().replace('name = "region-cache"',
                                                     'name = "prompt-cache"'))
    (repo / "stacks/renamed.toml").write_text(
        'extends = "served.toml"\nremove = ["region-cache"]\n[add]\nprompt-cache = "1"\n')
    diff = diff_json(repo, "served", "stacks/renamed.toml")
    new, old = part(diff, "prompt-cache"), part(diff, "region-cache")
    assert new["change"] == "added" and old["change"] == "removed"
    assert new["same_content_as"] == "region-cache"
    assert old["same_content_as"] == "prompt-cache"
    assert "same_content_as" not in part(diff_json(repo, "served", "candidate"), "rs8")
    table = frank("diff", "served", "stacks/renamed.toml", cwd=repo)
    assert table.code == 0
    assert "same content as removed region-cache" in table.out, table.out
    assert "same content as added prompt-cache" in table.out


def test_history_only_change_is_not_a_build_change(repo: Path) -> None:
    manifest = repo / "parts/region-cache/1.toml"
    manifest.write_text(manifest.read_text().replace(
        'summary = "Bounded LRU', 'summary = "A bounded LRU'))
    # the shipped lock (the old summary) against the stack as it is now
    diff = diff_json(repo, "stacks/served.lock", "served")
    entry = part(diff, "region-cache")
    assert entry["change"] == "history"
    assert entry["fields"] == []
    assert list(fields(entry, "history")) == ["summary"]
    assert diff["same"]  # history is not in the digest
    assert all(x["state"] == "same" for x in diff["layers"] if x["layer"] != "frank:lock")


def test_table_keeps_history_apart(repo: Path) -> None:
    table = frank("diff", "served", "candidate", cwd=repo)
    assert table.code == 0, table.err
    out = table.out
    assert "added (kernel)" in out
    assert "spec.source" in out and "inputs.kernels/rs8" in out
    build, _, history = out.partition("part history")
    assert "spec.source" in build and "evidence.rule" not in build
    assert "evidence.rule" in history and "spec.source" not in history


def test_a_reader_that_stops_early_is_no_error(repo: Path) -> None:
    """`frank diff served candidate | head -1`: the pipe closes before frank is done writing;
    that is the reader's choice, not a failure to report (exit 141, as for SIGPIPE)."""
    import os
    import subprocess
    import sys

    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line
    try:
        proc = subprocess.run([sys.executable, "-m", "frank", "diff", "served", "candidate"],
                              cwd=repo, stdout=write_end, stderr=subprocess.PIPE, text=True,
                              timeout=120, check=False)
    finally:
        os.close(write_end)
    assert proc.stderr == ""
    assert proc.returncode == 141
