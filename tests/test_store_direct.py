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
