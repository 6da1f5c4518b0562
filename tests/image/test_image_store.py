"""The blob store: atomic writes, verification on read, the layer index."""

from __future__ import annotations

from pathlib import Path

import pytest

from frank.errors import FrankError
from frank.store.blobs import BlobStore, LayerRecord, sha256_bytes


def test_put_and_read_roundtrip(store: BlobStore) -> None:
    d = store.put_bytes(b"hello")
    assert d == sha256_bytes(b"hello")
    assert store.read_bytes(d) == b"hello"
    assert store.put_bytes(b"hello") == d
    assert store.stats.blobs_written == 1 and store.stats.blobs_reused == 1


def test_tampered_blob_is_caught_and_moved_aside(store: BlobStore) -> None:
    d = store.put_bytes(b"x" * 1000)
    path = store.path(d)
    with path.open("r+b") as f:  # same size, different content
        f.write(b"y")
    with pytest.raises(FrankError) as exc:
        store.verified_path(d)
    msg = exc.value.one_line()
    assert "\n" not in msg and str(path) in msg and d in msg
    assert not path.exists(), "a bad blob must not stay where it would be used"
    with pytest.raises(FrankError, match="missing"):
        store.verified_path(d)


def test_tamper_is_caught_by_a_fresh_process_view(tmp_path: Path) -> None:
    """The stamp shortcut must not survive a write, even across BlobStore instances."""
    s1 = BlobStore(tmp_path / "c")
    d = s1.put_bytes(b"a" * 4096)
    s1.verified_path(d)
    s1.path(d).write_bytes(b"b" * 4096)
    s2 = BlobStore(tmp_path / "c")
    with pytest.raises(FrankError, match="does not match its digest"):
        s2.verified_path(d)


def test_full_verify_rehashes(tmp_path: Path) -> None:
    s = BlobStore(tmp_path / "c", full_verify=True)
    d = s.put_bytes(b"abc")
    s.verified_path(d)
    s.verified_path(d)
    assert s.stats.full_hashes == 2 and s.stats.stamp_hits == 0


def test_failed_write_leaves_nothing(store: BlobStore) -> None:
    with pytest.raises(RuntimeError), store.writer() as w:
        w.write(b"partial")
        raise RuntimeError("boom")
    assert list(store.blob_dir.iterdir()) == []
    assert list(store.tmp_dir.iterdir()) == []


def test_layer_index(store: BlobStore) -> None:
    d = store.put_bytes(b"layer")
    rec = LayerRecord(digest=d, diff_id=d, size=5, media_type="m")
    key = "ab" * 32
    assert store.get_layer(key) is None
    store.put_layer(key, rec)
    assert store.get_layer(key) == rec
    store.path(d).unlink()
    assert store.get_layer(key) is None, "an index entry without its blob is a miss"
    with pytest.raises(FrankError):
        store.get_layer("not-a-key")
