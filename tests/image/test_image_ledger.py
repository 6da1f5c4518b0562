"""The stat ledger across outputs that share store blobs (issue 53): a compose of one output
links the store's blobs, which moves their ctime for every other name; the other output's
next no-op must still not hash them, and an edit must still be seen."""

from __future__ import annotations

import os
from pathlib import Path

from frank.assemble.baselayout import BaseImage
from frank.image.oci import build_image, read_layout
from frank.store.blobs import BlobStore
from frank.store.ledger import Ledger
from tests.image.image_helpers import make_sources, make_spec


def test_another_output_linking_the_same_blobs_keeps_the_ledger(
        tmp_path: Path, mini_base: BaseImage) -> None:
    src = make_sources(tmp_path / "src")
    store = BlobStore(tmp_path / "cache")
    build_image(make_spec(mini_base, src), store, tmp_path / "a")
    table = read_layout(tmp_path / "a").layers[2].digest
    blob_a = tmp_path / "a" / "blobs" / "sha256" / table.split(":")[1]
    store.ledger.save()  # a's compose ends
    src2 = make_sources(tmp_path / "src2", kernel_text="kernel v2")
    build_image(make_spec(mini_base, src2, kernel_key="v2"), store, tmp_path / "b")
    blob_b = tmp_path / "b" / "blobs" / "sha256" / table.split(":")[1]
    assert blob_a.stat().st_ino == blob_b.stat().st_ino  # b linked a's table blob
    store.ledger.save()
    ledger = Ledger(store.root)  # the next command
    assert ledger.known(blob_a) == table.split(":")[1], "a's entry was lost to b's link"
    assert ledger.known(blob_b) == table.split(":")[1]
    st = blob_a.stat()
    data = bytearray(blob_a.read_bytes())
    data[10] ^= 0xFF
    blob_a.write_bytes(bytes(data))
    os.utime(blob_a, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert Ledger(store.root).known(blob_a) is None and Ledger(store.root).known(blob_b) is None
