"""images/*.toml: bases pinned by digest only; the test base (pinned .debs) is cached."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from frank.assemble.base import resolve_base
from frank.assemble.baselayout import BaseImage
from frank.errors import FrankError
from frank.image.oci import read_layout
from frank.image.remote import push_layout
from frank.model.imagefile import load_image_file, parse_pinned_ref
from frank.resolve.debs.archive import apt_mirror
from frank.store.blobs import BlobStore

REPO = Path(__file__).resolve().parents[2]
D = "sha256:" + "a" * 64


@pytest.mark.parametrize("ref", ["debian:bookworm", "docker.io/library/python:3.11-slim",
                                 "127.0.0.1:5000/frank/base", "oci:/some/layout",
                                 "debian@sha256:abc"])
def test_tag_only_or_unpinned_refused(tmp_path: Path, ref: str) -> None:
    f = tmp_path / "base.toml"
    f.write_text(f'name = "b"\nref = "{ref}"\n')
    with pytest.raises(FrankError) as exc:
        load_image_file(f)
    msg = exc.value.one_line()
    assert "\n" not in msg and str(f) in msg and "ref" in msg
    assert "digest" in msg or "not an image reference" in msg


@pytest.mark.parametrize("ref,name", [
    (f"debian:bookworm@{D}", "debian"),
    (f"127.0.0.1:5000/frank/base@{D}", "127.0.0.1:5000/frank/base"),
    (f"oci:../layouts/base@{D}", "oci:../layouts/base"),
])
def test_pinned_refs_accepted(ref: str, name: str) -> None:
    assert parse_pinned_ref(ref) == (name, D)


def test_image_file_validation(tmp_path: Path) -> None:
    f = tmp_path / "b.toml"
    f.write_text('name = "b"\nref = "x@' + D + '"\ncolour = "red"\n')
    with pytest.raises(FrankError, match="colour"):
        load_image_file(f)
    f.write_text('name = "b"\n')
    with pytest.raises(FrankError, match="exactly one"):
        load_image_file(f)
    f.write_text("name = \n")
    with pytest.raises(FrankError, match="invalid TOML"):
        load_image_file(f)


def test_debootstrap_base_is_refused_with_what_to_write(tmp_path: Path) -> None:
    """debootstrap gave each machine its own digest: a recipe that asks for one is refused."""
    images = tmp_path / "images"
    images.mkdir()
    f = images / "old.toml"
    f.write_text('name = "old"\n[debootstrap]\nsuite = "bookworm"\n')
    with pytest.raises(FrankError, match=r"frank debs lock") as exc:
        load_image_file(f)
    assert exc.value.field == "debootstrap"
    (tmp_path / "stacks").mkdir()
    stack = tmp_path / "stacks" / "s.toml"
    stack.write_text('[image]\nbase = "old"\n')
    from frank.resolve.resolver import load_base_image

    with pytest.raises(FrankError, match="no longer made") as exc2:
        load_base_image(tmp_path, "old", stack)
    assert exc2.value.field == "debootstrap"


def test_repo_image_files_parse() -> None:
    files = sorted((REPO / "images").glob("*.toml"))
    assert files
    for f in files:
        load_image_file(f)


def test_apt_mirror_found() -> None:
    assert apt_mirror().startswith(("http://", "https://", "file:/"))


def test_local_layout_ref(tmp_path: Path, mini_base: BaseImage) -> None:
    f = tmp_path / "b.toml"
    f.write_text(f'name = "mini"\nref = "oci:{mini_base.layout}@{mini_base.digest}"\n')
    base = resolve_base(f, BlobStore(tmp_path / "c"))
    assert base.layout == mini_base.layout and base.digest == mini_base.digest


@pytest.mark.slow
def test_registry_ref_is_pulled_once(tmp_path: Path, mini_base: BaseImage,
                                     registry: str) -> None:
    push_layout(mini_base.layout, f"{registry}/frank/mini")
    f = tmp_path / "b.toml"
    f.write_text(f'name = "mini"\nref = "{registry}/frank/mini@{mini_base.digest}"\n')
    store = BlobStore(tmp_path / "c")
    base = resolve_base(f, store)
    assert read_layout(base.layout).digest == mini_base.digest
    t = time.monotonic()
    assert resolve_base(f, store) == base
    assert time.monotonic() - t < 1


@pytest.mark.slow
def test_test_base_is_cached(test_base: BaseImage) -> None:
    info = read_layout(test_base.layout)
    assert info.digest == test_base.digest
    t = time.monotonic()
    again = resolve_base(REPO / "images" / "test-base.toml", BlobStore(), quiet=True)
    assert time.monotonic() - t < 1.0
    assert again == test_base
    names = _members(test_base)
    assert "usr/bin/python3" in names or "usr/bin/python3.11" in names
    assert not any(n.startswith("dev/") for n in names)


def _members(base: BaseImage) -> set[str]:
    import tarfile

    info = read_layout(base.layout, verify_layers=False)
    path = base.layout / "blobs" / "sha256" / info.layers[0].digest.split(":")[1]
    with tarfile.open(path) as tar:
        return set(tar.getnames())


def _run(*args: str) -> str:
    import subprocess

    return subprocess.run(list(args), capture_output=True, text=True, check=True).stdout


@pytest.mark.slow
def test_docker_v2s2_base_keeps_its_digest(tmp_path: Path, mini_base: BaseImage,
                                           registry: str) -> None:
    """A Docker-format base (as Docker Hub serves) is pulled byte for byte and builds."""
    import json

    from frank.image.oci import build_image
    from frank.image.spec import ImageSpec

    repo = f"{registry}/frank/v2s2"
    _run("skopeo", "copy", "-q", "--format", "v2s2", "--dest-tls-verify=false",
         f"oci:{mini_base.layout}", f"docker://{repo}:x")
    raw = _run("skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{repo}:x")
    assert json.loads(raw)["mediaType"].startswith("application/vnd.docker")
    digest = "sha256:" + __import__("hashlib").sha256(raw.encode()).hexdigest()
    f = tmp_path / "b.toml"
    f.write_text(f'name = "v2"\nref = "{repo}:x@{digest}"\n')
    store = BlobStore(tmp_path / "c")
    base = resolve_base(f, store)
    assert base.digest == digest and base.pinned is None
    spec = ImageSpec(base_layout=base.layout, base_digest=base.digest, layers=(),
                     source_date_epoch=0)
    out = tmp_path / "out"
    build_image(spec, store, out)
    info = read_layout(out)
    assert info.layers[0].media_type == "application/vnd.oci.image.layer.v1.tar"


@pytest.mark.slow
def test_index_pin_follows_this_platform(tmp_path: Path, mini_base: BaseImage,
                                         registry: str) -> None:
    """A pin on a multi-platform index resolves to this machine's image, checked by hash."""
    import hashlib
    import shutil as sh

    from frank.image.oci import _go_arch, canonical_json, resolve_manifest

    lay = tmp_path / "multi"
    sh.copytree(mini_base.layout, lay)
    _, mraw, _ = resolve_manifest(lay)
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
             "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                            "digest": mini_base.digest, "size": len(mraw),
                            "platform": {"os": "linux", "architecture": _go_arch()}}]}
    iraw = canonical_json(index)
    idig = "sha256:" + hashlib.sha256(iraw).hexdigest()
    (lay / "blobs" / "sha256" / idig.split(":")[1]).write_bytes(iraw)
    (lay / "index.json").write_bytes(canonical_json({"schemaVersion": 2, "manifests": [
        {"mediaType": index["mediaType"], "digest": idig, "size": len(iraw)}]}))
    repo = f"{registry}/frank/multi"
    _run("skopeo", "copy", "-q", "--all", "--preserve-digests", "--dest-tls-verify=false",
         f"oci:{lay}", f"docker://{repo}@{idig}")
    f = tmp_path / "b.toml"
    f.write_text(f'name = "multi"\nref = "{repo}@{idig}"\n')
    base = resolve_base(f, BlobStore(tmp_path / "c"))
    assert (base.digest, base.pinned) == (mini_base.digest, idig)
    wrong = tmp_path / "w.toml"
    wrong.write_text(f'name = "multi"\nref = "{repo}@sha256:{"1" * 64}"\n')
    with pytest.raises(FrankError, match="cannot read"):
        resolve_base(wrong, BlobStore(tmp_path / "c2"))
