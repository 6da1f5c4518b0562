"""A base's OCI layout, made once and recorded in the cache: what every base kind ends in.

``cached_base`` keeps made bases under ``<cache>/bases/<key>.json``; the .debs builder
(frank.assemble.debs) and the base resolver (frank.assemble.base) both use it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from frank.errors import FrankError
from frank.fsutil import write_atomic
from frank.store.blobs import DIGEST_RE, BlobStore

# Left out of the test base: caches and docs a container never needs (as Debian's slim images).
ROOTFS_PRUNE = (
    "var/cache/apt", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/info",
    "usr/share/locale", "var/log",
)
ROOTFS_SKIP = ("dev", "proc", "sys", "run", "tmp", *ROOTFS_PRUNE)


class BaseImage(BaseModel):
    """A resolved base: a local OCI layout and the manifest digest it is pinned to."""

    model_config = ConfigDict(extra="forbid")

    name: str
    layout: Path
    digest: str  # the image manifest's digest (what ImageSpec.base_digest takes)
    pinned: str | None = None  # the image index's digest when the pin names an index


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    """One builder per base at a time (parallel test workers would build it twice)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def layout_from_rootfs(rootfs: Path, store: BlobStore, out: Path, *, epoch: int,
                       created_by: str) -> str:
    """Import a root filesystem as a one-layer OCI layout (owners and setuid kept)."""
    from frank.image.layer import collect, write_tar

    members = collect([(rootfs, "/")], preserve_owner=True, skip=ROOTFS_SKIP)
    with store.writer() as w:
        write_tar(members, epoch, w)  # type: ignore[arg-type]
    return layout_from_layer(store, out, w.digest, w.size, epoch=epoch, created_by=created_by)


def base_documents(layer: str, size: int, *, epoch: int, created_by: str,
                   architecture: str | None = None,
                   cmd: tuple[str, ...] = ("/bin/bash",)) -> tuple[bytes, bytes]:
    """The config and manifest bytes of a one-layer base around ``layer``: a function of
    its arguments only, so the audit and release mode derive a base's digest again from
    its pinned inputs (``frank.audit.base``) exactly as it was made."""
    from frank.image.layer import LAYER_MEDIA_TYPE
    from frank.image.oci import (
        OCI_CONFIG,
        OCI_MANIFEST,
        _go_arch,
        canonical_json,
        epoch_to_rfc3339,
    )

    created = epoch_to_rfc3339(epoch)
    config = {
        "architecture": architecture or _go_arch(), "os": "linux", "created": created,
        "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                   **({"Cmd": list(cmd)} if cmd else {})},
        "rootfs": {"type": "layers", "diff_ids": [layer]},
        "history": [{"created": created, "created_by": created_by}],
    }
    config_raw = canonical_json(config)
    manifest = {
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": "sha256:" +
                   hashlib.sha256(config_raw).hexdigest(), "size": len(config_raw)},
        "layers": [{"mediaType": LAYER_MEDIA_TYPE, "digest": layer, "size": size}],
    }
    return config_raw, canonical_json(manifest)


def layout_from_layer(store: BlobStore, out: Path, layer: str, size: int, *, epoch: int,
                      created_by: str, architecture: str | None = None,
                      cmd: tuple[str, ...] = ("/bin/bash",)) -> str:
    """A one-layer OCI layout around an uncompressed layer blob already in the store."""
    from frank.image.oci import OCI_INDEX, OCI_MANIFEST, canonical_json, write_layout

    config_raw, manifest_raw = base_documents(layer, size, epoch=epoch, created_by=created_by,
                                              architecture=architecture, cmd=cmd)
    config_digest = store.put_bytes(config_raw)
    digest = store.put_bytes(manifest_raw)
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
        {"mediaType": OCI_MANIFEST, "digest": digest, "size": len(manifest_raw)}]}
    write_layout(store, out, canonical_json(index), [config_digest, digest, layer],
                 epoch=epoch)
    return digest


def cached_base(store: BlobStore, key: str, name: str, make: Callable[[Path], str],
                check: Callable[[Path], bool] | None = None) -> BaseImage:
    """The base recorded under ``<cache>/bases/<key>.json``, else ``make(layout)``'s, recorded.

    The layout is always ``bases/<key>`` (the record names it relative to the cache, so a
    copied cache reads its own), and it is used only when its manifest is the recorded
    digest, every blob hashes to its name and ``check`` (what the layer must hold for this
    key) agrees; anything else is moved aside and made again. One maker per key at a time
    (parallel test workers would otherwise build it twice).
    """
    bases = store.root / "bases"
    record = bases / f"{key}.json"
    checked = bases / f"{key}.checked"
    layout = bases / key
    with _lock(bases / f"{key}.lock"):
        if record.is_file() or layout.exists():
            digest = _recorded_digest(record)
            layers = _layout_holds(layout, digest, store) if digest is not None else None
            if digest is not None and layers is not None:
                if check is None or _checked(checked, layers, store):
                    return BaseImage(name=name, layout=layout, digest=digest)
                if check(layout):  # noted, so the next compose need not read the layer
                    write_atomic(checked, "\n".join(layers) + "\n")
                    return BaseImage(name=name, layout=layout, digest=digest)
            _move_aside(store, [layout, record, checked], key)
        base = BaseImage(name=name, layout=layout, digest=make(layout))
        write_atomic(record, BaseImage(name=name, layout=Path(key),
                                       digest=base.digest).model_dump_json())
        return base


def _checked(checked: Path, layers: list[str], store: BlobStore) -> bool:
    """Whether ``check`` already passed for exactly these layer blobs (by digest, each just
    hashed or vouched for by the stat ledger): the developer's loop then skips reading the
    base's whole layer again. Never in full-verify (release) mode."""
    if store.full_verify:
        return False
    try:
        return checked.read_text().split() == layers
    except OSError:
        return False


def _recorded_digest(record: Path) -> str | None:
    try:
        digest = BaseImage.model_validate_json(record.read_text()).digest
    except (ValueError, ValidationError, OSError):
        return None
    return digest if DIGEST_RE.match(digest) else None


def _layout_holds(layout: Path, digest: str, store: BlobStore) -> list[str] | None:
    """The layer digests, if ``layout``'s first manifest is ``digest`` and its config and
    every layer hash to their names (the layout is what the base is made of: a bad blob there
    is a base to make again, not a compose that fails until someone deletes it); else None.
    A layer's hash comes from the store's stat ledger where its stat still matches."""
    from frank.image.oci import layout_blob_path, layout_manifests, read_layout

    try:
        if layout_manifests(layout)[0].get("digest") != digest:
            return None
        info = read_layout(layout, verify_layers=False)
        if info.digest != digest:
            return None
        layers = [layer.digest for layer in info.layers]
        for layer in layers:
            if "sha256:" + store.ledger.sha256(layout_blob_path(layout, layer)) != layer:
                return None
        return layers
    except (FrankError, OSError, ValueError, KeyError, AttributeError, TypeError):
        return None


def _move_aside(store: BlobStore, paths: list[Path], key: str) -> None:
    """Keep what was found for a look, out of the way of the base made again."""
    import os
    import tempfile

    quarantine = store.root / "quarantine"
    quarantine.mkdir(parents=True, exist_ok=True)
    bad = Path(tempfile.mkdtemp(prefix=f"base-{key[:16]}-", dir=quarantine))
    for path in paths:
        if path.exists() or path.is_symlink():
            os.replace(path, bad / path.name)
