"""Blobs written around the page cache hold exactly the bytes written (issue 41)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from frank.store.blobs import BlobStore
from frank.store.direct import BLOCK, DirectFile

SIZES = [0, 1, 4095, 4096, 4097, BLOCK - 1, BLOCK, BLOCK + 1, 2 * BLOCK + 12345]


@pytest.mark.parametrize("direct", [True, False])
def test_every_size_and_split_reads_back_as_written(tmp_path: Path, direct: bool) -> None:
    """Whole buffers, tails that are and are not a multiple of 4096, pieces that straddle a
    buffer's end, a memoryview of another buffer: the file is the bytes given, in order."""
    data = os.urandom(2 * BLOCK + 12345)
    for size in SIZES:
        path = tmp_path / f"{size}-{direct}"
        with DirectFile(os.open(path, os.O_WRONLY | os.O_CREAT), direct=direct) as f:
            at, step = 0, 1
            while at < size:
                piece = memoryview(data)[at:min(size, at + step)]
                assert f.write(piece) == len(piece)
                at += len(piece)
                step = step * 7 + 3  # 1, 10, 73, ...: every kind of straddle
        assert path.read_bytes() == data[:size], size


def test_a_layer_blob_written_around_the_cache_has_its_digest(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "cache")
    data = os.urandom(BLOCK + 777)
    with store.writer(around_cache=True) as w:
        w.write(data[:100])
        w.write(data[100:])
    assert w.digest == "sha256:" + hashlib.sha256(data).hexdigest()
    assert store.verified_path(w.digest).read_bytes() == data
    with pytest.raises(Exception, match="the pin says"), \
            store.writer(expected="sha256:" + "0" * 64, around_cache=True) as w2:
        w2.write(data)
    assert not any((tmp_path / "cache" / "tmp").iterdir())  # the refused temp file is gone


def test_o_direct_is_used_where_the_filesystem_takes_it(tmp_path: Path) -> None:
    """Here (ext4) the writes bypass the page cache; where a filesystem refuses O_DIRECT
    the same object writes plainly (the parametrized test above covers both paths)."""
    fd = os.open(tmp_path / "probe", os.O_WRONLY | os.O_CREAT)
    try:
        os.close(os.open(tmp_path / "p2", os.O_WRONLY | os.O_CREAT | os.O_DIRECT))
        supported = True
    except OSError:
        supported = False
    with DirectFile(fd) as f:
        assert f.direct == supported


def test_a_filesystem_that_takes_the_flag_but_refuses_the_write_gets_plain_writes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Some filesystems accept O_DIRECT and then refuse a direct write (EINVAL): the rest of
    the file goes through the page cache and the bytes are still exactly the ones given."""
    import errno
    import fcntl

    real = os.write
    refused: list[int] = []

    def write(fd: int, data: memoryview) -> int:  # type: ignore[type-arg]
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            refused.append(len(data))
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, data)

    big, small = os.urandom(3 * BLOCK + 999), os.urandom(BLOCK // 2 + 999)
    for data, split in ((big, BLOCK // 3), (small, 5000)):  # refused mid-file; at close
        path = tmp_path / f"refused-{len(data)}"
        refused.clear()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT)
        monkeypatch.setattr(os, "write", write)
        with DirectFile(fd) as f:
            f.write(data[:split])
            f.write(data[split:])
        monkeypatch.setattr(os, "write", real)
        if not f.direct and not refused:
            pytest.skip("this filesystem refuses O_DIRECT outright")
        assert path.read_bytes() == data and refused
