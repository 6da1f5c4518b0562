"""Issue 40's silent wrong answers at the inputs: a binary folder's ignored files (B6), arch
names that are typos and parts that cannot run on the stack's GPU (B7)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.spine_helpers import frank

BINARY = """kind = "binary"
name = "probe"
version = "1"
summary = "a folder of prebuilt GPU code"
status = "candidate"
path = "{path}"
archs = [{archs}]
dest = "/opt/frank/probe"

[provenance]
credits = ["tests"]
licence = "Apache-2.0"

[revert]
action = "remove"
"""


def _probe(repo: Path, archs: str, base: str = "smoke-cpu") -> Path:
    folder = repo / "parts" / "probe" / "files"
    folder.mkdir(parents=True)
    (folder / "kernel.cubin").write_bytes(b"\x7fELF stand-in")
    (folder / "README").write_text("what the folder holds\n")
    manifest = repo / "parts" / "probe" / "1.toml"
    manifest.write_text(BINARY.format(path="parts/probe/files", archs=archs))
    (repo / "stacks" / "probed.toml").write_text(
        f'extends = "{base}.toml"\n[add]\nprobe = "1"\n')
    return manifest


def test_a_binary_folder_whose_files_git_ignores_is_refused_by_name(repo: Path) -> None:
    _probe(repo, '"sm_120"')
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / ".git" / "info" / "exclude").write_text("*.cubin\n")
    result = frank("check", cwd=repo)
    assert result.code == 2, result.out
    line = result.err.strip().splitlines()[-1]
    assert "parts/probe/1.toml" in line and "path" in line
    assert "kernel.cubin would be left out of the image" in line
    # un-ignored, the same folder is accepted and hashes both files
    (repo / ".git" / "info" / "exclude").write_text("")
    assert frank("check", cwd=repo).code == 0


def test_an_arch_name_of_no_real_gpu_is_refused(repo: Path) -> None:
    manifest = _probe(repo, '"sm_12"')
    result = frank("check", cwd=repo)
    assert result.code == 2
    line = result.err.strip().splitlines()[-1]
    assert str(manifest.relative_to(repo)) in line and "archs" in line
    assert "compute capability 1.2, which no NVIDIA GPU has" in line
    manifest.write_text(manifest.read_text().replace('"sm_12"', '"sm_80a"'))
    line = frank("check", cwd=repo).err.strip().splitlines()[-1]
    assert "the 'a' suffix exists from compute capability 9.0 on" in line


def test_a_part_whose_archs_cannot_run_on_the_target_is_refused(repo: Path) -> None:
    manifest = _probe(repo, '"sm_90a", "sm_100f"', base="served")
    result = frank("check", cwd=repo)
    assert result.code == 2, result.out
    line = result.err.strip().splitlines()[-1]
    assert str(manifest.relative_to(repo)) in line and "archs" in line
    assert "none of its archs (sm_90a, sm_100f) runs on the stack's target sm_120" in line
    # one arch that runs on 12.0 is enough: family code for 12.x
    manifest.write_text(manifest.read_text().replace('"sm_90a", "sm_100f"',
                                                     '"sm_90a", "sm_120f"'))
    assert frank("check", cwd=repo).code == 0


def test_the_lock_lists_every_step_the_plan_runs_in_a_container(repo: Path) -> None:
    """B5: on the official-image path a Python-only patch is applied with `patch` inside the
    image; the lock's impure list says so, exactly as the plan runs it."""
    import hashlib
    import json

    from tests.test_spine_answers import image_stack, manifest

    folder = repo / "parts" / "py-op"
    folder.mkdir()
    diff = "--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1,1 +1,2 @@\n a = 1\n+b = 2\n"
    (folder / "x.patch").write_text(diff)
    (folder / "1.toml").write_text(manifest("patch", "py-op", f'''source_repo = "https://github.com/vllm-project/vllm"
file = "parts/py-op/x.patch"
sha256 = "{hashlib.sha256(diff.encode()).hexdigest()}"
applies_to = ["ee0da84ab9e04ac7610e28580af62c365e898389"]
touches_compiled = false'''))
    stack = image_stack(repo, "vllm-openai-v0.24.0", patches=("py-op",))
    result = frank("compose", stack, "--builder", "none", "--json", cwd=repo)
    assert result.code == 0, result.err
    plan = json.loads((Path(json.loads(result.out)["out"]) / "plan.json").read_text())
    lock = json.loads((repo / "stacks" / "img.lock").read_text())
    runs = {x["name"] for x in plan["layers"] if x["run"] or x["pip_install"] or x["stage"]}
    listed = {":".join(line.split(":")[:2]) for line in lock["impure"]}
    assert runs == {"patch:py-op"}
    assert listed == runs
    assert "applied with patch to the installed engine in the image" in lock["impure"][0]
