"""Issue 40 part C: the recipe-local example (examples/recipe-local, docs/recipe-local.md)
built once with `frank compose --builder buildah`, audited, and each item of part B shown
on it: what the image holds, and a deliberately wrong variant caught (one line naming the
file and field, or a failed audit naming part and path).

Everything it reaches is made here or pinned: its own engine image by digest (test-base's
layers plus a layer of installed distributions), a PEP 503 index and the patch on
127.0.0.1, a git source inside the rendered repo, PyPI's build tools by sha256. One
compose for the module (about 10 s warm); the variants that need a build rebuild only the
layers they change.
"""

from __future__ import annotations

import importlib.util
import json
import posixpath
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.spine_helpers import Result, frank

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "recipe-local"
SITE = "usr/local/lib/python3.11/dist-packages"
STACK = "stacks/recipe-local.toml"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("buildah") is None, reason="buildah not installed"),
    pytest.mark.skipif(shutil.which("make") is None, reason="make not installed"),
]


def _world_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("recipe_local_world", EXAMPLE / "world.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@dataclass
class Built:
    """The rendered repo, the values put into it, and the composed image."""

    repo: Path
    values: dict[str, str]
    layout: Path
    summary: dict  # type: ignore[type-arg]
    world: ModuleType


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    world = _world_module()
    top = tmp_path_factory.mktemp("recipe-local")
    made = world.make_world(top / "world")
    with world.serve(made.served) as url:
        repo = top / "repo"
        values = world.render(repo, made, url)
        locked = frank("lock", STACK, cwd=repo)
        assert locked.code == 0, locked.err
        done = frank("compose", STACK, "--builder", "buildah", "--json", cwd=repo)
        assert done.code == 0, done.err
        summary = json.loads(done.out)
        yield Built(repo, values, Path(summary["image"]["layout"]), summary, world)


def _variant(built: Built, tmp_path: Path) -> Path:
    """A copy of the rendered repo to make wrong (its image file still names the base)."""
    copy = tmp_path / "repo"
    shutil.copytree(built.repo, copy, ignore=shutil.ignore_patterns("out", "bases"),
                    symlinks=True)
    source = copy / "parts/recipe-scm-src/1.toml"  # its git source: the copy's own
    source.write_text(source.read_text().replace(str(built.repo), str(copy)))
    return copy


def _one_line(result: Result, code: int = 2) -> str:
    assert result.code == code, (result.out, result.err)
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.err, result.err
    return lines[0]


def _lock(built: Built) -> Any:
    return json.loads((built.repo / "stacks/recipe-local.lock").read_text())


def _plan(built: Built) -> Any:
    return json.loads((built.layout.parent / "plan.json").read_text())


def _view(layout: Path):  # type: ignore[no-untyped-def]
    from frank.audit.layers import read_image
    from tests.test_official_image_path import _blobs

    return read_image(_blobs(layout))


def _audit(built: Built, target: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    result = frank("audit", target, "--json", cwd=built.repo)
    return result.code, json.loads(result.out) if result.out else {}


def _without_layer(built: Built, tmp_path: Path, holds: Callable[[list[str]], bool]) -> Path:
    """The built image, config and all, without the last layer whose member names ``holds``
    accepts: an image that skipped that part's layer, consistent in every digest."""
    import tarfile

    from frank.image.oci import layout_blob_path, resolve_manifest
    from tests.oci_helpers import write_layout
    from tests.test_official_image_path import _blobs

    def names(blob: Path) -> list[str]:
        with tarfile.open(blob) as tar:
            return tar.getnames()

    blobs = _blobs(built.layout)
    drop = [i for i, b in enumerate(blobs) if holds(names(b))][-1]
    _, _, manifest = resolve_manifest(built.layout)
    config = json.loads(layout_blob_path(built.layout, manifest["config"]["digest"]).read_bytes())
    del config["history"]  # one entry per layer: the one taken out has no match
    # the stack it names is kept: a layout is held to that stack's lock in the repo
    return write_layout(tmp_path / "wrong", [b.read_bytes() for i, b in enumerate(blobs)
                                             if i != drop], config=config,
                        annotations=manifest.get("annotations"))


def _compose_fails(built: Built, tmp_path: Path, manifest: str, old: str, new: str) -> str:
    """The one line of a compose of a variant whose ``manifest`` has ``old`` made ``new``
    (it locks, and its build fails)."""
    repo = _variant(built, tmp_path)
    path = repo / manifest
    assert old in path.read_text()
    path.write_text(path.read_text().replace(old, new))
    assert frank("lock", STACK, cwd=repo).code == 0
    return _one_line(frank("compose", STACK, "--builder", "buildah", "--out",
                           str(tmp_path / "out"), cwd=repo))


def _copy_image(built: Built, tmp_path: Path) -> Path:
    layout = tmp_path / "image"
    shutil.copytree(built.layout, layout)
    return layout


# --- A: the image is audited at the end of the build, and passes ---------------------------

def test_the_recipe_composes_and_its_audit_passes(built: Built) -> None:
    assert built.summary["engine"]["strategy"] == "image"
    assert built.summary["audit"]["ok"] and built.summary["audit"]["differences"] == []
    code, report = _audit(built, STACK)
    assert code == 0, report
    cubins = next(o for o in report["cuda"] if o["owner"] == "recipe-cubins")
    assert cubins["sass"] == ["sm_120"] and cubins["runs_as_sass"] == 1


# --- B1, B2: the official-image path: the closure is the image's, remove/overrides act ------

def test_the_closure_is_the_images_and_remove_and_overrides_take_effect(built: Built) -> None:
    lock = _lock(built)
    assert lock["base_python"]["dists"]["recipe-kernels"] == "1.0"
    assert lock["base_python"]["dists"]["recipe-cubin"] == "1.0"
    doc = tomllib.loads((built.repo / "stacks/pylock.recipe-local.toml").read_text())
    versions = {p["name"]: p["version"] for p in doc["packages"]}
    # recipe-ext asks for recipe-common>=1.0: the index has 2.0, the image 1.0: kept
    assert versions["recipe-common"] == "1.0"
    assert versions["recipe-kernels"] == "2.0" and versions["recipe-jit"] == "1.0"
    from frank.audit.checks import installed_dists

    view = _view(built.layout)
    dists = {d.name: d.version for d in installed_dists(view)}
    assert "recipe-cubin" not in dists
    assert view.get(f"{SITE}/recipe_cubin/__init__.py") is None
    assert dists["recipe-kernels"] == "2.0" and dists["recipe-jit"] == "1.0"
    assert view.get(f"{SITE}/recipe_kernels/old_only.py") is None  # 1.0's own file
    assert dists["recipe-common"] == "1.0" and dists["recipe-ext"] == "1.0+cu130"


def test_revert_describes_the_image(built: Built) -> None:
    """B2: a revert of the removal says what the image would hold again: the image's own
    recipe-cubin 1.0, and nothing else (never the engine, never the image's set)."""
    from tests.test_official_image_path import _walk

    said = frank("revert", "drop-recipe-cubin", "--stack", STACK, "--dry-run", "--json",
                 cwd=built.repo)
    assert said.code == 0, said.err
    changes = {c["distribution"]: (c["old"], c["new"]) for c in _walk(json.loads(said.out))
               if isinstance(c, dict) and "distribution" in c and "old" in c}
    assert changes == {"recipe-cubin": (None, "1.0")}, changes


def test_an_image_that_keeps_the_removed_distribution_fails_its_audit(
        built: Built, tmp_path: Path) -> None:
    wrong = _without_layer(built, tmp_path, lambda names: any(
        ".wh.recipe_cubin" in n for n in names))
    code, report = _audit(built, str(wrong))
    assert code == 1
    found = [d for d in report["differences"] if d["check"] == "removed distribution present"]
    assert found and found[0]["part"] == "drop-recipe-cubin", report["differences"]


# --- B3: a second index, a local version label ----------------------------------------------

def test_the_second_indexs_wheel_is_locked_and_an_unmapped_one_is_refused(
        built: Built, tmp_path: Path) -> None:
    lock = _lock(built)
    assert lock["indexes"]["local"]["url"] == built.values["INDEX_URL"]
    doc = tomllib.loads((built.repo / "stacks/pylock.recipe-local.toml").read_text())
    ext = next(p for p in doc["packages"] if p["name"] == "recipe-ext")
    assert ext["wheels"][0]["url"] == built.values["EXT_URL"] and "%2B" in built.values["EXT_URL"]
    repo = _variant(built, tmp_path)
    stack = repo / STACK
    stack.write_text(stack.read_text().replace('recipe-ext = "local"\n', ""))
    line = _one_line(frank("lock", STACK, cwd=repo))
    assert STACK in line and "from_index.recipe-ext" in line and "not on PyPI" in line


# --- B4, B5: the URL patch on the host; the lock lists exactly what runs in a container ----

def test_the_url_patch_is_applied_on_the_host_and_impure_is_exact(built: Built) -> None:
    plan, lock = _plan(built), _lock(built)
    patch = next(x for x in plan["layers"] if x["name"] == "patch:engine-fix")
    assert not patch["run"] and not patch["network"]
    entry = _view(built.layout).get(f"{SITE}/recipe_engine/serve.py")
    import hashlib

    assert entry is not None and entry.sha256 == hashlib.sha256(
        b"GREETING = 'patched'\n").hexdigest()
    runs = {x["name"] for x in plan["layers"] if x["run"] or x["pip_install"] or x["stage"]}
    listed = {":".join(line.split(":")[:2]) for line in lock["impure"]}
    assert runs == listed == {"package:recipe-scm-src", "step:recipe-jit-make"}
    # the source build's stage installs nothing first: it is off the network, and says so
    stage = next(x for x in plan["layers"] if x["name"] == "package:recipe-scm-src")
    assert not stage["network"]
    said = next(line for line in lock["impure"] if line.startswith("package:recipe-scm-src"))
    assert "off the network" in said and "reach" not in said


def test_a_patched_file_that_differs_fails_the_audit(built: Built, tmp_path: Path) -> None:
    target = f"{SITE}/recipe_engine/serve.py"
    # the image without the patch's layer: the engine's file is the image's own, unpatched
    layout = _without_layer(built, tmp_path, lambda names: target in names)
    code, report = _audit(built, str(layout))
    assert code == 1
    hit = [d for d in report["differences"] if d["path"] == "/" + target]
    assert hit and hit[0]["part"] == "engine-fix", report["differences"]


# --- B6, B7: the cubin folder: ignored files, declared archs, the audit's CUDA check --------

def test_a_cubin_folder_whose_files_git_ignores_is_refused(built: Built,
                                                             tmp_path: Path) -> None:
    repo = _variant(built, tmp_path)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / ".git/info/exclude").write_text("*.cubin\n")
    line = frank("check", cwd=repo).err.strip().splitlines()[-1]
    assert "parts/recipe-cubins/1.toml" in line and "path" in line
    assert "probe.cubin would be left out of the image" in line


def test_archs_that_cannot_run_on_the_target_are_refused(built: Built, tmp_path: Path) -> None:
    repo = _variant(built, tmp_path)
    manifest = repo / "parts/recipe-cubins/1.toml"
    manifest.write_text(manifest.read_text().replace('archs = ["sm_120"]', 'archs = ["sm_90a"]'))
    result = frank("check", cwd=repo)
    assert result.code == 2
    line = result.err.strip().splitlines()[-1]
    assert "parts/recipe-cubins/1.toml" in line and "archs" in line
    assert "runs on the stack's target sm_120" in line


def test_a_cubin_for_another_arch_fails_the_audit(built: Built, tmp_path: Path) -> None:
    from tests.test_audit import rewrite

    layout = _copy_image(built, tmp_path)
    target = "opt/frank/cubins/recipe/probe.cubin"
    wrong = (EXAMPLE / "wrong/probe-sm90.cubin").read_bytes()
    rewrite(layout, target, lambda ms: [(m, wrong if m.name.lstrip("./") == target else d)
                                        for m, d in ms])
    code, report = _audit(built, str(layout))
    assert code == 1
    arch = [d for d in report["differences"] if d["check"] == "declared arch missing"]
    assert arch and arch[0]["part"] == "recipe-cubins", report["differences"]
    assert arch[0]["path"] == "/opt/frank/cubins/recipe"  # the part's folder
    assert arch[0]["lock"] == "sm_120" and "sm_90" in arch[0]["image"]


# --- B8, B9: the make step: up to date in the image; an undeclared change stops the build ---

def test_the_steps_make_output_is_up_to_date_in_the_image(built: Built) -> None:
    from tests.test_step_fidelity import in_image

    script = ("make -q -C /opt/frank/jit kernel.so; echo first=$?; "
              "touch /usr/include/recipe/recipe.h; make -q -C /opt/frank/jit kernel.so; "
              "echo then=$?")
    ran = in_image(built.layout, "/bin/sh", "-c", script)
    # up to date as built; and make -q can say otherwise: once the header is newer
    assert "first=0" in ran.stdout and "then=1" in ran.stdout, (ran.stdout, ran.stderr)


def test_a_step_that_changes_an_undeclared_path_stops_the_build(built: Built,
                                                                 tmp_path: Path) -> None:
    line = _compose_fails(built, tmp_path, "parts/recipe-jit-make/1.toml",
                          "make -C /opt/frank/jit",
                          "make -C /opt/frank/jit && touch /usr/include/recipe/x.h")
    assert "step recipe-jit-make changed files outside its outputs" in line
    assert "/usr/include/recipe/x.h (added)" in line


# --- B10: the source build carries the version its commit implies -------------------------

def test_the_source_build_has_the_version_its_commit_implies(built: Built) -> None:
    from frank.audit.checks import installed_dists

    src = built.repo / "sources/recipe-scm"
    short = built.world.git("rev-parse", "--short", built.values["SCM_COMMIT"], cwd=src)
    want = f"0.1.1.dev1+g{short}"
    locked = next(p for p in _lock(built)["parts"] if p["name"] == "recipe-scm-src")
    assert locked["verified"] == {"scm_version": want}
    dists = {d.name: d.version for d in installed_dists(_view(built.layout))}
    assert dists["recipe-scm"] == want


def test_without_scm_version_the_source_build_fails_instead_of_guessing(
        built: Built, tmp_path: Path) -> None:
    repo = _variant(built, tmp_path)
    manifest = repo / "parts/recipe-scm-src/1.toml"
    manifest.write_text(manifest.read_text().replace("scm_version = true\n", ""))
    assert frank("lock", STACK, cwd=repo).code == 0
    failed = frank("compose", STACK, "--builder", "buildah", "--out", str(tmp_path / "out"),
                   cwd=repo)
    assert failed.code == 2, failed.err
    log = (tmp_path / "out" / "build.log").read_text()
    assert "setuptools-scm was unable to detect version" in log


# --- issue 54: the last silent wrong answers ------------------------------------------------

def test_a_removed_distribution_leaves_nothing_importable(built: Built) -> None:
    """Item 1: the image's recipe-cubin (a package folder with a data folder, as
    flashinfer-cubin) is gone whole: no empty folder that Python would import as a namespace
    package (whiteouts of its files alone left ``recipe_cubin/cubins/`` behind)."""
    from tests.test_step_fidelity import in_image

    view = _view(built.layout)
    assert view.get(f"{SITE}/recipe_cubin") is None
    assert list(view.under(f"{SITE}/recipe_cubin")) == []
    assert view.get(f"{SITE}/recipe_kernels") is not None  # a replaced one keeps its folder
    ran = in_image(built.layout, "python3", "-c",
                   "import importlib.util as u; print('spec', u.find_spec('recipe_cubin'))")
    assert "spec None" in ran.stdout, (ran.stdout, ran.stderr)


def test_an_image_that_keeps_the_removed_folders_fails_its_audit(
        built: Built, tmp_path: Path) -> None:
    """Item 1, wrong: the removal layer as it was made before (a whiteout of each file, the
    folders left): the audit names the folder and the part."""
    from tests.test_audit import rewrite

    layout = _copy_image(built, tmp_path)
    folder = f"{SITE}/recipe_cubin"

    def files_only(members: list) -> list:  # type: ignore[type-arg]
        import tarfile

        out = [(m, d) for m, d in members if m.name.lstrip("./") != f"{SITE}/.wh.recipe_cubin"]
        for rel in ("__init__.py", "cubins/table.txt"):
            info = tarfile.TarInfo(f"{folder}/{posixpath.dirname(rel)}/.wh."
                                   f"{posixpath.basename(rel)}".replace("//", "/"))
            out.append((info, b""))
        return out

    rewrite(layout, f"{SITE}/.wh.recipe_cubin", files_only)
    code, report = _audit(built, str(layout))
    assert code == 1, report
    ghost = [d for d in report["differences"]
             if d["check"] == "folder of removed recipe-cubin present"]
    assert ghost and ghost[0]["part"] == "drop-recipe-cubin", report["differences"]
    assert ghost[0]["path"] == "/" + folder and "importable" in ghost[0]["image"]


@pytest.mark.parametrize(("manifest", "old", "new", "field", "near"), [
    ("parts/drop-recipe-cubin/1.toml", 'remove = ["recipe-cubin"]',
     'remove = ["recipe-cubim"]', "remove", "recipe-cubin"),
    ("parts/recipe-kernels-bump/1.toml", 'overrides = ["recipe-kernels==2.0"]',
     'overrides = ["recipe-kernelz==2.0"]', "overrides", "recipe-kernels"),
    ("parts/engine-fix/1.toml", 'requires = ["recipe-engine"]',
     'requires = ["recipe-engin"]', "requires", "recipe-engine"),
    (STACK, 'recipe-jit = "local"', 'recipe-jot = "local"', "from_index.recipe-jot",
     "recipe-jit"),
])
def test_a_name_that_is_not_there_is_refused(built: Built, tmp_path: Path, manifest: str,
                                             old: str, new: str, field: str,
                                             near: str) -> None:
    """Item 4: a typo in remove, overrides, requires or from_index is one line naming the
    file, the field, the name and the closest real one (it used to lock, build and audit
    with exit 0, the package left as it was)."""
    repo = _variant(built, tmp_path)
    path = repo / manifest
    assert old in path.read_text()
    path.write_text(path.read_text().replace(old, new))
    line = _one_line(frank("lock", STACK, cwd=repo))
    typo = new.split('"')[1].split("==")[0] if field != "from_index.recipe-jot" else "recipe-jot"
    assert typo in line and f"closest is {near}" in line, line
    assert manifest in line and field in line, line


def test_a_patch_places_every_file_or_the_build_fails_naming_it(built: Built,
                                                                 tmp_path: Path) -> None:
    """Item 2: engine-fix's new tools/recipe_probe.py, outside the engine's package, is at
    its declared destination and held by the audit; without the destination the build
    fails in one line naming the file (before, it was left out and only logged)."""
    import hashlib

    placed = _view(built.layout).get("opt/frank/engine-fix/tools/recipe_probe.py")
    assert placed is not None
    assert placed.sha256 == hashlib.sha256(built.world.TOOL.encode()).hexdigest()
    line = _compose_fails(built, tmp_path, "parts/engine-fix/1.toml",
                          '[destinations]\ntools = "/opt/frank/engine-fix/tools"\n', "")
    assert "patch:engine-fix" in line and "cannot place" in line, line
    assert "tools/recipe_probe.py" in line, line


def test_diff_counts_what_a_step_removes(built: Built, tmp_path: Path) -> None:
    """Item 5: recipe-jit-make's removes take the image's recipe-legacy out; frank diff
    against the same stack without the step says recipe-legacy 1.0 goes (it said nothing,
    the step's deletion invisible)."""
    repo = _variant(built, tmp_path)
    (repo / "stacks/no-step.toml").write_text(
        'extends = "recipe-local.toml"\nremove = ["recipe-jit-make"]\n')
    assert frank("lock", "stacks/no-step.toml", cwd=repo).code == 0
    said = frank("diff", "stacks/no-step.toml", STACK, "--json", cwd=repo)
    assert said.code == 0, said.err
    closure = {c["distribution"]: (c["old"], c["new"]) for c in json.loads(said.out)["closure"]}
    assert closure == {"recipe-legacy": ("1.0", None)}, closure


def test_a_step_that_leaves_a_removed_distributions_files_fails_the_audit(
        built: Built, tmp_path: Path) -> None:
    """Item 5, wrong: the step's layer without the whiteout of recipe_legacy/ (its
    dist-info still whited out): the audit names the file left and the step."""
    from tests.test_audit import rewrite

    layout = _copy_image(built, tmp_path)
    assert _view(layout).get(f"{SITE}/recipe_legacy/__init__.py") is None
    rewrite(layout, "opt/frank/jit", lambda ms: [
        (m, d) for m, d in ms if m.name.lstrip("./") != f"{SITE}/.wh.recipe_legacy"])
    code, report = _audit(built, str(layout))
    assert code == 1, report
    left = [d for d in report["differences"]
            if d["check"] == "file of removed recipe-legacy present"]
    assert left and left[0]["part"] == "recipe-jit-make", report["differences"]


def test_a_revert_takes_the_index_mapping_it_leaves_behind(built: Built) -> None:
    """Item 6: reverting recipe-kernels-bump leaves recipe-jit (asked for only by
    recipe-kernels 2.0) mapped to the index with nothing asking for it; the revert takes the
    mapping with it (it was refused in one line)."""
    said = frank("revert", "recipe-kernels-bump", "--stack", STACK, "--dry-run", "--json",
                 cwd=built.repo)
    assert said.code == 0, said.err
    done = json.loads(said.out)
    assert done["mappings_taken"] == ["recipe-jit"], done
    closure = {c["distribution"]: (c["old"], c["new"]) for c in done["diff"]["closure"]}
    assert closure["recipe-jit"] == ("1.0", None)
    assert closure["recipe-kernels"] == ("2.0", "1.0")


def test_a_conflict_with_the_images_version_names_it_and_the_overrides_line(
        built: Built, tmp_path: Path) -> None:
    """Item 8: recipe-needy wants recipe-common>=2.0, the image holds 1.0: the one line says
    the version is the image's and shows the overrides line that would change it (uv's "No
    solution found" came through alone)."""
    import hashlib
    import urllib.request

    repo = _variant(built, tmp_path)
    url = built.values["INDEX_URL"].removesuffix("/simple") + \
        "/files/recipe_needy-1.0-py3-none-any.whl"
    with urllib.request.urlopen(url) as reply:
        sha = hashlib.sha256(reply.read()).hexdigest()
    part = (repo / "parts/recipe-ext/1.toml").read_text()
    (repo / "parts/recipe-needy").mkdir()
    (repo / "parts/recipe-needy/1.toml").write_text(
        part.replace('"recipe-ext"', '"recipe-needy"').replace(built.values["EXT_URL"], url)
        .replace(built.values["EXT_SHA256"], sha))
    (repo / "stacks/needy.toml").write_text('extends = "recipe-local.toml"\n[from_index]\n'
                                            'recipe-needy = "local"\n[add]\n'
                                            'recipe-needy = "1"\n')
    line = _one_line(frank("lock", "stacks/needy.toml", cwd=repo))
    assert "recipe-common 1.0 is the base image's version" in line, line
    assert 'overrides = ["recipe-common>=2.0"]' in line, line


def test_the_plan_says_where_commands_could_reach_the_network_unseen(built: Built) -> None:
    """The source build's stage and the make step need no network (the lock says so), but a
    setup.py or a Makefile could still try: the plan says, for each, that the network is
    cut only where this user may, and that then the lock could not see it."""
    layers = {x["name"]: x for x in _plan(built)["layers"]}
    for name in ("package:recipe-scm-src", "step:recipe-jit-make"):
        assert not layers[name]["network"]
        assert "ways the lock cannot see" in layers[name]["why"], layers[name]["why"]
    assert "cannot see" not in layers["patch:engine-fix"]["why"]  # built on the host


def test_a_base_brought_on_a_file_is_used_with_no_registry(built: Built, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """Item 7 on the example: the engine image pinned under a registry that cannot be
    reached. Reading it is one line naming the host and `frank image import`; the saved
    layout imported, `frank lock` runs; then with nothing of the base in the cache at all,
    `frank check` and `frank lock --check` still pass (the lock's record of the same pin)."""
    from tests.image.image_helpers import free_port

    repo = _variant(built, tmp_path)
    digest = built.values["BASE_REF"].rsplit("@", 1)[1]
    ref = f"127.0.0.1:{free_port()}/vendor/recipe-engine@{digest}"
    for name in ("images/recipe-engine-image.toml", "parts/recipe-engine/1.toml"):
        path = repo / name
        path.write_text(path.read_text().replace(built.values["BASE_REF"], ref))
    monkeypatch.setenv("FRANK_CACHE", str(tmp_path / "cache"))
    line = _one_line(frank("lock", STACK, cwd=repo))
    assert f"the registry {ref.split('/')[0]} cannot be reached" in line, line
    assert "frank image import FILE" in line
    imported = frank("image", "import", str(built.repo / "bases/recipe-engine-image"), cwd=repo)
    assert imported.code == 0, imported.err
    assert frank("lock", STACK, cwd=repo).code == 0
    monkeypatch.setenv("FRANK_CACHE", str(tmp_path / "empty"))
    checked = frank("check", cwd=repo)
    assert checked.code == 0, checked.err
    assert frank("lock", "--check", STACK, cwd=repo).code == 0
