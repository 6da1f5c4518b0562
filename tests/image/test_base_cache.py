"""A cached base's content check runs once per layer digest in the developer's loop, and
again whenever the layer changed or the store trusts nothing (release mode)."""

from __future__ import annotations

import os
from pathlib import Path

from frank.assemble.baselayout import cached_base, layout_from_rootfs
from frank.image.oci import layout_blob_path, read_layout
from frank.store.blobs import BlobStore


def _maker(tmp: Path, store: BlobStore) -> object:
    root = tmp / "rootfs"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "os-release").write_text("ID=frank-test\n" + "x" * 5000)
    return lambda layout: layout_from_rootfs(root, store, layout, epoch=0, created_by="t")


def test_the_check_runs_once_per_layer_and_again_after_an_edit(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "cache")
    calls: list[Path] = []

    def check(layout: Path) -> bool:
        calls.append(layout)
        return True

    make = _maker(tmp_path, store)
    first = cached_base(store, "k" * 64, "t", make, check)  # type: ignore[arg-type]
    assert calls == []  # just made: nothing to check
    again = cached_base(store, "k" * 64, "t", make, check)  # type: ignore[arg-type]
    assert again.digest == first.digest and len(calls) == 1
    cached_base(store, "k" * 64, "t", make, check)  # type: ignore[arg-type]
    assert len(calls) == 1  # the same layer, vouched by the ledger: not read again

    full = BlobStore(tmp_path / "cache", full_verify=True)
    cached_base(full, "k" * 64, "t", make, check)  # type: ignore[arg-type]
    assert len(calls) == 2  # release mode trusts no earlier check

    # an edit that keeps size and mtime: the ledger sees the ctime, the layer hashes wrong,
    # the base is made again (and its check is not needed: it is new)
    layer = layout_blob_path(first.layout, read_layout(first.layout).layers[0].digest)
    st = layer.stat()
    data = bytearray(layer.read_bytes())
    data[600] ^= 0xFF
    layer.chmod(0o644)
    layer.write_bytes(bytes(data))
    os.utime(layer, ns=(st.st_atime_ns, st.st_mtime_ns))
    remade = cached_base(store, "k" * 64, "t", make, check)  # type: ignore[arg-type]
    assert remade.digest == first.digest
    assert any((store.root / "quarantine").glob("base-*"))
    assert read_layout(remade.layout).digest == first.digest  # every blob hashes right


def test_a_failing_check_makes_the_base_again(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "cache")
    make = _maker(tmp_path, store)
    cached_base(store, "j" * 64, "t", make, lambda layout: True)  # type: ignore[arg-type]
    cached_base(store, "j" * 64, "t", make, lambda layout: True)  # type: ignore[arg-type]
    calls: list[int] = []

    def refuse(layout: Path) -> bool:
        calls.append(1)
        return False

    # the recorded check was for the same layers, so a new check is not asked for ...
    cached_base(store, "j" * 64, "t", make, refuse)  # type: ignore[arg-type]
    assert calls == []
    # ... unless the record of it is gone or names other layers
    (store.root / "bases" / ("j" * 64 + ".checked")).write_text("sha256:" + "0" * 64 + "\n")
    cached_base(store, "j" * 64, "t", make, refuse)  # type: ignore[arg-type]
    assert calls == [1] and any((store.root / "quarantine").glob("base-*"))
