"""Issue 40, items B8-B10: a step's layer is what the step did, its build outputs stay up to
date against the base they were built from, and a source build gets the version its commit
implies.

The container builds (buildah --isolation chroot) are on smoke-cpu's small test base; B9's
base is that base plus one layer holding a header newer than SOURCE_DATE_EPOCH, written
once per session.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

from frank.errors import FrankError
from tests.spine_helpers import frank
from tests.test_issue31_recipes import layer_files, part

needs_buildah = pytest.mark.skipif(shutil.which("buildah") is None,
                                   reason="buildah not installed")


# --- B8: a change outside the declared outputs is refused, naming the paths --------------

def test_stepfs_names_each_change_outside_what_the_step_declared(tmp_path: Path) -> None:
    """The check run in the stage, on a tree of its own: edits, additions and removals
    outside outputs/removes are named; outputs, removes, scratch, bytecode caches, a new
    workdir and the folders made on the way to an output are not."""
    from frank.model.kinds.stepfs import SCRATCH, changes, snapshot

    root = tmp_path / "root"
    for rel, text in {"etc/conf": "a", "usr/lib/x.py": "x", "usr/lib/gone.py": "g",
                      "opt/keep/old": "o", "opt/rm/me": "m", "srv/in/src.c": "c"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    skip = [*SCRATCH, "/srv/in"]
    before = snapshot(skip, str(root))
    assert "/etc/conf" in before and "/srv/in/src.c" not in before
    (root / "etc/conf").write_text("ab")  # edited, not declared
    (root / "usr/lib/gone.py").unlink()  # removed, not declared
    (root / "usr/lib/new.so").write_text("n")  # added, not declared
    (root / "usr/lib/__pycache__").mkdir()  # Python's own cache: scratch
    (root / "usr/lib/__pycache__/x.cpython-311.pyc").write_text("pyc")
    (root / "tmp").mkdir()
    (root / "tmp/scratch").write_text("s")
    (root / "srv/in/src.o").write_text("o")  # in the step's input folder
    (root / "opt/frank/jit").mkdir(parents=True)  # new folders on the way to the output
    (root / "opt/frank/jit/k.so").write_text("k")
    (root / "opt/rm/me").unlink()  # a path the step removes anyway
    (root / "work/b").mkdir(parents=True)  # a workdir frank made
    after = snapshot(skip, str(root))
    found = changes(before, after, ["/opt/frank/jit", "/opt/rm/me"], ["/work"])
    assert found == ["/etc/conf (changed)", "/usr/lib/gone.py (removed)",
                     "/usr/lib/new.so (added)"]
    # a workdir that was there before is not scratch: what the command leaves there counts
    assert changes(after, snapshot(skip, str(root)), [], ["/work"]) == []
    (root / "work/b/obj").write_text("o")
    assert changes(after, snapshot(skip, str(root)), [], ["/work"]) == ["/work/b/obj (added)"]
    os.chmod(root / "etc/conf", 0o600)  # a mode is a change too
    assert changes(after, snapshot(skip, str(root)), [], []) == [
        "/etc/conf (changed)", "/work/b/obj (added)"]


def step(repo: Path, name: str, run: str, outputs: list[str],
         files: dict[str, str] | None = None) -> Path:
    """A step part reading its own src folder (``files``), run from its step folder."""
    src = repo / "parts" / name / "src"
    src.mkdir(parents=True, exist_ok=True)
    for rel, text in (files or {}).items():
        (src / rel).write_text(text)
    part(repo, name, "1", f"""\
        kind = "step"
        run = {json.dumps(run)}
        outputs = {json.dumps(outputs)}
        [[inputs]]
        path = "parts/{name}/src"
        dest = "/opt/frank/steps/{name}/src"
        """)
    return src


EDIT = """\
mkdir -p /opt/frank/fi
echo built > /opt/frank/fi/kernel.txt
echo "# patched by the step" >> /etc/debian_version
touch /usr/lib/undeclared.so
python3 -c "import json" > /tmp/scratch.txt
"""


@pytest.mark.slow
@needs_buildah
def test_a_step_that_changes_an_undeclared_path_stops_the_build_naming_it(
        repo: Path, tmp_path: Path) -> None:
    step(repo, "edit-step", "sh src/edit.sh", ["/opt/frank/fi"], {"edit.sh": EDIT})
    (repo / "stacks/smoke-edit.toml").write_text(
        'extends = "smoke-cpu.toml"\n[add]\nedit-step = "1"\n')
    assert frank("lock", "stacks/smoke-edit.toml", cwd=repo).code == 0
    out = tmp_path / "out"
    failed = frank("compose", "stacks/smoke-edit.toml", "--builder", "buildah", "--out",
                   str(out), cwd=repo)
    assert failed.code == 2 and len(failed.err.strip().splitlines()) == 1
    # the step's own words first: both paths named, the output, /tmp and the bytecode the
    # import wrote are not; then the log kept beside the output
    assert failed.err.startswith(
        "frank: error: step edit-step changed files outside its outputs, which its layer "
        "would drop: /etc/debian_version (changed), /usr/lib/undeclared.so (added); declare "
        "them in outputs or removes, or write scratch under /tmp: buildah build of "), \
        failed.err
    assert f"(log {out / 'build.log'})" in failed.err
    assert "changed files outside its outputs" in (out / "build.log").read_text()
    # declared, the same edits are the step's layer
    step(repo, "edit-step", "sh src/edit.sh",
         ["/opt/frank/fi", "/etc/debian_version", "/usr/lib/undeclared.so"])
    assert frank("lock", "stacks/smoke-edit.toml", cwd=repo).code == 0
    done = frank("compose", "stacks/smoke-edit.toml", "--builder", "buildah", "--out",
                 str(tmp_path / "out2"), cwd=repo)
    assert done.code == 0, done.err
    top = next(x for x in layer_files(tmp_path / "out2/image")
               if "opt/frank/fi/kernel.txt" in x)
    assert top["etc/debian_version"] is not None and \
        top["etc/debian_version"].endswith(b"# patched by the step\n")
    assert "usr/lib/undeclared.so" in top


# --- B9: a step's build outputs are not older than the base files they were built from ---

FRESH = 1750000000  # 2025-06-15: the base's header, far past SOURCE_DATE_EPOCH (1980)


@pytest.fixture(scope="module")
def fresh_base(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The test base plus a layer holding /usr/include/demo.h at FRESH (an official image's
    files carry their real times): an OCI layout and its digest."""
    from frank.assemble.base import resolve_base
    from frank.image.oci import layout_blob_path, layout_manifests, resolve_manifest
    from frank.store.blobs import BlobStore
    from tests.oci_helpers import tar_of, write_layout

    base = resolve_base(Path(__file__).parents[1] / "images/test-base.toml", BlobStore())
    _, _, manifest = resolve_manifest(base.layout, base.digest)
    config = json.loads(layout_blob_path(base.layout, manifest["config"]["digest"]).read_bytes())
    config["history"] = [*config.get("history", []), {"created_by": "a header of 2025"}]
    layers = [layout_blob_path(base.layout, d["digest"]).read_bytes()
              for d in manifest["layers"]]
    out = write_layout(tmp_path_factory.mktemp("fresh-base") / "layout",
                       [*layers, tar_of({"usr/include/demo.h": b"#define DEMO 1\n"}, FRESH)],
                       config=config)
    return out, layout_manifests(out)[0]["digest"]


def test_the_layer_time_is_the_bases_newest_file_time_kept_by_its_digest(
        tmp_path: Path) -> None:
    from frank.assemble.engines import newest_file_time
    from frank.image.oci import layout_manifests
    from tests.oci_helpers import tar_of, write_layout

    layout = write_layout(tmp_path / "img", [tar_of({"a": b"x"}, 5000), tar_of({"b": b"y"}, 100)])
    digest = layout_manifests(layout)[0]["digest"]
    kept = tmp_path / "kept"
    assert newest_file_time(layout, digest, kept) == 5000  # the newest, not the last layer's
    record = kept / digest.split(":")[1]
    assert json.loads(record.read_text()) == {"digest": digest, "newest": 5000}
    shutil.rmtree(layout)  # kept by digest: the layers are not read again
    assert newest_file_time(layout, digest, kept) == 5000
    record.write_text(json.dumps({"digest": "sha256:" + "0" * 64, "newest": 1}))
    with pytest.raises(FrankError):  # a record of another digest is not used
        newest_file_time(layout, digest, kept)


MAKEFILE = """\
kernel.so: /usr/include/demo.h kernel.c
\tcat /usr/include/demo.h kernel.c > kernel.so
"""


def in_image(layout: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in a container of the image (not its entrypoint), chroot isolation."""
    from frank.assemble.engines import _oci_ref, detect

    engine = next(e for e in detect() if e.name == "buildah")
    with _oci_ref(layout) as ref:
        ctr = subprocess.run([*engine.base_args(), "from", "--quiet", "--pull-always", ref],
                             capture_output=True, text=True, check=True).stdout.split()[-1]
    try:
        return subprocess.run([*engine.base_args(), "run", "--isolation", "chroot", ctr, "--",
                               *argv], capture_output=True, text=True, timeout=300)
    finally:
        subprocess.run([*engine.base_args(), "rm", ctr], capture_output=True)


@pytest.mark.slow
@needs_buildah
@pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")
def test_a_make_build_a_step_made_is_up_to_date_in_the_built_image(
        repo: Path, tmp_path: Path, fresh_base: tuple[Path, str]) -> None:
    """A step builds kernel.so with make from a header of the base and a source of its
    own; in the image, `make -q` finds it up to date (at SOURCE_DATE_EPOCH it was 45 years
    older than the header, so the tool would rebuild it at first start). The host's make
    (Debian's, needing only libc) is the step's input and ships in its output."""
    layout, digest = fresh_base
    (repo / "images/fresh-base.toml").write_text(
        f'name = "fresh-base"\nref = "oci:{layout}@{digest}"\n')
    src = step(repo, "jit-make", "mkdir -p /opt/frank/jit && cp src/* /opt/frank/jit/ && "
               "cd /opt/frank/jit && ./make", ["/opt/frank/jit"],
               {"Makefile": MAKEFILE, "kernel.c": "int kernel;\n"})
    shutil.copy(shutil.which("make") or "", src / "make")
    (repo / "stacks/smoke-make.toml").write_text(textwrap.dedent("""\
        extends = "smoke-cpu.toml"
        [image]
        base = "fresh-base"
        [add]
        jit-make = "1"
        """))
    assert frank("lock", "stacks/smoke-make.toml", cwd=repo).code == 0
    out = tmp_path / "out"
    done = frank("compose", "stacks/smoke-make.toml", "--builder", "buildah", "--out",
                 str(out), cwd=repo)
    assert done.code == 0, done.err
    image = out / "image"
    # the tool itself, in the built image: up to date (exit 0), nothing to rebuild
    q = in_image(image, "/opt/frank/jit/make", "-q", "-C", "/opt/frank/jit", "kernel.so")
    assert q.returncode == 0, (q.returncode, q.stdout, q.stderr)
    # and reproducibly so: every file of the step's layer carries one time, the base's
    # newest (a function of the pinned base), never the build's clock
    top = next(i for i, x in enumerate(layer_files(image)) if "opt/frank/jit/kernel.so" in x)
    index = json.loads((image / "index.json").read_text())
    blob = image / "blobs/sha256"
    manifest = json.loads((blob / index["manifests"][0]["digest"].split(":")[1]).read_text())
    with tarfile.open(blob / manifest["layers"][top]["digest"].split(":")[1]) as tar:
        assert {int(m.mtime) for m in tar} == {FRESH}
    assert f"file times in the built layers: {FRESH}" in (out / "build.log").read_text()


# --- B10: a source build is told the version its commit implies ---------------------------

def git(*args: str, cwd: Path) -> str:
    from tests.test_issue31_recipes import git as run_git

    return run_git(*args, cwd=cwd)


@pytest.fixture
def tagged_source(repo: Path) -> tuple[Path, str]:
    """A setuptools-scm package in a git repo inside the repo: tagged v0.3.0, then two
    commits; the pin is the last."""
    top = repo / "sources" / "scm-repo"
    (top / "pkg" / "demo_pkg").mkdir(parents=True)
    (top / "pkg" / "demo_pkg" / "__init__.py").write_text("VALUE = 1\n")
    (top / "pkg" / "pyproject.toml").write_text(textwrap.dedent("""\
        [build-system]
        requires = ["setuptools", "setuptools-scm"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "demo-pkg"
        dynamic = ["version"]
        [tool.setuptools]
        packages = ["demo_pkg"]
        [tool.setuptools_scm]
        root = ".."
        """))
    git("init", "-q", "-b", "main", cwd=top)
    git("add", ".", cwd=top)
    git("commit", "-qm", "first", cwd=top)
    git("tag", "v0.3.0", cwd=top)
    for i in (2, 3):
        (top / "pkg" / "demo_pkg" / "__init__.py").write_text(f"VALUE = {i}\n")
        git("commit", "-qam", f"change {i}", cwd=top)
    return top, git("rev-parse", "HEAD", cwd=top)


def test_scm_version_is_what_setuptools_scm_reads_from_the_history(
        tagged_source: tuple[Path, str], repo: Path, tmp_path: Path) -> None:
    from frank.store.gitsource import scm_version

    src, head = tagged_source
    short = git("rev-parse", "--short", head, cwd=src)

    def version(commit: str) -> str:
        return scm_version(f"file://{src}", commit, root=repo, cache=tmp_path / "cache",
                           log=tmp_path / "git.log")

    assert version(head) == f"0.3.1.dev2+g{short}"  # guess-next-dev, node
    assert version(git("rev-parse", "v0.3.0", cwd=src)) == "0.3.0"  # at the tag
    git("tag", "-d", "v0.3.0", cwd=src)
    git("tag", "release-notes", cwd=src)  # not a version: not counted
    other = tmp_path / "cache2"
    assert scm_version(f"file://{src}", head, root=repo, cache=other,
                       log=tmp_path / "git.log") == f"0.1.dev3+g{short}"


def test_a_source_builds_wheel_carries_the_version_its_commit_implies(
        repo: Path, tagged_source: tuple[Path, str], tmp_path: Path) -> None:
    """Locked: the version is in the lock and the stage's build is told it; built (the
    stage's own commands, on the host, with setuptools-scm from PyPI): the wheel is
    0.3.1.dev2+g<hash>, where without it setuptools-scm finds no .git and fails. A tag
    added later does not move a locked version: it is pinned in the lock."""
    from frank.assemble.plan import BuildPlan
    from frank.store import gitsource
    from tests.test_issue31_recipes import child, compose_none, layer, source_part

    src, head = tagged_source
    short = git("rev-parse", "--short", head, cwd=src)
    want = f"0.3.1.dev2+g{short}"
    source_part(repo, src, head, build="""\
        [build]
        isolation = false
        scm_version = true
""")
    child(repo, "scm", {"demo-src": "1"})
    done = frank("lock", "stacks/scm.toml", cwd=repo)
    assert done.code == 0, done.err
    lock = json.loads((repo / "stacks/scm.lock").read_text())
    locked = next(p for p in lock["parts"] if p["name"] == "demo-src")
    assert locked["verified"] == {"scm_version": want}
    plan, _ = compose_none(repo, "scm", tmp_path / "out")
    run = " && ".join(layer(plan, "package:demo-src")["stage"]["run"])
    assert f"SETUPTOOLS_SCM_PRETEND_VERSION_FOR_DEMO_PKG={want}" in run
    # pinned: a tag put on the commit later changes nothing until the commit changes
    git("tag", "v9.0.0", head, cwd=src)
    assert frank("lock", "--check", "stacks/scm.toml", cwd=repo).code == 0
    # the stage's build, on the host: setuptools-scm reads the version it is told
    scm = tmp_path / "scm"
    got = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                          "--target", str(scm), "setuptools-scm==8.1.0"],
                         capture_output=True, text=True, timeout=300)
    if got.returncode != 0:
        pytest.skip("setuptools-scm cannot be had from the index: " + got.stderr[-200:])
    stage = next(x for x in BuildPlan.model_validate(plan).layers
                 if x.name == "package:demo-src").stage
    assert stage is not None and stage.source is not None
    prefix = tmp_path / "img"
    gitsource.checkout(stage.source.repo, stage.source.commit, False,
                       prefix / stage.source.dest.lstrip("/"), root=repo,
                       cache=tmp_path / "cache", log=tmp_path / "git.log")
    env = {**os.environ, "PYTHONPATH": str(scm),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    steps = [s.replace("/opt/frank", str(prefix / "opt/frank")) for s in stage.run]
    built = subprocess.run(["sh", "-ec", " && ".join(steps)], env=env, capture_output=True,
                           text=True)
    assert built.returncode == 0, built.stderr[-2000:]
    wheels = [p.name for p in (prefix / "opt/frank/wheels/demo-src").glob("*.whl")]
    assert wheels == [f"demo_pkg-{want}-py3-none-any.whl"]
    # the same build without the version: setuptools-scm has no .git to read
    bare = [s.replace("SETUPTOOLS_SCM_PRETEND_VERSION", "UNUSED") for s in steps]
    shutil.rmtree(prefix / "opt/frank/wheels")
    failed = subprocess.run(["sh", "-ec", " && ".join(bare)], env=env, capture_output=True,
                            text=True)
    assert failed.returncode != 0 and "setuptools-scm was unable to detect version" in \
        failed.stderr + failed.stdout
