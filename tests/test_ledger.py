"""The stat ledger (issue 53, local mistakes): what frank hashed is taken as hashed while its
stat holds, and no longer once anything has touched the file."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from frank.store.ledger import Ledger, coarse_ns, untrusted_fs


def _hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _store(tmp_path: Path) -> Path:
    (tmp_path / "store").mkdir(exist_ok=True)
    return tmp_path / "store"


def _aged(path: Path) -> None:
    """Let the file clock pass the file's last change (the racy rule would hash it else)."""
    while coarse_ns() <= path.stat().st_ctime_ns:
        time.sleep(0.002)


def test_a_file_whose_stat_holds_is_not_hashed_again(tmp_path: Path) -> None:
    f = tmp_path / "blob"
    f.write_bytes(b"a" * 10_000)
    _aged(f)
    ledger = Ledger(_store(tmp_path))
    assert ledger.sha256(f) == _hex(b"a" * 10_000) and ledger.hashed == 1
    ledger.save()
    again = Ledger(_store(tmp_path))  # another command, reading the saved ledger
    assert again.sha256(f) == _hex(b"a" * 10_000)
    assert again.hashed == 0 and again.hits == 1


def test_an_edit_that_restores_mtime_and_size_is_hashed_again(tmp_path: Path) -> None:
    """A byte changed in place, size the same, mtime set back with os.utime: the ctime
    moved, and that is what the ledger holds the file to."""
    f = tmp_path / "blob"
    f.write_bytes(b"a" * 10_000)
    _aged(f)
    ledger = Ledger(_store(tmp_path))
    ledger.sha256(f)
    ledger.save()
    st = f.stat()
    with f.open("r+b") as handle:
        handle.seek(5000)
        handle.write(b"b")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (f.stat().st_size, f.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    assert f.stat().st_ctime_ns != st.st_ctime_ns
    again = Ledger(_store(tmp_path))
    assert again.known(f) is None
    data = bytearray(b"a" * 10_000)
    data[5000:5001] = b"b"
    assert again.sha256(f) == _hex(bytes(data)) and again.hashed == 1


def test_a_file_replaced_by_another_inode_is_hashed_again(tmp_path: Path) -> None:
    f = tmp_path / "blob"
    f.write_bytes(b"one")
    _aged(f)
    ledger = Ledger(_store(tmp_path))
    ledger.sha256(f)
    other = tmp_path / "other"
    other.write_bytes(b"two")
    os.replace(other, f)
    assert ledger.known(f) is None and ledger.sha256(f) == _hex(b"two")


def test_a_racy_entry_is_not_trusted_until_its_tick_is_over(tmp_path: Path) -> None:
    """git's racy-index rule: an entry whose ctime is not older than the time it was taken
    is not trusted as it stands; once the clock has moved on, a stat still the same is."""
    f = tmp_path / "blob"
    f.write_bytes(b"x" * 100)
    ledger = Ledger(_store(tmp_path))
    ledger.note(f, _hex(b"x" * 100))
    entry = ledger._mine[str(f)]
    assert entry is not None
    if not entry.racy:
        pytest.skip("the note was taken a tick after the write: nothing racy to check")
    st = f.stat()
    f.write_bytes(b"y" * 100)  # within the tick on a coarse clock: ctime may stay
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert ledger.known(f) is None or f.stat().st_ctime_ns == st.st_ctime_ns
    assert ledger.sha256(f) == _hex(b"y" * 100)


def test_concurrent_writers_lose_no_entries(tmp_path: Path) -> None:
    """Eight processes note 50 files each and save at the same time: every entry is kept."""
    files = tmp_path / "files"
    files.mkdir()
    for i in range(400):
        (files / f"f{i}").write_bytes(str(i).encode())
    _aged(files / "f399")
    code = ("import sys; from pathlib import Path; from frank.store.ledger import Ledger\n"
            "store, files, k = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])\n"
            "ledger = Ledger(store)\n"
            "for i in range(k * 50, k * 50 + 50):\n"
            "    ledger.sha256(files / f'f{i}')\n"
            "    if i % 10 == 0:\n"
            "        ledger.save()\n"
            "ledger.save()\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(_store(tmp_path)), str(files),
                               str(k)]) for k in range(8)]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    ledger = Ledger(_store(tmp_path))
    for i in range(400):
        assert ledger.known(files / f"f{i}") == _hex(str(i).encode()), f"f{i} was lost"
    assert not list((tmp_path / "store").glob(".ledger-*")), "a temp file was left"


def test_a_ledger_cut_short_is_no_error(tmp_path: Path) -> None:
    f = tmp_path / "blob"
    f.write_bytes(b"z")
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "ledger.json").write_text('{"format": "frank-ledger-1", "entr')
    ledger = Ledger(_store(tmp_path))
    assert ledger.sha256(f) == _hex(b"z") and ledger.hashed == 1


@pytest.fixture
def fuse_mount(tmp_path: Path) -> Iterator[Path]:
    """A real FUSE mount of a scratch folder (bindfs), or a skip saying why there is none."""
    if not shutil.which("bindfs"):
        pytest.skip("bindfs is not installed (scripts/setup installs it): no FUSE mount")
    if not os.path.exists("/dev/fuse"):
        pytest.skip("/dev/fuse is absent: no FUSE mount here")
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    mnt.mkdir()
    done = subprocess.run(["bindfs", "--no-allow-other", str(src), str(mnt)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"bindfs cannot mount here: {done.stderr.strip()[:200]}")
    try:
        yield mnt
    finally:
        for cmd in (["fusermount3", "-u"], ["fusermount", "-u"], ["umount"]):
            if shutil.which(cmd[0]) and subprocess.run(
                    [*cmd, str(mnt)], capture_output=True, check=False).returncode == 0:
                break


def test_a_file_on_fuse_is_always_hashed(fuse_mount: Path, tmp_path: Path) -> None:
    """Its stat is whatever the FUSE server says: every read of it is a hash."""
    f = fuse_mount / "blob"
    f.write_bytes(b"on fuse")
    _aged(f)
    assert untrusted_fs(f, f.stat().st_dev)
    assert not untrusted_fs(tmp_path, tmp_path.stat().st_dev)
    ledger = Ledger(_store(tmp_path))
    for _ in range(3):
        assert ledger.sha256(f) == _hex(b"on fuse")
    ledger.note(f, _hex(b"on fuse"))
    ledger.save()
    assert ledger.hashed == 3 and ledger.hits == 0
    assert Ledger(_store(tmp_path)).known(f) is None
