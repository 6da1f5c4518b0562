"""ci/build-images for real: a local docker-registry, a copy of the repo, a fresh cache.

This is what `.ci/run` (through scripts/test) does for issue 6: it starts Debian's
docker-registry on 127.0.0.1, runs the same ci/build-images the GitHub workflow runs, and
checks the result from outside: smoke-cpu is in the registry by digest (skopeo inspect), its
entrypoint's --print ran and showed the lock's digest, served/candidate are reported as
"plan + context only" with their plan and Dockerfile written, a second run reuses the cache,
and a stale lock, a wrong lock digest and a missing registry setting each fail loudly.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.image.conftest import start_registry, stop
from tests.spine_helpers import REPO, copy_repo

SCRIPT = REPO / "ci" / "build-images"
REPO_NAME = "frank-ci"  # FRANK_REGISTRY is 127.0.0.1:PORT/frank-ci


@dataclass
class Run:
    """One run of ci/build-images."""

    code: int
    out: str
    err: str
    summary: dict[str, dict[str, str]]


def make_repo(dest: Path) -> Path:
    """A copy of the repo's stacks/parts/sources plus ci/, with locks matching that copy.

    The locks are written in the copy because other engineers' uncommitted edits to parts
    and plugins may leave the working tree's locks stale; this test is about the script.
    """
    root = copy_repo(dest)
    shutil.copytree(REPO / "ci", root / "ci", ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run([sys.executable, "-m", "frank", "lock"], cwd=root,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return root


def run_ci(root: Path, *args: str, cache: Path, registry: str | None,
           timeout: float = 1500, extra_env: dict[str, str] | None = None) -> Run:
    """Run the copy's ci/build-images as the workflow does; read its summary.tsv."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("FRANK_REGISTRY", "FRANK_BUILDER", "FRANK_ONLY_DAEMONLESS",
                        "FRANK_REQUIRE_ALL", "FRANK_CI_OUT", "GITHUB_STEP_SUMMARY",
                        "FRANK_CI_MAX_CLOSURE_GB")}
    env.update(FRANK_CACHE=str(cache), FRANK_PYTHON=sys.executable)
    if registry is not None:
        env["FRANK_REGISTRY"] = registry
    env.update(extra_env or {})
    proc = subprocess.run([str(root / "ci" / "build-images"), *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=timeout)
    summary: dict[str, dict[str, str]] = {}
    tsv = root / "out" / "ci" / "summary.tsv"
    if tsv.is_file():
        header, *rows = tsv.read_text().splitlines()
        keys = header.split("\t")
        for row in rows:
            rec = dict(zip(keys, row.split("\t"), strict=True))
            summary[rec["stack"]] = rec
    return Run(proc.returncode, proc.stdout, proc.stderr, summary)


def skopeo_digest(ref: str) -> str:
    """The manifest digest the registry serves for ``ref`` (read with skopeo)."""
    proc = subprocess.run(["skopeo", "inspect", "--tls-verify=false", f"docker://{ref}"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    digest: str = json.loads(proc.stdout)["Digest"]
    return digest


def lock_digest(root: Path, stack: str) -> str:
    """The digest recorded in the copy's stacks/<stack>.lock."""
    digest: str = json.loads((root / "stacks" / f"{stack}.lock").read_text())["digest"]
    return digest


def no_traceback(text: str) -> None:
    """Failures are one-line errors, never Python tracebacks."""
    assert "Traceback" not in text, text


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Debian's docker-registry on 127.0.0.1; yields the FRANK_REGISTRY value."""
    proc, addr = start_registry(tmp_path_factory.mktemp("ci-registry"))
    try:
        yield f"{addr}/{REPO_NAME}"
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh FRANK_CACHE for this module (the test base is built into it once, from .debs)."""
    d = tmp_path_factory.mktemp("ci-cache")
    yield d
    shutil.rmtree(d, ignore_errors=True)  # engine storage and the base: hundreds of MB


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, registry: str,
          cache: Path) -> tuple[Path, Run]:
    """Every stack through ci/build-images --only-daemonless, pushing to the local registry."""
    for tool in ("skopeo", "buildah", "gpgv"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed (scripts/setup installs it)")
    root = make_repo(tmp_path_factory.mktemp("ci-repo") / "repo")
    return root, run_ci(root, "--only-daemonless", "--max-closure-gb", "0", cache=cache,
                        registry=registry)


@pytest.mark.slow
def test_smoke_cpu_is_pushed_by_digest_and_print_checked(built: tuple[Path, Run],
                                                         registry: str) -> None:
    root, run = built
    assert run.code == 0, run.err
    no_traceback(run.err)
    rec = run.summary["smoke-cpu"]
    assert rec["status"] == "pushed", rec
    out = root / "out" / "ci" / "smoke-cpu"
    image = json.loads((out / "compose.json").read_text())["image"]
    digest = image["digest"]
    assert rec["image"] == f"{registry}@{digest}"
    assert rec["lock"] == lock_digest(root, "smoke-cpu")
    # In the registry by digest, and under the stack's tag, as the same manifest.
    assert skopeo_digest(f"{registry}@{digest}") == digest
    assert skopeo_digest(f"{registry}:smoke-cpu") == digest
    # The smoke check ran the pulled image's entrypoint with --print.
    shown = json.loads((out / "print.json").read_text())
    assert shown["lock_digest"] == lock_digest(root, "smoke-cpu")
    assert shown["command"][:2] == ["python3", "-m"]
    assert "--print ok" in rec["detail"]
    assert (out / "pulled" / "index.json").is_file()


@pytest.mark.slow
def test_stacks_over_the_closure_limit_are_reported_plan_only(built: tuple[Path, Run]) -> None:
    root, run = built
    assert run.code == 0, run.err
    stacks = {p.stem for p in (root / "stacks").glob("*.toml")
              if not p.name.startswith("pylock.")}
    planned = stacks - {"smoke-cpu"}  # every stack with a Python closure
    assert {"served", "candidate", "served-cpu", "recipe-sm120"} <= planned
    # recipe-sm120 runs commands (a source build, a post-install step): said as such
    rec = run.summary["recipe-sm120"]
    assert rec["status"] == "plan-only", rec
    assert "plan + context only (needs container engine and network: its plan runs " \
           "commands" in rec["detail"]
    assert "recipe-sm120: NOT BUILT: plan + context only" in run.err
    assert "FROM frank-0 AS build-flashinfer-jit-cache" in (
        root / "out/ci/recipe-sm120/compose/context/Dockerfile").read_text()
    for stack in sorted(planned - {"recipe-sm120"}):
        rec = run.summary[stack]
        assert rec["status"] == "plan-only", rec
        assert "plan + context only (its Python closure is" in rec["detail"]
        assert "GB of wheels, over --max-closure-gb 0)" in rec["detail"]
        assert f"{stack}: NOT BUILT: plan + context only" in run.err
        cout = root / "out" / "ci" / stack / "compose"
        plan = json.loads((cout / "plan.json").read_text())
        assert not any(layer["run"] for layer in plan["layers"])  # RUN-free: only too big
        assert "RUN " not in (cout / "context" / "Dockerfile").read_text()
        assert not (cout / "image").exists()
    # served's wheels: 3.76 GB since flashinfer-cubin (448 MB) left its closure (issue 51)
    assert float(run.summary["served"]["detail"].split(" is ")[1].split()[0]) > 3.5
    assert f"1 of {len(stacks)} stacks built and checked; {len(planned)} plan + context only" \
        in run.err
    assert set(run.summary) == stacks


def test_second_run_derives_the_same_image_and_finds_the_cache_sound(
        built: tuple[Path, Run], registry: str, cache: Path) -> None:
    root, first = built
    assert first.code == 0, first.err
    again = run_ci(root, "smoke-cpu", cache=cache, registry=registry)
    assert again.code == 0, again.err
    compose = json.loads((root / "out" / "ci" / "smoke-cpu" / "compose.json").read_text())
    # release mode (issue 53): every layer is derived again from the lock's pins in a
    # scratch store and compared with what the cache offers; the cache held no difference
    assert compose["release"] == {"cache_differences": []}, compose["release"]
    assert again.summary["smoke-cpu"]["image"] == first.summary["smoke-cpu"]["image"]
    assert set(again.summary) == {"smoke-cpu"}


@pytest.mark.slow
def test_wrong_lock_digest_fails_the_smoke_check(built: tuple[Path, Run], tmp_path: Path) -> None:
    root, run = built
    assert run.code == 0, run.err
    lock = json.loads((root / "stacks" / "smoke-cpu.lock").read_text())
    lock["digest"] = "sha256:" + "0" * 64
    wrong = tmp_path / "wrong.lock"
    wrong.write_text(json.dumps(lock))
    layout = root / "out" / "ci" / "smoke-cpu" / "compose" / "image"
    proc = subprocess.run([sys.executable, str(root / "ci" / "build_images_helper.py"),
                           "smoke-layout", str(layout), str(wrong), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1
    assert "shows lock sha256:" in proc.stderr and str(wrong) in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    no_traceback(proc.stderr)


def test_stale_lock_fails(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "repo")
    stack = root / "stacks" / "smoke-cpu.toml"
    stack.write_text(stack.read_text().replace("port = 8000", "port = 8001"))
    run = run_ci(root, "--only-daemonless", "--max-closure-gb", "0", "smoke-cpu", "served",
                 cache=tmp_path / "cache",
                 registry="127.0.0.1:9/frank-ci")  # never contacted: fails before any push
    assert run.code == 1, run.err
    no_traceback(run.err)
    assert run.summary["smoke-cpu"]["status"] == "failed"
    assert "stacks/smoke-cpu.lock is missing or stale" in run.summary["smoke-cpu"]["detail"]
    assert "error: smoke-cpu (stacks/smoke-cpu.toml): stacks/smoke-cpu.lock" in run.err
    assert "error: 1 of 2 stacks failed" in run.err
    # The other stack is still looked at, and reported.
    assert run.summary["served"]["status"] == "plan-only"
    assert not (root / "out" / "ci" / "smoke-cpu" / "compose").exists()


def test_require_all_fails_on_plan_only_stacks(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "repo")
    job_summary = tmp_path / "step-summary.md"
    run = run_ci(root, "--only-daemonless", "--max-closure-gb", "0", "--require-all", "served",
                 cache=tmp_path / "cache",
                 registry="127.0.0.1:9/frank-ci",
                 extra_env={"GITHUB_STEP_SUMMARY": str(job_summary)})
    assert run.code == 1, run.err
    assert "error: served (stacks/served.toml): plan + context only" in run.err
    assert "--require-all was given" in run.err
    no_traceback(run.err)
    # The GitHub job summary gets the same table, as markdown.
    table = job_summary.read_text()
    assert "| stack | status | lock | image | detail |" in table
    row = f"| served | plan-only | {lock_digest(root, 'served')} | - | plan + context only"
    assert row in table, table


def test_builder_none_writes_every_plan_and_pushes_nothing(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "repo")
    run = run_ci(root, cache=tmp_path / "cache", registry=None,
                 extra_env={"FRANK_BUILDER": "none"})
    assert run.code == 0, run.err
    assert {r["status"] for r in run.summary.values()} == {"plan-only"}
    stacks = {p.stem for p in (root / "stacks").glob("*.toml")
              if not p.name.startswith("pylock.")}
    assert set(run.summary) == stacks
    for stack in run.summary:
        cout = root / "out" / "ci" / stack / "compose"
        assert (cout / "plan.json").is_file() and (cout / "context" / "Dockerfile").is_file()
        assert (cout / "frank.lock").read_text() == (root / "stacks" / f"{stack}.lock").read_text()
        assert not (cout / "image").exists()
    n = len(stacks)
    assert f"0 of {n} stacks built and checked; {n} plan + context only" in run.err


@pytest.mark.parametrize(("args", "registry", "message"), [
    ((), None, "FRANK_REGISTRY is not set"),
    ((), "127.0.0.1:5000/Frank:latest", "not HOST[:PORT]/REPO"),
    (("no-such-stack",), "127.0.0.1:9/frank-ci", "stacks/no-such-stack.toml: no such stack"),
    (("--bogus",), "127.0.0.1:9/frank-ci", "unknown option --bogus"),
])
def test_usage_errors_are_one_line(tmp_path: Path, args: tuple[str, ...], registry: str | None,
                                   message: str) -> None:
    run = run_ci(REPO, *args, cache=tmp_path / "cache", registry=registry, timeout=60)
    assert run.code == 2, run.err
    lines = run.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ci/build-images: error: "), run.err
    assert message in lines[0]
