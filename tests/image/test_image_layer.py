"""Deterministic layers: what varies between machines must not reach the tar bytes."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from frank.errors import FrankError
from frank.image.layer import build_layer, collect, write_tar
from frank.image.spec import LayerInput
from frank.store.blobs import BlobStore

KEY = "1" * 64


def _tree(root: Path, *, mtime: int, mode: int) -> Path:
    (root / "pkg" / "__pycache__").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("x = 1\n")
    (root / "pkg" / "mod.pyc").write_bytes(b"\0junk")
    (root / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\0junk")
    (root / "bin").mkdir()
    (root / "bin" / "run").write_text("#!/bin/sh\n")
    (root / "bin" / "run").chmod(0o700)
    (root / "pkg" / "__init__.py").chmod(mode)
    (root / "link").symlink_to("pkg/__init__.py")
    for p in root.rglob("*"):
        os.utime(p, (mtime, mtime), follow_symlinks=False)
    return root


def _tar(root: Path, epoch: int = 1700000000) -> bytes:
    buf = io.BytesIO()
    write_tar(collect([(root, "/opt/app")]), epoch, buf)
    return buf.getvalue()


def test_same_content_same_bytes(tmp_path: Path) -> None:
    a = _tar(_tree(tmp_path / "a", mtime=1, mode=0o600))
    b = _tar(_tree(tmp_path / "b", mtime=2_000_000_000, mode=0o664))
    assert a == b


def test_members_are_normalized(tmp_path: Path) -> None:
    data = _tar(_tree(tmp_path / "a", mtime=5, mode=0o600), epoch=1234)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == sorted(names)
    assert names[:2] == ["opt", "opt/app"], "parent directories come first"
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)
    by = {m.name: m for m in members}
    assert by["opt/app/pkg/__init__.py"].mode == 0o644
    assert by["opt/app/bin/run"].mode == 0o755
    assert by["opt/app/link"].issym() and by["opt/app/link"].linkname == "pkg/__init__.py"
    for m in members:
        assert (m.uid, m.gid, m.uname, m.gname, m.mtime) == (0, 0, "", "", 1234)


def test_epoch_changes_bytes(tmp_path: Path) -> None:
    root = _tree(tmp_path / "a", mtime=5, mode=0o644)
    assert _tar(root, 1) != _tar(root, 2)


def test_conflicting_sources_refused(tmp_path: Path) -> None:
    (tmp_path / "x").write_text("1")
    (tmp_path / "y").write_text("2")
    with pytest.raises(FrankError, match="two sources"):
        collect([(tmp_path / "x", "/f"), (tmp_path / "y", "/f")])


def test_relative_image_path_refused(tmp_path: Path) -> None:
    (tmp_path / "x").write_text("1")
    with pytest.raises(FrankError, match="absolute"):
        collect([(tmp_path / "x", "etc/x")])


def test_missing_source_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(FrankError, match="does not exist"):
        collect([(tmp_path / "nope", "/x")])


def test_known_key_is_not_retarred(tmp_path: Path, store: BlobStore) -> None:
    root = _tree(tmp_path / "a", mtime=5, mode=0o644)
    layer = LayerInput("part:x", KEY, ((root, "/opt/app"),))
    rec1, built1 = build_layer(store, layer, 7)
    (root / "pkg" / "__init__.py").write_text("changed but the key says not")
    rec2, built2 = build_layer(store, layer, 7)
    assert built1 and not built2 and rec1 == rec2
    _, built3 = build_layer(store, layer, 8)
    assert built3, "another epoch is another tar"


def test_unreadable_source_is_one_line(tmp_path: Path, store: BlobStore) -> None:
    """A file that cannot be read mid-tar (here: a dangling path swapped in) is one line."""
    d = tmp_path / "d"
    d.mkdir()
    (d / "f").write_text("x")
    layer = LayerInput("part:x", KEY, ((d, "/opt"),))
    real_open = Path.open

    def vanish(self: Path, *a: object, **k: object) -> object:
        if self.name == "f":
            self.unlink()
        return real_open(self, *a, **k)  # type: ignore[arg-type]

    import unittest.mock

    with unittest.mock.patch.object(Path, "open", vanish), pytest.raises(FrankError) as exc:
        build_layer(store, layer, 1)
    assert "cannot read its files" in exc.value.one_line()
    assert list(store.blob_dir.iterdir()) == [] and store.get_layer(KEY) is None
