"""The hermetic builder's pieces, on small data this test makes itself.

Wheels built from static metadata (byte-identical, no code run), a patch applied on the host
to a wheel's files, the closure's wheel choice, the fetcher's mirror and pins, and one
end-to-end embedded build whose engine, dependency and patch are local wheels: locked by
uv into a pylock, installed on the host, the same digest from two separate caches.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

from frank.assemble.patching import apply_to_wheel
from frank.assemble.wheel import build_wheel
from frank.errors import FrankError
from frank.model.diffs import split_diff
from frank.model.kinds.patch import touches_compiled
from frank.resolve.closure import ClosureRequest, select_wheels
from frank.store.blobs import BlobStore
from frank.store.fetch import Fetcher, Pinned
from tests.spine_helpers import frank

COMMIT = "a" * 40


def make_package(folder: Path, name: str, version: str, deps: list[str] | None = None,
                 files: dict[str, str] | None = None) -> Path:
    """A package folder with static pyproject metadata."""
    module = name.replace("-", "_")
    folder.mkdir(parents=True, exist_ok=True)
    dep_list = ", ".join(json.dumps(d) for d in (deps or []))
    (folder / "pyproject.toml").write_text(textwrap.dedent(f"""\
        [project]
        name = "{name}"
        version = "{version}"
        dependencies = [{dep_list}]

        [project.entry-points."vllm.general_plugins"]
        {module} = "{module}:register"

        [tool.setuptools]
        packages = ["{module}"]
        """))
    pkg = folder / module
    pkg.mkdir(exist_ok=True)
    for rel, text in (files or {"__init__.py": "def register():\n    return 'v1'\n"}).items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    return folder


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- wheels from static metadata ----------------------------------------------------------

def test_wheel_is_byte_identical_and_runs_no_code(tmp_path: Path) -> None:
    src = make_package(tmp_path / "p", "frank-demo", "1.0", deps=["six>=1"])
    a = build_wheel(src, tmp_path / "a")
    os.utime(src / "frank_demo" / "__init__.py", (1, 1))  # mtimes must not matter
    b = build_wheel(src, tmp_path / "b")
    assert a.name == "frank_demo-1.0-py3-none-any.whl"
    assert a.read_bytes() == b.read_bytes()
    with zipfile.ZipFile(a) as zf:
        meta = zf.read("frank_demo-1.0.dist-info/METADATA").decode()
        eps = zf.read("frank_demo-1.0.dist-info/entry_points.txt").decode()
        assert {i.date_time for i in zf.infolist()} == {(1980, 1, 1, 0, 0, 0)}
    assert "Requires-Dist: six>=1" in meta
    assert "frank_demo = frank_demo:register" in eps
    canary = tmp_path / "CANARY"
    (src / "setup.py").write_text(f"open({str(canary)!r}, 'w')\n")
    with pytest.raises(FrankError, match=r"setup\.py would run code"):
        build_wheel(src, tmp_path / "c")
    assert not canary.exists()


def test_dynamic_metadata_is_refused(tmp_path: Path) -> None:
    src = make_package(tmp_path / "p", "frank-demo", "1.0")
    text = (src / "pyproject.toml").read_text().replace('version = "1.0"',
                                                         'dynamic = ["version"]')
    (src / "pyproject.toml").write_text(text)
    with pytest.raises(FrankError, match="dynamic"):
        build_wheel(src, tmp_path / "w")


# -- patches applied on the host ----------------------------------------------------------

PATCH = """\
diff --git a/pkg/a.py b/pkg/a.py
--- a/pkg/a.py
+++ b/pkg/a.py
@@ -1 +1 @@
-X = 1
+X = 2
diff --git a/pkg/new.py b/pkg/new.py
new file mode 100644
--- /dev/null
+++ b/pkg/new.py
@@ -0,0 +1 @@
+NEW = True
diff --git a/pkg/old.py b/pkg/old.py
deleted file mode 100644
--- a/pkg/old.py
+++ /dev/null
@@ -1 +0,0 @@
-OLD = True
diff --git a/csrc/extra.cu b/csrc/extra.cu
new file mode 100644
--- /dev/null
+++ b/csrc/extra.cu
@@ -0,0 +1 @@
+// never compiled: no build file names it
"""


def make_wheel(path: Path, files: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return path


def test_patch_applies_to_the_wheels_files_only(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "pkg-1-py3-none-any.whl",
                       {"pkg/a.py": "X = 1\n", "pkg/old.py": "OLD = True\n",
                        "pkg-1.dist-info/METADATA": "Name: pkg\n"})
    site = tmp_path / "image/site"
    result = apply_to_wheel(PATCH, wheel, site, label="patch:t", log=tmp_path / "build.log",
                            destinations={"csrc": "/opt/t/csrc"}, image_root=tmp_path / "image")
    assert result.changed == ["pkg/a.py", "pkg/new.py"]
    assert result.deleted == ["pkg/old.py"]
    assert result.placed == ["/opt/t/csrc/extra.cu"]  # outside the wheel: where declared
    assert (site / "pkg/a.py").read_text() == "X = 2\n"
    assert (site / "pkg/.wh.old.py").read_bytes() == b""  # OCI whiteout
    assert not (site / "csrc").exists()
    assert (tmp_path / "image/opt/t/csrc/extra.cu").read_text().startswith("// never")


def test_patch_that_does_not_apply_names_the_log(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "pkg-1-py3-none-any.whl", {"pkg/a.py": "X = 7\n",
                                                             "pkg/old.py": "OLD = True\n"})
    with pytest.raises(FrankError) as err:
        apply_to_wheel(PATCH, wheel, tmp_path / "site", label="patch:t",
                       log=tmp_path / "build.log", destinations={"csrc": "/opt/t/csrc"},
                       image_root=tmp_path)
    assert "does not apply" in err.value.one_line()
    assert str(tmp_path / "build.log") in err.value.one_line()
    assert "FAILED" in (tmp_path / "build.log").read_text()


def test_touches_compiled_is_judged_on_the_diff() -> None:
    assert len(split_diff(PATCH)) == 4
    assert touches_compiled(PATCH) is False  # a new .cu nothing builds
    changed_cu = "--- a/csrc/x.cu\n+++ b/csrc/x.cu\n@@ -1 +1 @@\n-a\n+b\n"
    assert touches_compiled(changed_cu) is True
    cmake = ("diff --git a/CMakeLists.txt b/CMakeLists.txt\n--- a/CMakeLists.txt\n"
             "+++ b/CMakeLists.txt\n@@ -1 +1 @@\n-a\n+b\n")
    assert touches_compiled(PATCH + cmake) is True


# -- the closure's wheel choice -------------------------------------------------------------

def test_select_wheels_picks_the_target_wheel_and_refuses_sdist_only(tmp_path: Path) -> None:
    def entry(name: str) -> dict[str, object]:
        return {"url": f"https://x.invalid/{name}", "hashes": {"sha256": name[:4] * 16}}

    doc = {"packages": [
        {"name": "Fast_Lib", "version": "1", "wheels": [
            entry("fast_lib-1-cp311-cp311-macosx_11_0_arm64.whl"),
            entry("fast_lib-1-py3-none-any.whl"),
            entry("fast_lib-1-cp311-cp311-manylinux_2_28_x86_64.whl")]},
        {"name": "winonly", "version": "1", "marker": "sys_platform == 'win32'",
         "wheels": [entry("winonly-1-py3-none-win_amd64.whl")]},
    ]}
    wheels = select_wheels(doc, ClosureRequest(python="3.11"), file=tmp_path / "pylock.x.toml")
    assert [(w.name, w.filename) for w in wheels] == [
        ("fast-lib", "fast_lib-1-cp311-cp311-manylinux_2_28_x86_64.whl")]
    doc["packages"].append({"name": "needs-glibc-2-39", "version": "1", "wheels": [
        entry("needs_glibc_2_39-1-cp311-cp311-manylinux_2_39_x86_64.whl")]})
    with pytest.raises(FrankError, match=r"no wheel for CPython 3\.11"):
        select_wheels(doc, ClosureRequest(python="3.11"), file=tmp_path / "pylock.x.toml")


# -- fetching ---------------------------------------------------------------------------------

def test_fetch_uses_the_mirror_and_refuses_a_wrong_hash(tmp_path: Path) -> None:
    data = b"pinned bytes\n"
    digest = hashlib.sha256(data).hexdigest()
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / digest).write_bytes(data)
    fetcher = Fetcher(BlobStore(tmp_path / "cache"), [mirror])
    unreachable = "https://unreachable.invalid/file.patch"
    assert fetcher.fetch(Pinned(unreachable, digest)).read_bytes() == data
    assert fetcher.from_mirror == 1 and fetcher.downloaded == 0
    (mirror / ("0" * 64)).write_bytes(b"something else")
    with pytest.raises(FrankError, match="the pin says"):
        fetcher.fetch(Pinned(unreachable, "0" * 64))
    assert not BlobStore(tmp_path / "cache").has("sha256:" + "0" * 64)
    with pytest.raises(FrankError) as err:
        fetcher.fetch(Pinned(unreachable, "1" * 64))
    line = err.value.one_line()
    assert unreachable in line and "1" * 64 in line and str(mirror / ("1" * 64)) in line


# -- end to end: lock the closure, build on the host, same digest from two caches ------------

def write_scratch_stack(repo: Path, wheels: Path) -> None:
    """A stack whose engine, its dependency and a patch are this test's own files."""
    dep = build_wheel(make_package(wheels / "src-dep", "frank-fake-dep", "2.0",
                                   files={"__init__.py": "DEP = 2\n"}), wheels)
    engine = build_wheel(make_package(
        wheels / "src-engine", "frank-fake-engine", "0.1.0", deps=["frank-fake-dep==2.0"],
        files={"__init__.py": "def register():\n    return 'v1'\n",
               "serve.py": "GREETING = 'hello'\n"}), wheels)
    patch = repo / "parts" / "fake-fix" / "fix.patch"
    patch.parent.mkdir(parents=True)
    patch.write_text(
        "--- a/frank_fake_engine/serve.py\n+++ b/frank_fake_engine/serve.py\n"
        "@@ -1 +1 @@\n-GREETING = 'hello'\n+GREETING = 'patched'\n")
    (repo / "parts" / "fake-engine").mkdir()
    (repo / "parts" / "fake-engine" / "0.1.0.toml").write_text(textwrap.dedent(f"""\
        kind = "engine"
        name = "fake-engine"
        version = "0.1.0"
        summary = "a local engine wheel"
        status = "served"
        repo = "https://github.com/example/fake-engine"
        commit = "{COMMIT}"
        release = "0.1.0"
        distribution = "frank-fake-engine"
        python = "3.11"
        torch = "2.11.0"
        cuda = "13.0.2"
        cuda_arch_list = ["12.0"]
        [wheel]
        path = "{engine}"
        sha256 = "{sha(engine)}"
        [provenance]
        licence = "Apache-2.0"
        [revert]
        action = "remove"
        """))
    (repo / "parts" / "fake-fix" / "1.toml").write_text(textwrap.dedent(f"""\
        kind = "patch"
        name = "fake-fix"
        version = "1"
        summary = "changes the greeting"
        status = "served"
        source_repo = "https://github.com/example/fake-engine"
        file = "parts/fake-fix/fix.patch"
        sha256 = "{sha(patch)}"
        applies_to = ["{COMMIT}"]
        touches_compiled = false
        requires = ["fake-engine"]
        [provenance]
        licence = "Apache-2.0"
        [revert]
        action = "remove"
        """))
    (repo / "stacks" / "fake.toml").write_text(textwrap.dedent("""\
        description = "a hermetic build of local wheels"
        [model]
        name = "none"
        [target]
        arch = "cpu"
        gpus = 0
        [image]
        base = "test-base"
        [parts]
        fake-engine = "0.1.0"
        fake-fix = "1"
        region-cache = "1"
        """))
    assert dep.is_file()


def layer_files(layout: Path) -> dict[str, bytes]:
    """Every regular file of the image's layers (later layers win), by image path."""
    index = json.loads((layout / "index.json").read_text())
    blob = layout / "blobs" / "sha256"
    manifest = json.loads((blob / index["manifests"][0]["digest"].split(":")[1]).read_text())
    files: dict[str, bytes] = {}
    for layer in manifest["layers"][1:]:  # the base's own layer left out
        with tarfile.open(blob / layer["digest"].split(":")[1]) as tar:
            for m in tar.getmembers():
                if m.isfile():
                    f = tar.extractfile(m)
                    assert f is not None
                    files[m.name] = f.read()
    return files


@pytest.mark.slow
def test_hermetic_build_locks_installs_patches_and_reproduces(
        repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_scratch_stack(repo, tmp_path / "wheels")
    locked = frank("lock", "stacks/fake.toml", cwd=repo)
    assert locked.code == 0, locked.err
    pylock = (repo / "stacks" / "pylock.fake.toml").read_text()
    assert 'name = "frank-fake-dep"' in pylock and "[tool.frank]" in pylock
    check = frank("lock", "--check", "stacks/fake.toml", cwd=repo)
    assert check.code == 0, check.err

    digests = []
    for cache in ("cache-a", "cache-b"):
        # monkeypatch puts the session's own cache back (never unset: the user's is the default)
        monkeypatch.setenv("FRANK_CACHE", str(tmp_path / cache))
        out = frank("compose", "stacks/fake.toml", "--json", "--out",
                    str(tmp_path / f"out-{cache}"), cwd=repo)
        assert out.code == 0, out.err
        summary = json.loads(out.out)
        digests.append(summary["image"]["digest"])
    assert digests[0] == digests[1]  # same lock, two caches: the same image
    names = [x["name"] for x in summary["layers"]]
    assert names[:3] == ["python:deps", "engine:fake-engine", "patch:fake-fix"]
    files = layer_files(tmp_path / "out-cache-b" / "image")
    site = "usr/local/lib/python3.11/dist-packages"
    assert files[f"{site}/frank_fake_dep/__init__.py"] == b"DEP = 2\n"
    assert files[f"{site}/frank_fake_engine/serve.py"] == b"GREETING = 'patched'\n"
    assert f"{site}/frank_region_cache-0.1.0.dist-info/entry_points.txt" in files
    assert not any(name.endswith(".pyc") for name in files)
    log = (tmp_path / "out-cache-b" / "build.log").read_text()
    assert "fake-fix: 1 files changed" in log


@pytest.mark.slow
def test_a_stale_closure_is_refused_offline(repo: Path, tmp_path: Path) -> None:
    write_scratch_stack(repo, tmp_path / "wheels")
    assert frank("lock", "stacks/fake.toml", cwd=repo).code == 0
    pylock = repo / "stacks" / "pylock.fake.toml"
    pylock.write_text(pylock.read_text().replace('request = "', 'request = "0'))
    check = frank("lock", "--check", "stacks/fake.toml", cwd=repo)
    assert check.code == 1
    composed = frank("compose", "stacks/fake.toml", "--locked", "--builder", "none", cwd=repo)
    assert composed.code == 2 and "stale" in composed.err
    assert len(composed.err.strip().splitlines()) == 1


# -- the shipped stacks -----------------------------------------------------------------------

def test_candidate_adds_exactly_the_rs8_layer_and_the_lock(repo: Path) -> None:
    plans = {}
    for stack in ("served", "candidate"):
        out = frank("compose", f"stacks/{stack}.toml", "--builder", "none", "--locked", "--json",
                    cwd=repo)
        assert out.code == 0, out.err
        plans[stack] = {x["name"]: x["key"] for x in json.loads(out.out)["layers"]}
    served, candidate = plans["served"], plans["candidate"]
    assert set(candidate) - set(served) == {"kernel:rs8"} and set(served) <= set(candidate)
    changed = {name for name in served if served[name] != candidate[name]}
    assert changed == {"frank:lock"}  # every other layer is reused as it is


@pytest.mark.slow
def test_an_unreachable_patch_url_stops_the_build_in_one_line(
        repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env_cache = tmp_path / "cache"
    monkeypatch.setenv("FRANK_CACHE", str(env_cache))
    monkeypatch.delenv("FRANK_MIRROR", raising=False)
    out = frank("compose", "stacks/served.toml", "--locked", cwd=repo)
    assert out.code == 2
    # off a terminal a slow step (the base's .debs, cold) may say so first, in plain lines
    # (frank.image.progress); the error itself is one line, the last
    lines = [x for x in out.err.strip().splitlines()
             if not (x.startswith("frank: ") and not x.startswith("frank: error:"))]
    assert len(lines) == 1 and out.err.strip().splitlines()[-1] == lines[0], out.err
    assert "cannot fetch https://raw.githubusercontent.com/kacper-daftcode/vLLM-Moet/" in lines[0]
    sha = "feb899aeeeed2ad211a080ebcd80992b7f3b250260f7a359b9968b51e10c890c"
    assert f"(sha256 {sha})" in lines[0] and f"put the file at $FRANK_MIRROR/{sha}" in lines[0]
    assert "build log:" in lines[0]
    # it stopped before the closure (4.2 GB): only the base's .debs and layer are there
    # (served's base carries a C/C++ compiler since issue 52: a 343 MB layer, its .debs)
    blobs = [p.stat().st_size for p in (env_cache / "blobs" / "sha256").iterdir()]
    assert sum(blobs) < 600_000_000, sum(blobs)


def test_a_package_part_may_only_override_or_remove(tmp_path: Path) -> None:
    from frank.model.kinds.base import PartContext
    from frank.model.kinds.package import Package

    part = Package.model_validate({
        "kind": "package", "name": "flashinfer-swap", "version": "1", "summary": "s",
        "status": "candidate", "distribution": "flashinfer-python",
        "overrides": ["flashinfer-python==0.6.13"], "remove": ["flashinfer-cubin"],
        "provenance": {"licence": "Apache-2.0"}, "revert": {"action": "remove"}})
    ctx = PartContext(root=tmp_path, manifest=tmp_path / "m.toml")
    assert part.inputs(ctx) == {} and part.layer(ctx) is None
    needs = part.python_needs(ctx)
    assert needs.overrides == ("flashinfer-python==0.6.13",)
    assert needs.excludes == ("flashinfer-cubin",) and needs.owns == ()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("buildah") is None, reason="needs buildah")
def test_a_container_engine_builds_the_host_built_layers_it_is_given(repo: Path) -> None:
    """`--builder buildah` on a RUN-free plan: frank stages its host-built layers into the
    context first, so the Dockerfile builds as written (issue 30: it used to RUN pip)."""
    out = frank("compose", "stacks/smoke-cpu.toml", "--builder", "buildah", "--json",
                cwd=repo)
    assert out.code == 0, out.err
    summary = json.loads(out.out)
    assert summary["image"]["builder"] == "buildah"
    files = layer_files(Path(summary["image"]["layout"]))
    site = "usr/local/lib/python3.11/dist-packages"
    assert f"{site}/frank_region_cache/__init__.py" in files
    dockerfile = (Path(summary["out"]) / "context" / "Dockerfile").read_text()
    assert "staged here: builds with buildah, podman or docker as it is" in dockerfile
