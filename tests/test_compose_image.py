"""compose builds a real image: reproducible, one layer per change, revert rebuilds nothing,
and the image's own entrypoint prints exactly what the lock says."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import pytest

from tests.spine_helpers import frank


def compose(repo: Path, stack: str, out: Path | None = None) -> dict:
    args = ["compose", stack, "--json"] + (["--out", str(out)] if out else [])
    result = frank(*args, cwd=repo)
    assert result.code == 0, result.err
    return json.loads(result.out)


@pytest.mark.slow
def test_compose_smoke_image_is_reproducible_and_incremental(repo: Path, tmp_path: Path) -> None:
    first = compose(repo, "stacks/smoke-cpu.toml")
    assert first["image"]["builder"] == "oci"
    assert "no layer runs a command" in first["image"]["why"]
    digest = first["image"]["digest"]

    # Same lock, another output folder: same digest, nothing built again.
    again = compose(repo, "stacks/smoke-cpu.toml", tmp_path / "elsewhere")
    assert again["image"]["digest"] == digest and again["image"]["layers_built"] == 0

    # One part changes: exactly its layer and the lock layer are built again.
    manifest = repo / "parts/region-cache/1.toml"
    original = manifest.read_text()
    # a value never used before, so the shared layer cache cannot already hold the layer
    manifest.write_text(original.replace('"4096"', f'"{uuid.uuid4().int % 10**9}"'))
    changed = compose(repo, "stacks/smoke-cpu.toml")
    assert changed["image"]["digest"] != digest
    assert changed["image"]["layers_built"] == 2  # plugin:region-cache + frank:lock
    assert changed["image"]["layers_reused"] == len(changed["layers"]) - 2
    manifest.write_text(original)

    # A child adds a data part; reverting it gives back the child's earlier image.
    (repo / "stacks/smoke-plan.toml").write_text(
        'extends = "smoke-cpu.toml"\n[add]\nexpert-plan = "published"\n')
    with_plan = compose(repo, "stacks/smoke-plan.toml")
    assert "data:expert-plan" in [x["name"] for x in with_plan["layers"]]
    assert frank("revert", "expert-plan", "--stack", "stacks/smoke-plan.toml",
                 cwd=repo).code == 0
    (repo / "stacks/smoke-plan.toml").write_text('extends = "smoke-cpu.toml"\n')
    before = compose(repo, "stacks/smoke-plan.toml")
    (repo / "stacks/smoke-plan.toml").write_text(
        'extends = "smoke-cpu.toml"\n[add]\nexpert-plan = "published"\n')
    compose(repo, "stacks/smoke-plan.toml")
    assert frank("revert", "expert-plan", "--stack", "stacks/smoke-plan.toml",
                 cwd=repo).code == 0
    after = compose(repo, "stacks/smoke-plan.toml")
    assert after["image"]["digest"] == before["image"]["digest"]
    assert after["image"]["layers_built"] == 0


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("buildah") is None, reason="buildah not installed")
def test_image_entrypoint_prints_what_the_lock_says(repo: Path) -> None:
    from frank.assemble.engines import run_image

    summary = compose(repo, "stacks/smoke-cpu.toml")
    lock = json.loads((repo / "stacks/smoke-cpu.lock").read_text())
    run = run_image(Path(summary["image"]["layout"]), ["--print"])
    printed = json.loads(run.stdout)
    assert printed["lock_digest"] == lock["digest"]
    flags = printed["command"][len(lock["command"]) + 1:]
    assert printed["command"][:len(lock["command"])] == lock["command"]
    for key, value in lock["flags"].items():
        if value is True:
            assert f"--{key}" in flags
        else:
            assert flags[flags.index(f"--{key}") + 1] == str(value)
    assert printed["env"] == {**lock["env"], "VLLM_PLUGINS": ",".join(lock["plugins"])}
    # the plugin was installed into the image with its entry point
    inspect = frank("inspect", summary["image"]["layout"], "--json", cwd=repo)
    assert inspect.code == 0 and lock["digest"] in inspect.out
