"""The audit's kept readings (issue 53): a layer read once is not read again while the stat
ledger vouches for both the blob and the record; anything else is read again."""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import time
from pathlib import Path

import pytest

from frank.audit.kept import keep_readings, kept_readings, vouched
from frank.audit.layers import read_layer
from frank.store.blobs import BlobStore
from frank.store.ledger import coarse_ns


def _layer(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _settled(path: Path) -> None:
    while coarse_ns() <= path.stat().st_ctime_ns:
        time.sleep(0.002)


@pytest.fixture
def kept(tmp_path: Path) -> tuple[BlobStore, str, list]:
    store = BlobStore(tmp_path / "cache")
    digest = store.put_bytes(_layer({"opt/a.txt": b"alpha\n", "opt/b.bin": b"\x7fELF" + bytes(60)}))
    _settled(store.path(digest))
    entries = read_layer(0, store.verified_path(digest)).entries
    keep_readings(store, {digest: entries})
    _settled(store.root / "audit-layers" / f"{digest.split(':')[1]}.json")
    return store, digest, entries


def test_a_kept_reading_is_the_reading(kept: tuple[BlobStore, str, list]) -> None:
    store, digest, entries = kept
    store.ledger.save()
    again = BlobStore(store.root)
    assert kept_readings(again, [digest]) == {digest: entries}
    assert vouched(again, again.path(digest), digest)


def test_a_record_edited_in_place_is_not_used(kept: tuple[BlobStore, str, list]) -> None:
    """The record's sha256 of opt/a.txt changed, size and mtime put back: read again."""
    store, digest, entries = kept
    record = store.root / "audit-layers" / f"{digest.split(':')[1]}.json"
    st = record.stat()
    doc = json.loads(record.read_bytes())
    good = entries[0].sha256
    raw = record.read_bytes().replace(good.encode(), ("0" * 64).encode())
    assert len(raw) == st.st_size and doc["data"][6][0] == good  # the sha256 column
    record.write_bytes(raw)
    os.utime(record, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert kept_readings(store, [digest]) == {}


def test_only_a_blob_the_ledger_vouches_for_is_vouched(kept: tuple[BlobStore, str, list],
                                                       tmp_path: Path) -> None:
    """A layout's hard link of the store blob is vouched for (same inode); a copy is not
    (read it), nor is the blob once it was written to, nor anything under FRANK_VERIFY=full."""
    store, digest, _ = kept
    link, copy = tmp_path / "link", tmp_path / "copy"
    os.link(store.path(digest), link)
    assert not vouched(store, link, digest)  # a link moves the ctime: hashed again first
    store.verified_path(digest)
    shutil.copyfile(store.path(digest), copy)
    assert vouched(store, link, digest) and not vouched(store, copy, digest)
    assert not vouched(BlobStore(store.root, full_verify=True), link, digest)
    assert kept_readings(BlobStore(store.root, full_verify=True), [digest]) == {}
    path = store.path(digest)
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[600] ^= 0xFF  # inside opt/a.txt's data block
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert not vouched(store, link, digest) and not vouched(store, path, digest)


def test_every_field_of_an_entry_comes_back(tmp_path: Path) -> None:
    """GPU code with its sizes and hidden count included: a kept reading loses nothing, and
    Entry and CudaCode have no field the record does not hold (a new one must be added to
    frank.audit.kept, or nothing is kept at all)."""
    from frank.audit.cuda import CudaCode
    from frank.audit.kept import shape_known
    from frank.audit.layers import Entry

    assert shape_known()
    store = BlobStore(tmp_path / "cache")
    digest = store.put_bytes(_layer({"lib/x.so": b"\x7fELF" + bytes(60)}))
    entry = Entry("lib/x.so", "file", 64, 512, 0o755, "", "ab" * 32, b"\x7fELF" + bytes(60),
                  CudaCode(frozenset({"sm_120"}), frozenset({"sm_90"}),
                           (("sass", "sm_120", 4096), ("ptx", "sm_90", 100)), 2), True)
    keep_readings(store, {digest: [entry]})
    _settled(store.root / "audit-layers" / f"{digest.split(':')[1]}.json")
    back = kept_readings(store, [digest])[digest][0]
    assert back == entry
    assert back.cuda is not None and entry.cuda is not None
    assert (back.cuda.sizes, back.cuda.hidden) == (entry.cuda.sizes, entry.cuda.hidden)


def test_gc_removes_the_readings_of_the_blobs_it_removes(kept: tuple[BlobStore, str, list],
                                                         tmp_path: Path) -> None:
    """A kept reading is named by its blob's digest: gc drops it with the blob (and a
    wheel's with the wheel), and keeps the reading of a blob the repo still references."""
    from frank.ship.gc import collect
    from frank.store.blobs import leave_users

    store, digest, entries = kept
    other = store.put_bytes(_layer({"opt/c.txt": b"kept\n"}))
    keep_readings(store, {other: entries})
    wheel = store.root / "audit-wheels" / f"{'ab' * 32}.json"
    wheel.parent.mkdir()
    wheel.write_text("{}")
    repo = tmp_path / "repo"
    (repo / "stacks").mkdir(parents=True)
    (repo / "stacks" / "x.lock").write_text(f'layer = "{other}"\n')
    store.ledger.save()
    leave_users(store.root)  # this process's shared hold: gc waits for it
    done = collect(store.root, repo, keep_days=0, wait=5)
    records = sorted(p.name for p in (store.root / "audit-layers").iterdir())
    assert records == [f"{other.split(':')[1]}.json"]
    assert not store.has(digest) and store.has(other) and not wheel.exists()
    assert done.removed.get("audit readings") == 2


def test_a_derived_base_is_kept_by_its_debs_lock_and_code(tmp_path: Path) -> None:
    """A [debs] base derived once is kept under its .debs lock's sha256 and the code that
    makes it: read back while the ledger vouches for the record, never under full verify
    (release mode derives it again), nor once the record was edited."""
    from frank.audit.kept import base_key, keep_base, kept_base

    store = BlobStore(tmp_path / "cache")
    key = base_key("1" * 64)
    assert key != base_key("2" * 64)
    made = {"digest": "sha256:" + "a" * 64, "layers": ["sha256:" + "b" * 64],
            "config": {"architecture": "amd64"}}
    keep_base(store, key, made)
    record = store.root / "audit-bases" / f"{key}.json"
    _settled(record)
    assert kept_base(store, key) == made
    assert kept_base(BlobStore(store.root, full_verify=True), key) is None
    st = record.stat()
    record.write_bytes(record.read_bytes().replace(b"b" * 64, b"c" * 64))
    os.utime(record, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert kept_base(store, key) is None


def test_run_verifies_through_the_ledger_and_still_sees_an_edit(tmp_path: Path) -> None:
    """`frank run`'s verify with the ledger: a layer hashed once is not hashed again while
    it holds still; one edited in place (same size and mtime) is hashed and refused."""
    from frank.errors import FrankError
    from frank.image.verify import verify_layout
    from tests.oci_helpers import write_layout

    layout = write_layout(tmp_path / "image", [_layer({"opt/a.txt": b"alpha\n"})])
    [blob] = [p for p in (layout / "blobs/sha256").iterdir() if p.stat().st_size > 1024]
    _settled(blob)
    ledger = BlobStore(tmp_path / "cache").ledger
    verify_layout(layout, ledger=ledger)
    hashed = ledger.hashed
    verify_layout(layout, ledger=ledger)
    assert ledger.hashed == hashed == 1
    st = blob.stat()
    data = bytearray(blob.read_bytes())
    data[600] ^= 0xFF  # inside opt/a.txt's data
    blob.write_bytes(bytes(data))
    os.utime(blob, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(FrankError, match="changed after the image"):
        verify_layout(layout, ledger=ledger)


def test_a_blob_this_process_carries_is_vouched_until_it_changes(
        kept: tuple[BlobStore, str, list], tmp_path: Path) -> None:
    """A compose links the last output's blob into its stage (the link moves the ctime, so
    the ledger's entry no longer applies) and carries it into the ledger under the output's
    name: its audit takes that file as hashed; a copy, or the file once written to, is not."""
    store, digest, _ = kept
    out, stage, copy = tmp_path / "out", tmp_path / "stage", tmp_path / "copy"
    shutil.copyfile(store.path(digest), out)
    os.link(out, stage)
    assert not vouched(store, stage, digest)
    store.ledger.carry(out, stage, digest.split(":")[1])
    shutil.copyfile(stage, copy)
    assert vouched(store, stage, digest) and not vouched(store, copy, digest)
    with open(stage, "r+b") as f:
        f.write(b"\0")
    assert not vouched(store, stage, digest)


def test_a_kept_patch_result_keys_on_the_patch_program(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Another GNU patch (fuzz and odd hunks vary between releases) is another key: a patch
    applied by one is not taken as applied by the other."""
    import frank.assemble.patching as patching
    from frank.audit.kept import patch_key

    step = {"engine_wheel": "sha256:" + "a" * 64, "destinations": {}}
    monkeypatch.setattr(patching, "_PROGRAM", None)
    here = patch_key(step, "--- a/x\n+++ b/x\n")
    assert "patch" in patching.patch_program()
    other = tmp_path / "bin" / "patch"
    other.parent.mkdir()
    other.write_text("#!/bin/sh\necho 'GNU patch 9.9'\n")
    other.chmod(0o755)
    monkeypatch.setenv("PATH", f"{other.parent}:{os.environ['PATH']}")
    monkeypatch.setattr(patching, "_PROGRAM", None)
    assert patching.patch_program() == f"{other}: GNU patch 9.9"
    assert patch_key(step, "--- a/x\n+++ b/x\n") != here
    monkeypatch.setattr(patching, "_PROGRAM", None)
