"""images/*.toml: bases pinned by digest only; the debootstrapped test base is cached."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from frank.errors import FrankError
from frank.image.base import (
    BaseImage,
    apt_mirror,
    load_image_file,
    parse_pinned_ref,
    resolve_base,
)
from frank.image.oci import read_layout
from frank.image.registry import push_layout
from frank.image.store import BlobStore

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
def test_debootstrap_base_is_cached(test_base: BaseImage) -> None:
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
