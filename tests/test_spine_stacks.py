"""Stack inheritance rules and relations between parts: each violation names both sides."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.spine_helpers import frank


def child(repo: Path, body: str, name: str = "child") -> str:
    path = repo / "stacks" / f"{name}.toml"
    path.write_text('extends = "served.toml"\n' + body)
    return f"stacks/{name}.toml"


def locked(repo: Path, stack: str) -> dict:
    result = frank("lock", stack, cwd=repo)
    assert result.code == 0, result.err
    return json.loads((repo / stack).with_suffix(".lock").read_text())


def test_add_remove_replace_and_overrides(repo: Path) -> None:
    stack = child(repo, """remove = ["cpu-experts-sched"]
remove_flags = ["max-num-seqs"]
[add]
rs8 = "1"
[replace]
expert-plan = "published"
[flags]
port = 9000
[env]
EXTRA = "1"
[target]
gpus = 1
""")
    lock = locked(repo, stack)
    parts = {p["name"]: p["version"] for p in lock["parts"]}
    assert parts["rs8"] == "1" and parts["expert-plan"] == "published"
    assert "cpu-experts-sched" not in parts
    assert lock["flags"]["port"] == 9000 and "max-num-seqs" not in lock["flags"]
    assert lock["flags"]["tensor-parallel-size"] == 2  # inherited
    assert lock["env"]["EXTRA"] == "1" and "EXL3_CPU_EXPERTS_SCHED" not in lock["env"]
    assert lock["target"] == {"arch": "sm_120", "gpus": 1}


def test_layers_are_ordered_least_changed_first(repo: Path) -> None:
    lock = locked(repo, "stacks/candidate.toml")
    kinds = [p["kind"] for p in lock["parts"]]
    assert kinds.index("engine") < kinds.index("patch") < kinds.index("kernel") \
        < kinds.index("plugin") < kinds.index("data")


@pytest.mark.parametrize(("body", "message"), [
    ('[add]\nregion-cache = "1"\n', "add.region-cache: 'region-cache' is already in served.toml"),
    ('remove = ["rs8"]\n', "remove.rs8: 'rs8' is not in served.toml"),
    ('[replace]\nrs8 = "1"\n', "replace.rs8: 'rs8' is not in served.toml (use add)"),
    ('[replace]\nexpert-plan = "own-traffic"\n',
     "replace.expert-plan: 'expert-plan' is already at 'own-traffic' in served.toml"),
    ('remove = ["expert-plan"]\n[replace]\nexpert-plan = "published"\n',
     "replace.expert-plan: 'expert-plan' is in both remove and replace"),
    ('[parts]\nrs8 = "1"\n', "parts: a stack that extends another"),
    ('remove_env = ["NOPE"]\n', "remove_env: 'NOPE' is not an inherited variable"),
])
def test_inheritance_errors(repo: Path, body: str, message: str) -> None:
    result = frank("lock", child(repo, body), cwd=repo)
    assert result.code == 2
    assert f"stacks/child.toml: {message}" in result.err, result.err


def test_missing_requirement_names_both_sides(repo: Path) -> None:
    result = frank("lock", child(repo, 'remove = ["exl3-runtime"]\n'), cwd=repo)
    assert result.code == 2
    # the first dependent in the stack's order: exl3-ext (served's), else exl3-pack
    assert "exl3-ext requires exl3-runtime, which the stack lacks " \
           "(declared in parts/exl3-ext/1.toml)" in result.err, result.err


def test_conflict_names_both_sides(repo: Path) -> None:
    manifest = repo / "parts/rs8/1.toml"
    manifest.write_text(manifest.read_text().replace('replaces_op =',
                                                     'conflicts = ["region-cache"]\nreplaces_op ='))
    result = frank("lock", "stacks/candidate.toml", cwd=repo)
    assert result.code == 2
    assert "rs8 conflicts with region-cache (declared in parts/rs8/1.toml); " \
           "region-cache is set at parts.region-cache" in result.err


def test_two_parts_replacing_one_thing(repo: Path) -> None:
    manifest = repo / "parts/rs8/1.toml"
    manifest.write_text(manifest.read_text().replace(
        'replaces = "vllm:_C::top_k_per_row_decode"', 'replaces = "exl3:expert-placement"'))
    result = frank("lock", "stacks/candidate.toml", cwd=repo)
    assert result.code == 2
    assert "expert-plan and rs8 both replace 'exl3:expert-placement'" in result.err


def test_same_env_from_two_sources(repo: Path) -> None:
    stack = child(repo, '[env]\nEXL3_CPU_EXPERTS_SCHED = "1"\n')
    result = frank("lock", stack, cwd=repo)
    assert result.code == 2
    assert "variable EXL3_CPU_EXPERTS_SCHED is set by both child.toml [env] and " \
           "cpu-experts-sched" in result.err


def test_patch_must_apply_to_the_engine_commit(repo: Path) -> None:
    manifest = repo / "parts/mhc-overlap/moet-6cefd6fe.toml"
    manifest.write_text(manifest.read_text().replace(
        'applies_to = ["ee0da84ab9e04ac7610e28580af62c365e898389"]',
        'applies_to = ["' + "1" * 40 + '"]'))
    result = frank("lock", "stacks/served.toml", cwd=repo)
    assert result.code == 2
    assert "mhc-overlap applies to 1111111111111111111 but vllm-base is ee0da84ab9e04ac7610" \
        in result.err
