"""Issue 31: what published SM120 recipes do, each a typed, hashed, diffable, revertible part.

Items 1-6 (a package built from git in a builder stage, overrides/remove in diff and
revert, a binary folder, a post-install step, arch spellings, import checks), 9 and 10
(URL patches held to their touches_compiled claim in lock; one patch under two names) and
the example stack recipe-sm120. Item 14 (served's one-step reverts) is in
tests/test_served_reverts.py.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from frank.errors import FrankError
from frank.hashing import sha256_bytes
from frank.model.archs import parse_arch, spell_archs
from frank.model.kinds.base import PartContext
from tests.spine_helpers import frank

COMMON = """
[provenance]
licence = "Apache-2.0"

[revert]
action = "remove"
"""


def part(root: Path, name: str, version: str, body: str) -> Path:
    path = root / "parts" / name / f"{version}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'name = "{name}"\nversion = "{version}"\nsummary = "s"\n'
                    f'status = "candidate"\n' + textwrap.dedent(body) + COMMON)
    return path


def child(root: Path, name: str, add: dict[str, str], extra: str = "") -> Path:
    path = root / "stacks" / f"{name}.toml"
    lines = "\n".join(f'{k} = "{v}"' for k, v in add.items())
    path.write_text(f'extends = "served.toml"\n{extra}\n[add]\n{lines}\n')
    return path


def compose_none(root: Path, stack: str, out: Path) -> tuple[dict, str]:  # type: ignore[type-arg]
    done = frank("compose", f"stacks/{stack}.toml", "--builder", "none", "--out", str(out),
                 cwd=root)
    assert done.code == 0, done.err
    plan = json.loads((out / "plan.json").read_text())
    return plan, (out / "context" / "Dockerfile").read_text()


def layer(plan: dict, name: str) -> dict:  # type: ignore[type-arg]
    return next(x for x in plan["layers"] if x["name"] == name)


# --- item 5: arch spellings ---------------------------------------------------------------

@pytest.mark.parametrize(("arch", "nvcc", "torch", "flashinfer", "gencode"), [
    ("sm_120", "120", "12.0", "12.0", "-gencode=arch=compute_120,code=sm_120"),
    ("sm_120a", "120a", "12.0a", "12.0a", "-gencode=arch=compute_120a,code=sm_120a"),
    ("sm_120f", "120f", "12.0f", "12.0f", "-gencode=arch=compute_120f,code=sm_120f"),
    ("12.0f", "120f", "12.0f", "12.0f", "-gencode=arch=compute_120f,code=sm_120f"),
    ("9.0a", "90a", "9.0a", "9.0a", "-gencode=arch=compute_90a,code=sm_90a"),
])
def test_arch_names_are_converted_for_each_tool(arch: str, nvcc: str, torch: str,
                                                flashinfer: str, gencode: str) -> None:
    assert spell_archs([arch], "nvcc") == nvcc
    assert spell_archs([arch], "torch") == torch
    assert spell_archs([arch], "flashinfer") == flashinfer
    assert spell_archs([arch], "gencode") == gencode
    assert parse_arch(arch) == parse_arch(f"sm_{nvcc}")


def test_arch_lists_join_as_each_tool_reads_them() -> None:
    archs = ["sm_120f", "9.0a", "sm_120f"]  # a duplicate in two spellings is one arch
    assert spell_archs(archs, "torch") == "12.0f;9.0a"
    assert spell_archs(archs, "flashinfer") == "12.0f 9.0a"
    assert spell_archs(archs, "cmake") == "120f;90a"
    assert spell_archs(["12.0f", "sm_120f"], "nvcc") == "120f"


@pytest.mark.parametrize("bad", ["sm_1", "sm120", "12", "12.0b", "sm_120af", "12.0+f"])
def test_a_wrong_arch_name_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="is not a CUDA arch"):
        parse_arch(bad)


def test_kernel_and_engine_take_either_spelling() -> None:
    from frank.model.kinds.engine import torch_arch_list
    from frank.model.kinds.kernel import Kernel

    k = Kernel.model_validate({
        "kind": "kernel", "name": "k", "version": "1", "summary": "s", "status": "parked",
        "archs": ["sm_120f", "9.0a"], "replaces_op": "x", "build": "true",
        "provenance": {"licence": "MIT"}, "revert": {"action": "remove"}})
    assert k.nvcc_archs() == "120f 90a"
    assert torch_arch_list(["sm_120a", "12.0f", "8.6+PTX"]) == "12.0a;12.0f;8.6+PTX"


# --- item 1: a package built from a git commit in a builder stage ---------------------------

def git(*args: str, cwd: Path) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}
    return subprocess.run(["git", "-c", "protocol.file.allow=always", *args], cwd=cwd,
                          env=env, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def source_repo(repo: Path) -> tuple[Path, str]:
    """A local git repo with a submodule, inside the repo (a local git source must be): a
    pure-Python package a builder stage can build."""
    sub = repo / "sources" / "sub"
    sub.mkdir(parents=True)
    git("init", "-q", "-b", "main", cwd=sub)
    (sub / "data.txt").write_text("from the submodule\n")
    git("add", ".", cwd=sub)
    git("commit", "-qm", "sub", cwd=sub)
    top = repo / "sources" / "src-repo"
    (top / "pkg" / "demo_pkg").mkdir(parents=True)
    (top / "pkg" / "demo_pkg" / "__init__.py").write_text("VALUE = 31\n")
    (top / "pkg" / "pyproject.toml").write_text(textwrap.dedent("""\
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "demo-pkg"
        version = "0.1.0"
        [tool.setuptools]
        packages = ["demo_pkg"]
        """))
    git("init", "-q", "-b", "main", cwd=top)
    git("submodule", "add", "-q", str(sub), "third_party/sub", cwd=top)
    git("add", ".", cwd=top)
    git("commit", "-qm", "top", cwd=top)
    return top, git("rev-parse", "HEAD", cwd=top)


FULL_BUILD = """\
        submodules = true
        [build]
        system_packages = ["build-essential", "cmake"]
        requires = ["wheel==0.45.1"]
        isolation = false
        archs = ["sm_120f", "sm_120a"]
        [build.arch_env]
        FLASHINFER_CUDA_ARCH_LIST = "flashinfer"
        TORCH_CUDA_ARCH_LIST = "torch"
        [build.variables]
        MAX_JOBS = "4"
        [check]
        imports = ["demo_pkg"]
"""


def source_part(root: Path, repo: Path, commit: str, extra: str = "",
                build: str = FULL_BUILD) -> None:
    """A package part built from ``repo`` at ``commit``; ``build`` is the rest of its
    [git] table and what follows (its [build])."""
    part(root, "demo-src", "1", f"""\
        kind = "package"
        distribution = "demo-pkg"
        requires = ["vllm-base"]
        [git]
        repo = "file://{repo}"
        commit = "{commit}"
        subdirectory = "pkg"
{build.rstrip()}
        {extra}""")


def test_source_build_composes_offline_with_its_commit_in_the_lock(
        repo: Path, source_repo: tuple[Path, str], tmp_path: Path) -> None:
    src, commit = source_repo
    source_part(repo, src, commit)
    child(repo, "srcbuild", {"demo-src": "1"})
    assert frank("lock", "stacks/srcbuild.toml", cwd=repo).code == 0
    lock = json.loads((repo / "stacks" / "srcbuild.lock").read_text())
    locked = next(p for p in lock["parts"] if p["name"] == "demo-src")
    assert locked["inputs"] == {f"git+file://{src}": commit}  # the commit is in the lock
    assert any(s.startswith("package:demo-src: wheel built from git") and commit in s
               for s in lock["impure"])
    plan, dockerfile = compose_none(repo, "srcbuild", tmp_path / "out")
    stage = layer(plan, "package:demo-src")["stage"]
    assert stage["outputs"] == ["/opt/frank/wheels/demo-src"]
    run = " && ".join(stage["run"])
    # a base of pinned .debs has no apt source list: the stage writes Debian's before apt runs
    from frank.model.kinds.package import APT_SOURCES

    assert stage["run"].index(APT_SOURCES) < next(
        i for i, s in enumerate(stage["run"]) if s.startswith("apt-get update"))
    assert "apt-get install -y -qq --no-install-recommends ca-certificates " \
           "build-essential cmake" in run
    assert "pip install wheel==0.45.1" in run
    # the source is frank's checkout on the host, copied into the stage: no git inside
    assert stage["source"] == {"repo": f"file://{src}", "commit": commit, "submodules": True,
                               "dest": "/opt/frank/src/demo-src"}
    assert "git " not in run
    assert "FLASHINFER_CUDA_ARCH_LIST='12.0f 12.0a'" in run
    assert "TORCH_CUDA_ARCH_LIST='12.0f;12.0a'" in run
    assert "pip wheel --no-deps --no-build-isolation" in run
    assert "sha256sum -- *.whl > SHA256SUMS" in run
    assert stage["then"] == ["cd /opt/frank/wheels/demo-src && sha256sum -c --quiet SHA256SUMS "
                             "&& pip install --no-deps /opt/frank/wheels/demo-src/*.whl"]
    # the builder stage starts from the image so far; only the wheel folder comes out of it
    assert "FROM frank-0 AS build-demo-src" in dockerfile
    stage_text = dockerfile[dockerfile.index("AS build-demo-src"):]
    assert stage_text.index("COPY layers/") < stage_text.index("RUN ")
    # what a container build stages there first: frank's checkout at the stage's path
    from frank.assemble.builder import _check_out_source
    from frank.assemble.context import layer_dir
    from frank.assemble.plan import BuildPlan

    planned = next(x for x in BuildPlan.model_validate(plan).layers
                   if x.name == "package:demo-src")
    rootfs = tmp_path / "ctx" / "layers" / layer_dir(planned) / "rootfs"
    _check_out_source(planned, repo, rootfs, tmp_path / "build.log", tmp_path / "store")
    assert f"COPY layers/{layer_dir(planned)}/rootfs/ /" in stage_text
    assert (rootfs / "opt/frank/src/demo-src/pkg/demo_pkg/__init__.py").is_file()
    assert (rootfs / "opt/frank/src/demo-src/third_party/sub/data.txt").is_file()
    assert "COPY --from=build-demo-src /opt/frank/wheels/demo-src /opt/frank/wheels/demo-src" \
        in dockerfile
    assert plan["checks"]["demo-src"] == [["python3", "-c", "import demo_pkg"]]
    # the engine's closure leaves the distribution to the built wheel
    assert "demo-pkg" not in (repo / "stacks" / "pylock.srcbuild.toml").read_text()


def test_builder_stage_commands_build_the_pinned_commit_with_submodules(
        repo: Path, source_repo: tuple[Path, str], tmp_path: Path) -> None:
    """frank's checkout of the source on the host, then the stage's own commands (less
    apt-get and the build requires, which need the network) run by sh: the wheel is built
    at the pinned commit, with its submodule, hashed, then checked and installed --no-deps."""
    from frank.model.kinds.package import Package, SourceBuild, source_build_layer
    from frank.store import gitsource

    src, commit = source_repo
    source_part(repo, src, commit)
    (src / "pkg/demo_pkg/__init__.py").write_text("VALUE = 99\n")  # a commit after the pin
    git("commit", "-qam", "later", cwd=src)
    pkg = Package.model_validate(__import__("tomllib").loads(
        (repo / "parts/demo-src/1.toml").read_text()))
    assert pkg.git is not None and pkg.build is not None
    build = SourceBuild.model_validate({**pkg.build.model_dump(), "system_packages": [],
                                        "requires": []})
    stage = source_build_layer("demo-src", pkg.git, build).stage
    assert stage is not None and stage.source is not None
    prefix = tmp_path / "img"
    log = tmp_path / "git.log"
    gitsource.checkout(stage.source.repo, stage.source.commit, True,
                       prefix / stage.source.dest.lstrip("/"), root=repo,
                       cache=tmp_path / "cache", log=log)
    from frank.model.kinds.package import APT_SOURCES

    steps = [s.replace("/opt/frank", str(prefix / "opt/frank")) for s in stage.run
             if not s.startswith("apt-get") and s != APT_SOURCES]
    then = [s.replace("/opt/frank", str(prefix / "opt/frank")) for s in stage.then]
    then = [s.replace("pip install --no-deps", f"pip install --no-deps --target {prefix}/site")
            for s in then]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "protocol.file.allow",
           "GIT_CONFIG_VALUE_0": "always", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    done = subprocess.run(["sh", "-ec", " && ".join(steps + then)], env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    built = prefix / "opt/frank/src/demo-src"
    assert not (built / ".git").exists()  # a plain tree, at the pinned commit
    assert (built / "pkg/demo_pkg/__init__.py").read_text() == "VALUE = 31\n"
    assert (built / "third_party/sub/data.txt").read_text() == "from the submodule\n"
    wheels = list((prefix / "opt/frank/wheels/demo-src").glob("*.whl"))
    assert len(wheels) == 1
    sums = (prefix / "opt/frank/wheels/demo-src/SHA256SUMS").read_text().split()
    assert sums[0] == sha256_bytes(wheels[0].read_bytes())
    assert (prefix / "site/demo_pkg/__init__.py").read_text() == "VALUE = 31\n"
    # a wheel changed after it was hashed is not installed
    wheels[0].write_bytes(wheels[0].read_bytes() + b"x")
    again = subprocess.run(["sh", "-ec", " && ".join(then)], env=env, capture_output=True,
                           text=True)
    assert again.returncode != 0


def test_a_git_source_is_checked_out_on_the_host_only_as_pinned(
        repo: Path, source_repo: tuple[Path, str], tmp_path: Path) -> None:
    from frank.store import gitsource

    src, commit = source_repo
    log = tmp_path / "git.log"
    with pytest.raises(FrankError, match=r"checking out|fetching commit"):
        gitsource.checkout(f"file://{src}", "0" * 40, False, tmp_path / "a", root=repo,
                           cache=tmp_path / "cache", log=log)
    assert not (tmp_path / "a").exists()
    # a local source must be inside the repo, at lock time and when it is checked out
    outside = tmp_path / "elsewhere"
    shutil.copytree(src, outside)
    with pytest.raises(FrankError, match="outside the repo"):
        gitsource.checkout(f"file://{outside}", commit, False, tmp_path / "b", root=repo,
                           cache=tmp_path / "cache", log=log)
    (repo / "sources/link").symlink_to(outside)  # a link inside pointing out is outside too
    with pytest.raises(FrankError, match="outside the repo"):
        gitsource.checkout(f"file://{repo}/sources/link", commit, False, tmp_path / "c",
                           root=repo, cache=tmp_path / "cache", log=log)
    source_part(repo, outside, commit)
    child(repo, "srcbuild", {"demo-src": "1"})
    refused = frank("lock", "stacks/srcbuild.toml", cwd=repo)
    assert refused.code == 2 and "git.repo" in refused.err and "outside the repo" in refused.err
    # the same commit twice: the second checkout comes from frank's cache, fetching nothing
    gitsource.checkout(f"file://{src}", commit, True, tmp_path / "d", root=repo,
                       cache=tmp_path / "cache", log=log)
    before = log.read_text().count("$ git fetch")
    gitsource.checkout(f"file://{src}", commit, True, tmp_path / "e", root=repo,
                       cache=tmp_path / "cache", log=log)
    assert log.read_text().count("$ git fetch") == before
    assert (tmp_path / "e/third_party/sub/data.txt").read_text() == "from the submodule\n"


def test_an_unfetchable_source_stops_the_build_first_naming_the_kept_log(
        repo: Path, source_repo: tuple[Path, str], tmp_path: Path) -> None:
    """The source is checked out before any wheel is fetched or the base is made; the
    error is one line, and the log it names is the one kept beside the output."""
    src, _ = source_repo
    source_part(repo, src, "0" * 40)
    child(repo, "srcbuild", {"demo-src": "1"})
    assert frank("lock", "stacks/srcbuild.toml", cwd=repo).code == 0
    out = tmp_path / "out"
    failed = frank("compose", "stacks/srcbuild.toml", "--builder", "buildah", "--out",
                   str(out), cwd=repo)
    assert failed.code == 2 and len(failed.err.strip().splitlines()) == 1
    assert f"fetching commit {'0' * 40} of file://{src} failed" in failed.err
    assert failed.err.rstrip().endswith(f"(log {out / 'build.log'})")
    assert "$ git fetch" in (out / "build.log").read_text()


def test_source_build_declarations_are_checked() -> None:
    from pydantic import ValidationError

    from frank.model.kinds.package import SourceBuild

    for bad, why in [({"requires": ["wheel>=0.45"]}, "pinned to one version with =="),
                     ({"system_packages": ["cmake; rm -rf /"]}, "Debian package name"),
                     ({"archs": ["sm_120f"]}, "archs and arch_env together"),
                     ({"archs": ["sm_120f"], "arch_env": {"X": "cuda"}}, "X"),
                     ({"variables": {"A": "one\ntwo"}}, "A")]:
        with pytest.raises(ValidationError, match=why):
            SourceBuild.model_validate(bad)


# --- item 2: overrides and remove, in diff and revertible ----------------------------------

def test_overrides_and_removals_show_in_diff_and_revert(repo: Path) -> None:
    """A package part that forces another flashinfer-python than vLLM 0.24.0 pins and
    uninstalls flashinfer-cubin: diff names both distributions, and one revert takes the
    part back to its base's exact closure and digest (locking it resolves with uv: PyPI)."""
    part(repo, "fi-swap", "1", """\
        kind = "package"
        distribution = "flashinfer-python"
        overrides = ["flashinfer-python==0.6.11"]
        remove = ["flashinfer-cubin"]
        """)
    # served itself moves FlashInfer (parts/flashinfer, drop-flashinfer-cubin/2, the AOT
    # modules): the part is tried on served without that move, the engine's own pins
    (repo / "stacks/base.toml").write_text(
        'extends = "served.toml"\nremove = ["flashinfer", "flashinfer-aot", '
        '"drop-flashinfer-cubin"]\n')
    (repo / "stacks/swapped.toml").write_text('extends = "base.toml"\n[add]\nfi-swap = "1"\n')
    done = frank("lock", "stacks/base.toml", "stacks/swapped.toml", cwd=repo)
    if done.code != 0 and ("Failed to fetch" in done.err or "dns" in done.err.lower()):
        pytest.skip("PyPI is not reachable: " + done.err.strip()[:200])
    assert done.code == 0, done.err
    diff = frank("diff", "base", "swapped", "--json", cwd=repo)
    assert diff.code == 0, diff.err
    closure = {c["distribution"]: (c["old"], c["new"]) for c in json.loads(diff.out)["closure"]}
    assert closure["flashinfer-python"] == ("0.6.12", "0.6.11")
    assert closure["flashinfer-cubin"] == ("0.6.12", None)
    shown = frank("diff", "base", "swapped", cwd=repo).out
    assert "flashinfer-cubin: removed" in shown and "flashinfer-python: version" in shown
    back = frank("revert", "fi-swap", "--stack", "stacks/swapped.toml", cwd=repo)
    assert back.code == 0, back.err
    assert "closure flashinfer-cubin: - -> 0.6.12" in back.out
    base = json.loads((repo / "stacks/base.lock").read_text())["digest"]
    assert json.loads((repo / "stacks/swapped.lock").read_text())["digest"] == base
    assert (repo / "stacks/pylock.swapped.toml").read_bytes() == \
        (repo / "stacks/pylock.base.toml").read_bytes()
    assert frank("lock", "--check", "stacks/swapped.toml", cwd=repo).code == 0


# --- item 3: a binary folder -------------------------------------------------------------

def binary_folder(repo: Path, sha: str | None = None) -> Path:
    folder = repo / "parts" / "cubins" / "tree"
    (folder / "sm120").mkdir(parents=True, exist_ok=True)
    for i in range(3):
        (folder / "sm120" / f"k{i}.cubin").write_bytes(bytes([i]) * 64)
    if not (folder / "current").is_symlink():
        (folder / "current").symlink_to("sm120")
    part(repo, "cubins", "1", f"""\
        kind = "binary"
        path = "parts/cubins/tree"
        archs = ["sm_120f"]
        dest = "/opt/frank/cubins"
        env_var = "FLASHINFER_CUBIN_DIR"
        {f'sha256 = "{sha}"' if sha else ''}
        """)
    return folder


def test_binary_folder_is_hashed_as_a_tree_placed_and_pointed_at(repo: Path,
                                                                 tmp_path: Path) -> None:
    from frank.hashing import sha256_tree

    folder = binary_folder(repo)
    child(repo, "cubins", {"cubins": "1"})
    assert frank("lock", "stacks/cubins.toml", cwd=repo).code == 0
    lock = json.loads((repo / "stacks/cubins.lock").read_text())
    locked = next(p for p in lock["parts"] if p["name"] == "cubins")
    assert locked["inputs"] == {"parts/cubins/tree/": sha256_tree(folder)}
    assert lock["env"]["FLASHINFER_CUBIN_DIR"] == "/opt/frank/cubins"
    plan, dockerfile = compose_none(repo, "cubins", tmp_path / "out")
    x = layer(plan, "binary:cubins")
    assert x["files"] == [{"src": "parts/cubins/tree", "dest": "/opt/frank/cubins"}]
    rootfs = next((tmp_path / "out/context/layers").glob("*-binary-cubins")) / "rootfs"
    placed = rootfs / "opt/frank/cubins"
    assert sorted(p.name for p in (placed / "sm120").iterdir()) == \
        ["k0.cubin", "k1.cubin", "k2.cubin"]
    assert (placed / "current").is_symlink() and os.readlink(placed / "current") == "sm120"
    assert 'FLASHINFER_CUBIN_DIR="/opt/frank/cubins"' in dockerfile
    # one changed file is another tree, another key
    (folder / "sm120" / "k1.cubin").write_bytes(b"changed")
    assert frank("lock", "--check", "stacks/cubins.toml", cwd=repo).code == 1


def test_binary_folder_pinned_hash_link_out_and_missing_path(repo: Path) -> None:
    from frank.hashing import sha256_tree
    from frank.model.kinds.binary import Binary

    folder = binary_folder(repo)
    good = sha256_tree(folder)
    ctx = PartContext(root=repo, manifest=repo / "parts/cubins/1.toml")

    def make(**kw: object) -> Binary:
        return Binary.model_validate({
            "kind": "binary", "name": "cubins", "version": "1", "summary": "s",
            "status": "candidate", "archs": ["sm_120"], "dest": "/opt/c",
            "path": "parts/cubins/tree", "provenance": {"licence": "MIT"},
            "revert": {"action": "remove"}, **kw})

    assert make(sha256=good).inputs(ctx) == {"parts/cubins/tree/": good}
    with pytest.raises(FrankError) as bad:
        make(sha256="0" * 64).inputs(ctx)
    assert bad.value.field == "sha256" and "tree hash mismatch" in bad.value.message
    with pytest.raises(FrankError) as gone:
        make(path="parts/cubins/nothing").inputs(ctx)
    assert gone.value.field == "path"
    (folder / "escape").symlink_to("../../../../etc")
    with pytest.raises(FrankError) as out:
        make().inputs(ctx)
    assert out.value.field == "path" and "escape" in out.value.message


# --- item 4: a post-install step -----------------------------------------------------------

def step_part(repo: Path, outputs: list[str], removes: list[str] | None = None,
              run: str = "python3 gen.py", workdir: str | None = None) -> None:
    (repo / "parts" / "jit-step" / "src").mkdir(parents=True, exist_ok=True)
    (repo / "parts/jit-step/src/gen.py").write_text("print('generate')\n")
    part(repo, "jit-step", "1", f"""\
        kind = "step"
        run = {json.dumps(run)}
        {f'workdir = "{workdir}"' if workdir else ''}
        outputs = {json.dumps(outputs)}
        removes = {json.dumps(removes or [])}
        archs = ["sm_120a"]
        [[inputs]]
        path = "parts/jit-step/src"
        dest = "/opt/frank/steps/jit-step"
        [arch_env]
        TORCH_CUDA_ARCH_LIST = "torch"
        """)


def test_step_runs_in_a_stage_and_only_its_outputs_land(repo: Path, tmp_path: Path) -> None:
    step_part(repo, ["/opt/frank/jit/cache"], removes=["/usr/lib/python3/dist-packages/x.py"])
    child(repo, "stepped", {"jit-step": "1"})
    assert frank("lock", "stacks/stepped.toml", cwd=repo).code == 0
    lock = json.loads((repo / "stacks/stepped.lock").read_text())
    assert any(s.startswith("step:jit-step: runs in a container") for s in lock["impure"])
    plan, dockerfile = compose_none(repo, "stepped", tmp_path / "out")
    x = layer(plan, "step:jit-step")
    assert x["impure"] and x["stage"]["outputs"] == ["/opt/frank/jit/cache"]
    assert "TORCH_CUDA_ARCH_LIST=12.0a /bin/sh -c 'python3 gen.py'" in " ".join(x["stage"]["run"])
    stage_at = dockerfile.index("AS build-jit-step")
    after = dockerfile[stage_at:]
    # inputs go into the step's stage only; the final chain takes the output and nothing else
    assert after.index("COPY layers/") < after.index("FROM frank-0 AS frank-1")
    assert "COPY --from=build-jit-step /opt/frank/jit/cache /opt/frank/jit/cache" in after
    assert "rm -rf -- /usr/lib/python3/dist-packages/x.py" in after
    # cached by its inputs: the same inputs give the same key, a changed input another
    again, _ = compose_none(repo, "stepped", tmp_path / "out2")
    assert layer(again, "step:jit-step")["key"] == x["key"]
    (repo / "parts/jit-step/src/gen.py").write_text("print('other')\n")
    assert frank("lock", "stacks/stepped.toml", cwd=repo).code == 0
    changed, _ = compose_none(repo, "stepped", tmp_path / "out3")
    assert layer(changed, "step:jit-step")["key"] != x["key"]


def test_step_key_covers_the_layers_below(repo: Path, tmp_path: Path) -> None:
    step_part(repo, ["/opt/frank/jit/cache"])
    child(repo, "stepped", {"jit-step": "1"})
    assert frank("lock", "stacks/stepped.toml", cwd=repo).code == 0
    first, _ = compose_none(repo, "stepped", tmp_path / "a")
    plan_file = repo / "parts/expert-plan/own-traffic.plan.json"  # a layer below the step
    text = plan_file.read_text()
    plan_file.write_text(text.replace('"layers"', '"layers" ', 1))
    manifest = repo / "parts/expert-plan/own-traffic.toml"
    manifest.write_text(__import__("re").sub(
        r'sha256 = "[0-9a-f]{64}"', f'sha256 = "{sha256_bytes(plan_file.read_bytes())}"',
        manifest.read_text(), count=1))
    assert frank("lock", cwd=repo).code == 0
    second, _ = compose_none(repo, "stepped", tmp_path / "b")
    assert layer(second, "step:jit-step")["inputs"] == layer(first, "step:jit-step")["inputs"]
    assert layer(second, "step:jit-step")["key"] != layer(first, "step:jit-step")["key"]
    # the base image is below every layer: another base, another key (kept outputs are
    # found by it: a JIT cache made on one base is never taken for another)
    child(repo, "stepped", {"jit-step": "1"}, extra='[image]\nbase = "bookworm-build"\n')
    assert frank("lock", "stacks/stepped.toml", cwd=repo).code == 0
    third, _ = compose_none(repo, "stepped", tmp_path / "c")
    assert layer(third, "step:jit-step")["key"] != layer(second, "step:jit-step")["key"]


def run_stage(stage_run: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", " && ".join(stage_run)], capture_output=True, text=True)


def test_only_a_build_that_runs_network_commands_keeps_the_network(repo: Path,
                                                                    tmp_path: Path) -> None:
    """A post-install step runs offline: its container build is cut off the network. A
    source build's git clone, apt-get and pip need it; the shipped served stacks run nothing
    in a container at all."""
    from frank.assemble.builder import needs_network
    from frank.assemble.plan import BuildPlan

    step_part(repo, ["/opt/frank/jit/cache"])
    child(repo, "stepped", {"jit-step": "1"})
    assert frank("lock", "stacks/stepped.toml", cwd=repo).code == 0
    stepped, _ = compose_none(repo, "stepped", tmp_path / "out")
    assert not needs_network(BuildPlan.model_validate(stepped))
    recipe, _ = compose_none(repo, "recipe-sm120", tmp_path / "recipe")
    assert layer(recipe, "package:flashinfer-jit-cache")["network"]
    assert not layer(recipe, "step:sm120-probe-ext")["network"]
    assert needs_network(BuildPlan.model_validate(recipe))
    served, _ = compose_none(repo, "served", tmp_path / "served")
    assert not needs_network(BuildPlan.model_validate(served))
    lock = json.loads((repo / "stacks/recipe-sm120.lock").read_text())
    assert any("reach the network" in s for s in lock["impure"])


def test_an_output_the_step_does_not_produce_is_an_error(tmp_path: Path) -> None:
    from frank.model.kinds.step import Step, check_dir

    def stage(run: str, outputs: list[str], removes: list[str] | None = None) -> list[str]:
        step = Step.model_validate({
            "kind": "step", "name": "jit-step", "version": "1", "summary": "s",
            "status": "candidate", "provenance": {"licence": "MIT"},
            "revert": {"action": "remove"}, "run": run, "workdir": str(tmp_path / "w"),
            "outputs": outputs, "removes": removes or []})
        contribution = step.layer(PartContext(root=tmp_path, manifest=tmp_path / "m.toml"))
        assert contribution is not None and contribution.stage is not None
        # on the host, less the check of the whole filesystem (tests/test_step_fidelity.py)
        check = check_dir("jit-step")
        return [*(s for s in contribution.stage.run if check not in s and "python3" not in s),
                *contribution.stage.then]

    a, b = tmp_path / "out-a", tmp_path / "out-b"
    ok = run_stage(stage(f"touch {a} {b}", [str(a), str(b)]))
    assert ok.returncode == 0, ok.stderr
    missing = run_stage(stage(f"touch {tmp_path / 'c'}", [str(tmp_path / 'c'),
                                                          str(tmp_path / 'never')]))
    assert missing.returncode == 1
    assert missing.stderr.strip() == (f"frank: step jit-step did not produce its output "
                                      f"{tmp_path / 'never'}")
    victim = tmp_path / "installed.py"
    victim.write_text("x")
    removed = run_stage(stage("true", [str(a)], [str(victim)]))
    assert removed.returncode == 0 and not victim.exists()
    gone = run_stage(stage("true", [str(a)], [str(victim)]))
    assert gone.returncode == 1 and "removes" in gone.stderr and "not in the image" in gone.stderr


def test_a_failed_build_quotes_the_steps_own_line_not_buildahs_echo(tmp_path: Path) -> None:
    """buildah echoes each RUN command (the step's words inside it, quoted) and shares one
    pipe with the container's stderr, so the line can come mid-line after a progress note."""
    from frank.assemble.builder import _step_failure

    echo = ("STEP 6/9: RUN { test -e /opt/frank/gen || { echo 'frank: step gen-step did not "
            "produce its output /opt/frank/gen' >&2; exit 1; }; }\n")
    log = tmp_path / "build.log"
    log.write_text(echo + "Error: building at STEP \"RUN ...\": exit status 1\n")
    assert _step_failure(log) is None  # the echo alone is not the step saying so
    log.write_text(echo + "Copying blob 1f2e...frank: step gen-step did not produce its output "
                   "/opt/frank/gen\nError: building at STEP: exit status 1\n")
    assert _step_failure(log) == "step gen-step did not produce its output /opt/frank/gen"
    log.write_text(echo + "frank: step gen-step removes /usr/x, which is not in the image\n")
    assert _step_failure(log) == "step gen-step removes /usr/x, which is not in the image"


def test_a_step_must_declare_what_it_produces() -> None:
    from pydantic import ValidationError

    from frank.model.kinds.step import Step

    base = {"kind": "step", "name": "s", "version": "1", "summary": "s", "status": "candidate",
            "provenance": {"licence": "MIT"}, "revert": {"action": "remove"}, "run": "true"}
    with pytest.raises(ValidationError, match="outputs"):
        Step.model_validate(base)
    with pytest.raises(ValidationError, match="absolute path"):
        Step.model_validate({**base, "outputs": ["relative/out"]})
    with pytest.raises(ValidationError, match="both an output and removed"):
        Step.model_validate({**base, "outputs": ["/a"], "removes": ["/a"]})


def test_the_embedded_builder_refuses_a_step(repo: Path, tmp_path: Path) -> None:
    step_part(repo, ["/opt/frank/jit/cache"])
    child(repo, "stepped", {"jit-step": "1"})
    assert frank("lock", "stacks/stepped.toml", cwd=repo).code == 0
    done = frank("compose", "stacks/stepped.toml", "--builder", "oci", "--out",
                 str(tmp_path / "o"), cwd=repo)
    assert done.code == 2
    assert "the embedded builder cannot run commands, and step:jit-step needs some" in done.err


# --- item 6: import smoke checks ---------------------------------------------------------

def test_import_checks_run_before_the_engine(tmp_path: Path) -> None:
    from frank.run.launch import main

    lock = {"parts": [{"name": "good", "spec": {"check": {"imports": ["json", "os.path"]}}},
                      {"name": "bad", "spec": {"check": {"imports": ["no_such_module_31"]}}}],
            "env": {}, "plugins": []}
    path = tmp_path / "frank.lock"
    path.write_text(json.dumps({**lock, "parts": lock["parts"][:1]}))
    assert main(["--lock", str(path), "--check"]) == 0
    path.write_text(json.dumps(lock))
    done = subprocess.run([sys.executable, "-m", "frank.run.launch", "--lock", str(path),
                           "--check"], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip().startswith("frank-launch: error: check of bad: import "
                                          "no_such_module_31 failed: ModuleNotFoundError")
    path.write_text(json.dumps({**lock, "parts": [{"name": "evil", "spec": {
        "check": {"imports": ["os; import shutil"]}}}]}))
    assert main(["--lock", str(path), "--check"]) == 2


def test_a_check_names_modules(repo: Path) -> None:
    path = part(repo, "cpu-experts-sched", "2", "")  # overwritten below: an env part
    path.write_text((Path(__file__).parents[1] / "parts/cpu-experts-sched/2.toml").read_text()
                    + '\n[check]\nimports = ["os", "not a module"]\n')
    done = frank("lock", cwd=repo)
    assert done.code == 2
    assert "parts/cpu-experts-sched/2.toml: check.imports.1" in done.err
    assert len(done.err.strip().splitlines()) == 1


# --- items 9 and 10: patches ---------------------------------------------------------------

NEW_CU = """\
diff --git a/csrc/new_kernel/k.cu b/csrc/new_kernel/k.cu
new file mode 100644
--- /dev/null
+++ b/csrc/new_kernel/k.cu
@@ -0,0 +1 @@
+__global__ void k() {}
diff --git a/vllm/envs.py b/vllm/envs.py
--- a/vllm/envs.py
+++ b/vllm/envs.py
@@ -1 +1 @@
-a
+b
"""
CHANGED_CU = NEW_CU.replace("new file mode 100644\n--- /dev/null", "--- a/csrc/new_kernel/k.cu")


def test_new_cuda_sources_the_wheel_never_compiles_are_python_only() -> None:
    from frank.model.kinds.patch import touches_compiled

    assert touches_compiled(NEW_CU) is False  # a new .cu nothing names: never compiled
    assert touches_compiled(CHANGED_CU) is True  # an existing compiled file changed
    cmake = NEW_CU + "diff --git a/CMakeLists.txt b/CMakeLists.txt\n--- a/CMakeLists.txt\n" \
        "+++ b/CMakeLists.txt\n@@ -1 +1 @@\n-a\n+b\n"
    assert touches_compiled(cmake) is True  # ... unless the build is changed to compile it


def url_patch(repo: Path, name: str, text: str, compiled: bool, as_file: bool = False) -> str:
    """A patch part of ``text``, fetched from a URL (or, ``as_file``, kept in the repo)."""
    sha = sha256_bytes(text.encode())
    source = f'url = "https://patches.invalid/{name}.patch"'
    if as_file:
        (repo / "parts" / name).mkdir(parents=True, exist_ok=True)
        (repo / "parts" / name / "fix.patch").write_text(text)
        source = f'file = "parts/{name}/fix.patch"'
    part(repo, name, "1", f"""\
        kind = "patch"
        source_repo = "https://github.com/vllm-project/vllm"
        {source}
        sha256 = "{sha}"
        applies_to = ["ee0da84ab9e04ac7610e28580af62c365e898389"]
        touches_compiled = {'true' if compiled else 'false'}
        requires = ["vllm-base"]
        """)
    return sha


def test_url_patch_claim_is_checked_on_the_fetched_diff_in_lock(
        repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    monkeypatch.setenv("FRANK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("FRANK_MIRROR", str(mirror))
    sha = url_patch(repo, "url-fix", CHANGED_CU, compiled=False)  # a false claim
    (mirror / sha).write_text(CHANGED_CU)
    child(repo, "urlpatch", {"url-fix": "1"})
    done = frank("lock", "stacks/urlpatch.toml", cwd=repo)
    assert done.code == 2
    assert done.err.strip() == (
        "frank: error: parts/url-fix/1.toml: touches_compiled: declared False but the diff "
        "fetched from https://patches.invalid/url-fix.patch touches compiled code")
    # the same bytes as a file part are refused for the same claim (the rule is one)
    # and the true claim locks; the verdict is recorded and reused offline
    sha = url_patch(repo, "url-fix", NEW_CU, compiled=False)
    (mirror / sha).write_text(NEW_CU)
    assert frank("lock", "stacks/urlpatch.toml", cwd=repo).code == 0
    lock = json.loads((repo / "stacks/urlpatch.lock").read_text())
    locked = next(p for p in lock["parts"] if p["name"] == "url-fix")
    assert locked["verified"] == {
        "touches_compiled": f"false: checked on the fetched diff (sha256 {sha})"}
    (mirror / sha).unlink()
    monkeypatch.setenv("FRANK_CACHE", str(tmp_path / "empty-cache"))
    assert frank("lock", "--check", "stacks/urlpatch.toml", cwd=repo).code == 0


def test_url_patch_that_cannot_be_fetched_stops_lock(repo: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRANK_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("FRANK_MIRROR", raising=False)
    sha = url_patch(repo, "url-fix", NEW_CU, compiled=False)
    child(repo, "urlpatch", {"url-fix": "1"})
    done = frank("lock", "stacks/urlpatch.toml", cwd=repo)
    assert done.code == 2
    assert done.err.startswith("frank: error: parts/url-fix/1.toml: url: checking "
                               "touches_compiled: cannot fetch "
                               "https://patches.invalid/url-fix.patch")
    assert f"put the file at $FRANK_MIRROR/{sha}" in done.err
    assert len(done.err.strip().splitlines()) == 1


def test_one_patch_under_two_names_is_refused(repo: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("fix-a", "fix-b"):
        url_patch(repo, name, NEW_CU, compiled=False, as_file=True)
    child(repo, "twice", {"fix-a": "1", "fix-b": "1"})
    done = frank("lock", "stacks/twice.toml", cwd=repo)
    assert done.code == 2
    sha = sha256_bytes(NEW_CU.encode())
    assert done.err.strip() == (f"frank: error: stacks/twice.toml: add.fix-b: fix-a and fix-b "
                                f"carry the same patch (sha256 {sha[:16]}...): keep one of them")
    # a URL part with the same content as the served file part is the same patch too
    monkeypatch.setenv("FRANK_MIRROR", str(tmp_path))
    (tmp_path / sha).write_text(NEW_CU)
    url_patch(repo, "url-fix", NEW_CU, compiled=False)
    child(repo, "twice", {"fix-a": "1", "url-fix": "1"})
    done = frank("lock", "stacks/twice.toml", cwd=repo)
    assert done.code == 2 and "fix-a and url-fix carry the same patch" in done.err


# --- the example stack ---------------------------------------------------------------------

def test_recipe_sm120_composes_offline(tmp_path: Path) -> None:
    root = Path(__file__).parents[1]
    assert frank("lock", "--check", "stacks/recipe-sm120.toml", cwd=root).code == 0
    plan, dockerfile = compose_none(root, "recipe-sm120", tmp_path / "out")
    names = [x["name"] for x in plan["layers"]]
    jit = layer(plan, "package:flashinfer-jit-cache")
    run = " ".join(jit["stage"]["run"])
    assert jit["stage"]["source"]["commit"] == "d768c14e7cf5dd5df45a8a1de78ae815879f108a"
    assert jit["stage"]["source"]["submodules"] and "git clone" not in run
    assert "FLASHINFER_CUDA_ARCH_LIST=12.0f" in run and "--no-build-isolation" in run
    assert layer(plan, "binary:sm120-cubins")["files"][0]["dest"] == "/opt/frank/cubins/sm120"
    assert plan["config"]["env"]["FLASHINFER_CUBIN_DIR"] == "/opt/frank/cubins/sm120"
    step = layer(plan, "step:sm120-probe-ext")
    assert "TORCH_CUDA_ARCH_LIST=12.0a" in " ".join(step["stage"]["run"])
    assert names.index("step:sm120-probe-ext") > names.index("package:flashinfer-jit-cache")
    assert "python:flashinfer-cubin" not in names  # removed from the engine's set
    assert plan["checks"]["flashinfer-jit-cache"] == [
        ["python3", "-c", "import flashinfer_jit_cache"], ["python3", "-c", "import flashinfer"]]
    assert "FROM frank-1 AS build-sm120-probe-ext" in dockerfile
    lock = json.loads((root / "stacks/recipe-sm120.lock").read_text())
    assert len(lock["impure"]) == 2
    for line in dockerfile.splitlines():  # every generated RUN value is quoted or plain
        if "pip wheel" in line:
            assert shlex.split(line.split("&& ", 1)[1].removesuffix(" \\"))


# --- item 4, built for real: a step in a container, only its output in its layer ----------

GEN = """\
mkdir -p /opt/frank/gen
echo "$TORCH_CUDA_ARCH_LIST" > /opt/frank/gen/archs.txt
echo scratch > /tmp/scratch-not-kept
python3 -c "import socket; socket.create_connection(('pypi.org', 443), 5)" 2>/dev/null \\
  && echo online > /opt/frank/gen/network.txt || echo offline > /opt/frank/gen/network.txt
"""


def layer_files(layout: Path) -> list[dict[str, bytes | None]]:
    """Per image layer: path -> content (None for a folder) of every entry."""
    import tarfile

    index = json.loads((layout / "index.json").read_text())
    blob = layout / "blobs" / "sha256"
    manifest = json.loads((blob / index["manifests"][0]["digest"].split(":")[1]).read_text())
    out = []
    for entry in manifest["layers"]:
        with tarfile.open(blob / entry["digest"].split(":")[1]) as tar:
            files: dict[str, bytes | None] = {}
            for member in tar.getmembers():
                f = tar.extractfile(member) if member.isfile() else None
                files[member.name] = f.read() if f is not None else None
        out.append(files)
    return out


def gen_step(repo: Path, stack: str, script: str = GEN) -> None:
    """The step ``gen-step`` (``script`` writes its output) added to smoke-cpu as ``stack``."""
    (repo / "parts/gen-step/src").mkdir(parents=True)
    (repo / "parts/gen-step/src/gen.sh").write_text(script)
    part(repo, "gen-step", "1", """\
        kind = "step"
        run = "sh src/gen.sh"
        outputs = ["/opt/frank/gen"]
        archs = ["sm_120f"]
        [[inputs]]
        path = "parts/gen-step/src"
        dest = "/opt/frank/steps/gen-step/src"
        [arch_env]
        TORCH_CUDA_ARCH_LIST = "torch"
        """)
    (repo / f"stacks/{stack}.toml").write_text(
        'extends = "smoke-cpu.toml"\n[add]\ngen-step = "1"\n')


@pytest.mark.slow
@pytest.mark.skipif(__import__("shutil").which("buildah") is None, reason="buildah not installed")
def test_a_step_builds_in_a_container_and_its_layer_holds_only_its_output(
        repo: Path, tmp_path: Path) -> None:
    gen_step(repo, "smoke-step")
    assert frank("lock", "stacks/smoke-step.toml", cwd=repo).code == 0
    done = frank("compose", "stacks/smoke-step.toml", "--builder", "buildah", "--out",
                 str(tmp_path / "out"), cwd=repo)
    assert done.code == 0, done.err
    layers = layer_files(tmp_path / "out/image")
    with_output = [x for x in layers if "opt/frank/gen/archs.txt" in x]
    assert len(with_output) == 1
    assert with_output[0]["opt/frank/gen/archs.txt"] == b"12.0f\n"  # frank's spelling
    from frank.assemble.engines import can_cut_network

    if can_cut_network():  # a step never reaches the network (PyPI answers this machine)
        assert with_output[0]["opt/frank/gen/network.txt"] == b"offline\n"
    else:
        assert "the network stays on" in (tmp_path / "out/build.log").read_text()
    assert all(not n.startswith(("opt/frank/gen", "./opt/frank/gen")) for n in
               with_output[0] if n not in ("opt/frank/gen", "opt/frank/gen/archs.txt",
                                           "opt/frank/gen/network.txt"))
    everything = {n for x in layers for n in x}
    assert not any("scratch-not-kept" in n or "opt/frank/steps" in n for n in everything)
    # an output the command does not produce stops the build, in the step's own words
    (repo / "parts/gen-step/src/gen.sh").write_text("true\n")
    assert frank("lock", "stacks/smoke-step.toml", cwd=repo).code == 0
    failed = frank("compose", "stacks/smoke-step.toml", "--builder", "buildah", "--out",
                   str(tmp_path / "out2"), cwd=repo)
    assert failed.code == 2
    assert failed.err.startswith("frank: error: step gen-step did not produce its output "
                                 "/opt/frank/gen: buildah build of ")
    assert f"(log {tmp_path / 'out2' / 'build.log'})" in failed.err  # the kept log
    assert (tmp_path / "out2" / "build.log").is_file()


STAMP = """\
mkdir -p /opt/frank/stamp
# what no second run could repeat: the outputs of a rerun would differ
cat /proc/sys/kernel/random/uuid > /opt/frank/stamp/once.txt
echo {nonce} >> /opt/frank/stamp/once.txt
"""


@pytest.mark.slow
def test_a_steps_outputs_are_kept_by_its_key_and_it_is_not_run_again(
        repo: Path, tmp_path: Path) -> None:
    """A container rebuild with the same key takes the step's outputs from frank's store
    instead of running it; the image is the same one. A changed input runs it again."""
    from frank.image.oci import layout_manifests

    def build(out: str) -> tuple[bytes, str, str]:
        assert frank("lock", "stacks/smoke-stamp.toml", cwd=repo).code == 0
        done = frank("compose", "stacks/smoke-stamp.toml", "--builder", "buildah", "--out",
                     str(tmp_path / out), cwd=repo)
        assert done.code == 0, done.err
        stamp = next(x["opt/frank/stamp/once.txt"] for x in layer_files(tmp_path / out / "image")
                     if "opt/frank/stamp/once.txt" in x)
        assert stamp is not None
        digest = layout_manifests(tmp_path / out / "image")[0]["digest"]
        return stamp, digest, (tmp_path / out / "build.log").read_text()

    nonce = __import__("uuid").uuid4().hex  # a key of this run's own
    (repo / "parts/stamp-step/src").mkdir(parents=True)
    (repo / "parts/stamp-step/src/stamp.sh").write_text(STAMP.format(nonce=nonce))
    part(repo, "stamp-step", "1", """\
        kind = "step"
        run = "sh src/stamp.sh"
        outputs = ["/opt/frank/stamp"]
        [[inputs]]
        path = "parts/stamp-step/src"
        dest = "/opt/frank/steps/stamp-step/src"
        """)
    (repo / "stacks/smoke-stamp.toml").write_text(
        'extends = "smoke-cpu.toml"\n[add]\nstamp-step = "1"\n')
    first, first_digest, log = build("out1")
    assert "step:stamp-step: outputs kept for key" in log
    again, again_digest, log = build("out2")
    assert "step:stamp-step: its stage's outputs were kept" in log and "not run again" in log
    assert again == first  # not run again: the same bytes, not a second uuid
    assert again_digest == first_digest  # and the same image
    (repo / "parts/stamp-step/src/stamp.sh").write_text(STAMP.format(nonce=nonce + "-2"))
    changed, changed_digest, log = build("out3")
    assert changed != first and changed.endswith(f"{nonce}-2\n".encode())
    assert changed_digest != first_digest and "outputs kept for key" in log


def test_kept_outputs_are_read_from_the_layers_up_to_the_stages_marker(tmp_path: Path) -> None:
    """stepcache reads the output paths from the layers up to the one holding the stage's
    marker, whiteouts honoured, and nothing outside the outputs; without its marker, or with
    an output missing, nothing is kept."""
    import hashlib
    import io
    import tarfile

    from frank.assemble import stepcache
    from frank.assemble.plan import PlanLayer, StageStep

    layout = tmp_path / "image"
    (layout / "blobs/sha256").mkdir(parents=True)

    def blob(data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        (layout / "blobs/sha256" / digest).write_bytes(data)
        return f"sha256:{digest}"

    def tar(files: dict[str, bytes]) -> bytes:
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w") as t:
            for name, data in files.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
        return out.getvalue()

    layer = PlanLayer(index=3, name="step:s", part="s", kind="step", key="ab" * 32, inputs={},
                      files=[], generated=[], pip_install=[], run=[], why="",
                      stage=StageStep(name="build-s", run=["true"], outputs=["/opt/out"]))
    layers = [tar({"opt/out/old.txt": b"old", "opt/out/gone.txt": b"x", "etc/other": b"o"}),
              tar({"opt/out/new.txt": b"new", "opt/out/.wh.gone.txt": b"", "usr/x": b"x"}),
              tar({"opt/out/later.txt": b"after the stage"})]
    history = [{"created_by": "base"}, {"created_by": "COPY x", "empty_layer": True},
               {"created_by": f"/bin/sh -c {stepcache.marker(layer)}", "empty_layer": True},
               {"created_by": "CMD []"}, {"created_by": "COPY later"}]

    def write(hist: list[dict[str, object]]) -> None:
        config = blob(json.dumps({"history": hist}).encode())
        manifest = json.dumps({"schemaVersion": 2, "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json", "digest": config,
            "size": 1}, "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                                    "digest": blob(x), "size": len(x)} for x in layers]})
        mdig = blob(manifest.encode())
        (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": mdig,
            "size": len(manifest)}]}))
        (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')

    write(history)
    assert stepcache.save(tmp_path / "store", layer, layout)
    kept = stepcache.cached(tmp_path / "store", layer)
    assert kept is not None
    got = {p.relative_to(kept).as_posix() for p in kept.rglob("*") if p.is_file()}
    assert got == {"opt/out/old.txt", "opt/out/new.txt"}  # no whiteout, no later, no others
    other = layer.model_copy(update={"key": "cd" * 32})
    write([{"created_by": "base"}, {"created_by": "CMD []"}, {"created_by": "COPY later"}])
    assert not stepcache.save(tmp_path / "store", other, layout)  # no marker: not kept
    assert stepcache.cached(tmp_path / "store", other) is None
