"""Issue 40 B1, B2, B4: a stack on an official engine image (``image = "...@sha256:..."``).

The base is this test's own: a tiny OCI layout pinned by digest whose site folder holds
distributions installed from wheels made here (real dist-info, real RECORD): the engine
(frank-oi-engine), frank-oi-alpha 1.0, -beta 1.0, -gone 1.0 and -delta 1.0. A find-links
folder offers alpha 1.0 and 2.0, beta 2.0 (which needs zeta), zeta 1.0, delta 2.0 (which
needs a distribution no index has) and gamma 1.0 (which needs alpha). The stacks add gamma
(a pinned local wheel), take gone out (``remove``), move beta to 2.0 (``overrides``, its
dependency resolved) and delta to 2.0 (``overrides`` with ``no_deps``), and patch the
engine's own files with a diff fetched by URL from 127.0.0.1. Nothing here reaches Docker
Hub or GitHub.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from frank.assemble.install import install_wheels
from frank.assemble.wheel import build_wheel
from frank.audit.checks import installed_dists
from frank.audit.layers import read_image
from frank.image.inventory import base_inventory, cached_inventory
from frank.store.blobs import BlobStore
from tests.http_helpers import serve_folder
from tests.oci_helpers import tar_of, write_layout
from tests.spine_helpers import copy_repo, frank
from tests.test_hermetic_build import make_package

SITE = "usr/local/lib/python3.11/dist-packages"
COMMIT = "b" * 40
PATCH = ("--- a/frank_oi_engine/serve.py\n+++ b/frank_oi_engine/serve.py\n"
         "@@ -1 +1 @@\n-GREETING = 'hello'\n+GREETING = 'patched'\n")
TAIL = '[provenance]\nlicence = "Apache-2.0"\n[revert]\naction = "remove"\n'


def _wheel(folder: Path, name: str, version: str, deps: list[str] | None = None,
           files: dict[str, str] | None = None) -> Path:
    src = make_package(folder / f"src-{name}-{version}", name, version, deps=deps,
                       files=files or {"__init__.py": f"VERSION = {version!r}\n"
                                       "def register():\n    return None\n"})
    return build_wheel(src, folder)


def _tar_tree(root: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(root.rglob("*")):
            info = tar.gettarinfo(str(path), path.relative_to(root).as_posix())
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if path.is_file():
                with path.open("rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return buf.getvalue()


def _manifest_digest(layout: Path) -> str:
    return str(json.loads((layout / "index.json").read_text())["manifests"][0]["digest"])


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    """The base layout (by digest), the find-links folder and a server for the patch."""
    top = tmp_path_factory.mktemp("official-image")
    base_wheels = top / "base-wheels"
    links = top / "links"
    base_wheels.mkdir()
    links.mkdir()
    made = [
        _wheel(base_wheels, "frank-oi-engine", "1.0",
               files={"__init__.py": "def register():\n    return None\n",
                      "serve.py": "GREETING = 'hello'\n"}),
        _wheel(base_wheels, "frank-oi-alpha", "1.0"),
        _wheel(base_wheels, "frank-oi-beta", "1.0",
               files={"__init__.py": "VERSION = '1.0'\n", "old_only.py": "OLD = 1\n"}),
        _wheel(base_wheels, "frank-oi-gone", "1.0"),
        _wheel(base_wheels, "frank-oi-delta", "1.0"),
    ]
    tree = top / "base-tree"
    install_wheels([(w.name, w) for w in made], tree, "/" + SITE)
    layout = write_layout(top / "base-layout", [_tar_tree(tree)])
    for name, version, deps in (("frank-oi-alpha", "1.0", None), ("frank-oi-alpha", "2.0", None),
                                ("frank-oi-beta", "2.0", ["frank-oi-zeta==1.0"]),
                                ("frank-oi-zeta", "1.0", None),
                                # needs a distribution no index has: only no_deps installs it
                                ("frank-oi-delta", "2.0", ["frank-oi-nowhere==9.9"]),
                                ("frank-oi-gamma", "1.0", ["frank-oi-alpha>=1.0"])):
        _wheel(links, name, version, deps)
    served = top / "served"
    served.mkdir()
    (served / "fix.patch").write_text(PATCH)

    with serve_folder(served) as url:
        yield {"layout": layout, "digest": _manifest_digest(layout), "links": links,
               "patch_url": f"{url}/fix.patch"}


def _part(repo: Path, name: str, body: str) -> None:
    folder = repo / "parts" / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "1.toml").write_text(
        f'kind = "{body.split(chr(10), 1)[0]}"\nname = "{name}"\nversion = "1"\n'
        f'summary = "a test part"\nstatus = "candidate"\n{body.split(chr(10), 1)[1]}\n{TAIL}')


def _stack(repo: Path, name: str, parts: list[str]) -> str:
    listed = "".join(f'{p} = "1"\n' for p in parts)
    (repo / "stacks" / f"{name}.toml").write_text(
        '[model]\nname = "none"\n[target]\narch = "cpu"\ngpus = 0\n[image]\n'
        f'base = "offbase"\n[parts]\n{listed}')
    return f"stacks/{name}.toml"


@pytest.fixture
def repo(tmp_path: Path, world: dict[str, object]) -> Path:
    """The repo with the base definition and the parts of this file."""
    repo = copy_repo(tmp_path / "repo")
    ref = f"oci:{world['layout']}@{world['digest']}"
    (repo / "images" / "offbase.toml").write_text(
        f'name = "offbase"\ndescription = "a tiny engine image"\nref = "{ref}"\n')
    links = Path(str(world["links"]))
    gamma = links / "frank_oi_gamma-1.0-py3-none-any.whl"
    _part(repo, "oi-engine", textwrap.dedent(f"""\
        engine
        repo = "https://github.com/example/oi-engine"
        commit = "{COMMIT}"
        image = "{ref}"
        distribution = "frank-oi-engine"
        python = "3.11"
        torch = "2.11.0"
        cuda = "13.0.2"
        cuda_arch_list = ["12.0"]"""))
    _part(repo, "gamma", textwrap.dedent(f"""\
        package
        distribution = "frank-oi-gamma"
        requires = ["oi-engine"]
        [wheel]
        path = "{gamma}"
        sha256 = "{hashlib.sha256(gamma.read_bytes()).hexdigest()}\""""))
    _part(repo, "drop-gone", 'package\ndistribution = "frank-oi-gone"\n'
                             'remove = ["frank-oi-gone"]')
    _part(repo, "bump-beta", 'package\ndistribution = "frank-oi-beta"\n'
                             'overrides = ["frank-oi-beta==2.0"]')
    _part(repo, "bump-delta", 'package\ndistribution = "frank-oi-delta"\n'
                              'overrides = ["frank-oi-delta==2.0"]\nno_deps = true')
    _part(repo, "eng-fix", textwrap.dedent(f"""\
        patch
        source_repo = "https://github.com/example/oi-engine"
        url = "{world['patch_url']}"
        sha256 = "{hashlib.sha256(PATCH.encode()).hexdigest()}"
        applies_to = ["{COMMIT}"]
        touches_compiled = false
        requires = ["oi-engine"]"""))
    _stack(repo, "img", ["oi-engine", "gamma", "drop-gone", "bump-beta", "eng-fix"])
    return repo


def _lock(repo: Path, stack: str) -> dict:
    result = frank("lock", stack, cwd=repo)
    assert result.code == 0, result.err
    return json.loads((repo / stack).with_suffix(".lock").read_text())


def _plan(repo: Path, stack: str) -> dict:
    result = frank("compose", stack, "--builder", "none", "--json", cwd=repo)
    assert result.code == 0, result.err
    return json.loads((Path(json.loads(result.out)["out"]) / "plan.json").read_text())


def _compose(repo: Path, stack: str, out: Path) -> dict:
    result = frank("compose", stack, "--builder", "oci", "--json", "--out", str(out), cwd=repo)
    assert result.code == 0, result.err
    return json.loads(result.out)


def _pylock_versions(repo: Path, stack: str) -> dict[str, str]:
    import tomllib

    name = Path(stack).stem
    doc = tomllib.loads((repo / "stacks" / f"pylock.{name}.toml").read_text())
    return {p["name"]: p["version"] for p in doc["packages"]}


def _blobs(layout: Path) -> list[Path]:
    manifest = json.loads((layout / "blobs/sha256" / _manifest_digest(layout)
                           .split(":")[1]).read_text())
    return [layout / "blobs/sha256" / d["digest"].split(":")[1] for d in manifest["layers"]]


# -- B2: the closure is resolved against what the image holds ------------------------------

def test_the_closure_is_resolved_against_the_images_own_distributions(repo: Path) -> None:
    lock = _lock(repo, "stacks/img.toml")
    versions = _pylock_versions(repo, "stacks/img.toml")
    # gamma needs alpha: the image has alpha 1.0, so the closure keeps it (uv alone: 2.0)
    assert versions["frank-oi-alpha"] == "1.0"
    assert versions["frank-oi-beta"] == "2.0"  # the override, over the image's 1.0
    assert "frank-oi-gone" not in versions
    base = lock["base_python"]
    assert base["site"] == "/" + SITE
    assert base["dists"] == {"frank-oi-alpha": "1.0", "frank-oi-beta": "1.0",
                             "frank-oi-delta": "1.0", "frank-oi-engine": "1.0",
                             "frank-oi-gone": "1.0"}
    plan = _plan(repo, "stacks/img.toml")
    installed = {w["name"]: w["version"] for x in plan["layers"] for w in x.get("wheels", [])}
    # alpha is there already; beta's new dependency zeta is not
    assert installed == {"frank-oi-gamma": "1.0", "frank-oi-beta": "2.0", "frank-oi-zeta": "1.0"}


def test_diff_and_revert_describe_the_image(repo: Path) -> None:
    _stack(repo, "plain", ["oi-engine", "gamma"])
    assert frank("lock", "stacks/plain.toml", "stacks/img.toml", cwd=repo).code == 0
    result = frank("diff", "stacks/plain.toml", "stacks/img.toml", "--json", cwd=repo)
    assert result.code == 0, result.err
    closure = {c["distribution"]: (c["old"], c["new"]) for c in json.loads(result.out)["closure"]}
    # the engine and the image's own distributions are there on both sides
    assert closure == {"frank-oi-beta": ("1.0", "2.0"), "frank-oi-gone": ("1.0", None),
                       "frank-oi-zeta": (None, "1.0")}
    revert = frank("revert", "bump-beta", "--stack", "stacks/img.toml", "--dry-run", "--json",
                   cwd=repo)
    assert revert.code == 0, revert.err
    assert '"frank-oi-beta"' in revert.out
    said = json.loads(revert.out)
    text = json.dumps(said)
    assert "frank-oi-engine" not in text  # never "the engine removed"
    changes = [c for c in _walk(said) if isinstance(c, dict)
               and c.get("distribution") == "frank-oi-beta"]
    assert changes and changes[0]["old"] == "2.0" and changes[0]["new"] == "1.0"


def _walk(value: object) -> Iterator[object]:
    yield value
    if isinstance(value, dict):
        for v in value.values():
            yield from _walk(v)
    elif isinstance(value, list):
        for v in value:
            yield from _walk(v)


def test_the_inventory_is_kept_by_digest_and_checked_by_content(
        world: dict[str, object], tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "cache")
    layout, digest = Path(str(world["layout"])), str(world["digest"])
    first = base_inventory(layout, digest, store)
    assert {d.name for d in first.dists} == {"frank-oi-alpha", "frank-oi-beta", "frank-oi-delta",
                                             "frank-oi-engine", "frank-oi-gone"}
    gone = first.get("frank-oi-gone")
    assert gone is not None and "frank_oi_gone/__init__.py" in gone.files
    assert cached_inventory(store, digest) == first
    pointer = store.root / "bases" / "inventory" / digest.split(":")[1]
    blob = store.path(pointer.read_text().strip())
    blob.write_bytes(blob.read_bytes().replace(b"frank-oi-gone", b"frank-oi-fake"))
    assert cached_inventory(store, digest) is None  # a changed blob is not trusted
    assert base_inventory(layout, digest, store) == first  # read again from the layers


def test_a_whiteout_in_the_base_hides_a_distribution(world: dict[str, object],
                                                      tmp_path: Path) -> None:
    blobs = _blobs(Path(str(world["layout"])))
    info = f"{SITE}/frank_oi_gone-1.0.dist-info"
    top = tar_of({f"{SITE}/.wh.frank_oi_gone-1.0.dist-info": b""})
    layout = write_layout(tmp_path / "layout", [blobs[0].read_bytes(), top])
    inv = base_inventory(layout, _manifest_digest(layout), BlobStore(tmp_path / "cache"))
    assert info not in {d.info for d in inv.dists}
    assert inv.get("frank-oi-alpha") is not None


def test_a_base_layer_that_does_not_match_its_digest_is_refused(
        world: dict[str, object], tmp_path: Path) -> None:
    import shutil

    from frank.errors import FrankError

    layout = tmp_path / "layout"
    shutil.copytree(Path(str(world["layout"])), layout)
    blob = _blobs(layout)[0]
    data = bytearray(blob.read_bytes())
    data[-1] ^= 1  # in the tar's zero padding: still a readable tar
    blob.write_bytes(bytes(data))
    with pytest.raises(FrankError, match="does not match its digest"):
        base_inventory(layout, str(world["digest"]), BlobStore(tmp_path / "cache"))


def test_lock_check_never_downloads_an_engine_image(repo: Path) -> None:
    official = (repo / "images/vllm-openai-v0.24.0.toml").read_text().split('ref = "')[1]
    engine = repo / "parts/oi-engine/1.toml"
    engine.write_text(engine.read_text().replace(engine.read_text().split('image = "')[1]
                                                 .split('"')[0], official.split('"')[0]))
    stack = _stack(repo, "hub", ["oi-engine", "drop-gone"])
    text = (repo / stack).read_text().replace('"offbase"', '"vllm-openai-v0.24.0"')
    (repo / stack).write_text(text)
    result = frank("lock", "--check", stack, cwd=repo)
    assert result.code == 2, result.out + result.err
    assert "not in the cache yet" in result.err and len(result.err.strip().splitlines()) == 1


# -- B1: remove and overrides, built on the host ---------------------------------------------

def test_remove_and_overrides_take_effect_in_the_image(repo: Path, tmp_path: Path) -> None:
    stack = _stack(repo, "pkgs", ["oi-engine", "gamma", "drop-gone", "bump-beta", "bump-delta"])
    plan = _plan(repo, stack)
    names = [x["name"] for x in plan["layers"]]
    assert "package:drop-gone" in names
    summary = _compose(repo, stack, tmp_path / "out")
    assert summary["image"]["builder"] == "oci"
    layout = Path(summary["image"]["layout"])
    view = read_image(_blobs(layout))
    dists = {d.name: d.version for d in installed_dists(view)}
    # remove: the distribution and every file its RECORD lists are gone
    assert "frank-oi-gone" not in dists
    assert view.get(f"{SITE}/frank_oi_gone/__init__.py") is None
    assert view.get(f"{SITE}/frank_oi_gone-1.0.dist-info/METADATA") is None
    # overrides: beta 2.0 installed; 1.0's dist-info and the file 2.0 lacks are gone
    assert dists["frank-oi-beta"] == "2.0"
    assert view.get(f"{SITE}/frank_oi_beta-1.0.dist-info/RECORD") is None
    assert view.get(f"{SITE}/frank_oi_beta/old_only.py") is None
    assert dists["frank-oi-zeta"] == "1.0"  # beta 2.0's dependency, resolved
    # overrides with no_deps: delta 2.0 without the dependency no index has
    assert dists["frank-oi-delta"] == "2.0" and "frank-oi-nowhere" not in dists
    assert view.get(f"{SITE}/frank_oi_delta-1.0.dist-info/RECORD") is None
    assert dists["frank-oi-alpha"] == "1.0" and dists["frank-oi-gamma"] == "1.0"
    assert dists["frank-oi-engine"] == "1.0"  # the image's own, untouched
    audit = frank("audit", str(layout), "--json", cwd=repo)
    assert audit.code == 0, audit.out + audit.err
    assert json.loads(audit.out)["ok"] is True


def test_overrides_resolve_their_dependencies_unless_no_deps(repo: Path) -> None:
    stack = _stack(repo, "delta", ["oi-engine", "gamma", "bump-delta"])  # gamma: find-links
    assert frank("lock", stack, cwd=repo).code == 0
    assert "frank-oi-nowhere" not in _pylock_versions(repo, stack)
    manifest = repo / "parts/bump-delta/1.toml"
    manifest.write_text(manifest.read_text().replace("no_deps = true\n", ""))
    result = frank("lock", stack, cwd=repo)
    assert result.code == 2, result.out
    assert "frank-oi-nowhere" in result.err and len(result.err.strip().splitlines()) == 1
    manifest.write_text(manifest.read_text().replace(  # no_deps with nothing to install
        'overrides = ["frank-oi-delta==2.0"]\n', 'remove = ["frank-oi-gone"]\nno_deps = true\n'))
    refused = frank("lock", stack, cwd=repo)
    assert refused.code == 2 and "no_deps" in refused.err, refused.err


# -- B4: a URL patch is fetched on the host --------------------------------------------------

def test_a_url_patch_is_fetched_and_applied_on_the_host(repo: Path, tmp_path: Path) -> None:
    plan = _plan(repo, "stacks/img.toml")
    lock = json.loads((repo / "stacks/img.lock").read_text())
    # nothing runs in a container, nothing reaches the network there
    assert [x["name"] for x in plan["layers"] if x["run"] or x.get("stage")] == []
    assert not any(x["network"] for x in plan["layers"])
    assert lock["impure"] == []
    summary = _compose(repo, "stacks/img.toml", tmp_path / "out")
    assert summary["image"]["builder"] == "oci"
    layout = Path(summary["image"]["layout"])
    view = read_image(_blobs(layout))
    # applied to the image's own engine file, fetched into the store by sha256
    entry = view.get(f"{SITE}/frank_oi_engine/serve.py")
    assert entry is not None
    assert entry.sha256 == hashlib.sha256(b"GREETING = 'patched'\n").hexdigest()
    assert BlobStore().has("sha256:" + hashlib.sha256(PATCH.encode()).hexdigest())
    audit = frank("audit", str(layout), "--json", cwd=repo)
    assert audit.code == 0, audit.out + audit.err
    assert json.loads(audit.out)["ok"] is True


def test_a_url_patch_alone_is_fetched_on_the_host_and_applied_offline(
        repo: Path, world: dict[str, object], tmp_path: Path) -> None:
    """With no package part the image's files are not read: the patch is applied with
    `patch` in the image (a container step), but the file is fetched here, never there."""
    from frank.assemble.builder import stage_host_layers
    from frank.assemble.plan import BuildPlan

    stack = _stack(repo, "fix", ["oi-engine", "eng-fix"])
    result = frank("compose", stack, "--builder", "none", "--json", cwd=repo)
    assert result.code == 0, result.err
    out = Path(json.loads(result.out)["out"])
    plan = json.loads((out / "plan.json").read_text())
    layer = next(x for x in plan["layers"] if x["name"] == "patch:eng-fix")
    url = str(world["patch_url"])
    assert url not in " ".join(layer["run"]) and not layer["network"]
    assert layer["fetched"] == [{"url": url, "sha256": hashlib.sha256(PATCH.encode()).hexdigest(),
                                 "dest": "/opt/frank/patches/eng-fix.patch"}]
    assert url not in (out / "context/Dockerfile").read_text()
    lock = json.loads((repo / "stacks/fix.lock").read_text())
    assert "fetched by URL on the host" in lock["impure"][0]
    context = tmp_path / "context"
    stage_host_layers(BuildPlan.model_validate(plan), repo, context, log=tmp_path / "log",
                      store_root=BlobStore().root)
    staged = next(context.glob("layers/*-patch-eng-fix/rootfs/opt/frank/patches/eng-fix.patch"))
    assert staged.read_text() == PATCH


def test_an_image_that_keeps_a_removed_distribution_fails_the_audit(
        repo: Path, tmp_path: Path) -> None:
    stack = _stack(repo, "pkgs", ["oi-engine", "gamma", "drop-gone", "bump-beta"])
    summary = _compose(repo, stack, tmp_path / "out")
    layout = Path(summary["image"]["layout"])
    plan = json.loads((layout.parent / "plan.json").read_text())
    removal = next(x["index"] for x in plan["layers"] if x["name"] == "package:drop-gone")
    blobs = _blobs(layout)
    # the same image without the layer that takes frank-oi-gone out (index 0 is the base's)
    named = {"dev.frank.stack": "pkgs"}  # a layout is held to its stack's lock in the repo
    wrong = write_layout(tmp_path / "wrong", [b.read_bytes() for i, b in enumerate(blobs)
                                              if i != removal], annotations=named)
    audit = frank("audit", str(wrong), "--json", cwd=repo)
    assert audit.code == 1, audit.out + audit.err
    report = json.loads(audit.out)
    found = [d for d in report["differences"] if d["check"] == "removed distribution present"]
    assert found and found[0]["part"] == "drop-gone"
    # and without the layer that installs beta 2.0 over the image's 1.0
    deps = next(x["index"] for x in plan["layers"]
                if any(w["name"] == "frank-oi-beta" for w in x.get("wheels", [])))
    old = write_layout(tmp_path / "old-beta", [b.read_bytes() for i, b in enumerate(blobs)
                                                if i != deps], annotations=named)
    audit = frank("audit", str(old), "--json", cwd=repo)
    assert audit.code == 1, audit.out + audit.err
    lines = json.loads(audit.out)["differences"]
    assert any("frank_oi_beta-1.0.dist-info" in d["path"] or d["lock"] == "frank-oi-beta 2.0"
               for d in lines), lines
