"""The image's base held to what pins it in the repo, never to the base the cache offers.

A ``[debs]`` base is a function of its pinned .debs (``frank.assemble.debs``): its one layer is
made again here from the .debs (each fetched or read from the store and hashed in full
against the sha256 its lock pins) into a hashing sink, never to disk, and its config and
manifest from ``baselayout.base_documents``. Equal layer bytes mean every file of every
.deb's data at its hash and dpkg's status as the .debs' control files say; a different
layer is named by its first paths that differ. A base pinned by reference is held to its
pinned digest: the manifest (and index) read from the layout must hash to it.

Cached bases are never consulted for an expectation: a cache whose base layout, config,
manifest, index and record were all recomputed (issue 53) gives an image the audit refuses.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frank.audit.layers import Entry, MergedView, TarReader
from frank.audit.report import Difference
from frank.errors import FrankError
from frank.hashing import sha256_file
from frank.resolve.lock import Lock
from frank.store.blobs import BlobStore

SHOWN = 5  # differing paths named per base layer


@dataclass
class DerivedBase:
    """The base as its pins make it: manifest digest, layer digests, config document."""

    name: str
    digest: str
    layers: list[str]
    config: dict[str, Any]
    entries: list[list[Entry]] | None  # each layer's members, where the layer was made here
    how: str


class _Sink:
    """A write-only file: the tar's sha256, size and members, nothing kept."""

    def __init__(self) -> None:
        self.hash = hashlib.sha256()
        self.size = 0
        self.reader = TarReader()

    def write(self, data: bytes | bytearray | memoryview) -> int:
        self.hash.update(data)
        self.reader.feed(data)
        self.size += len(data)
        return len(data)

    def flush(self) -> None:
        pass


def derive_base(lock: Lock, root: Path, store: BlobStore,
                mirrors: Iterable[Path] = (), *, have: list[str] | None = None) -> DerivedBase:
    """The base ``lock`` names, from the repo's image file and its pins alone. A [debs]
    base derived before from the same .debs lock by the same code is kept
    (``frank.audit.kept``, vouched by the stat ledger; never under FRANK_VERIFY=full):
    unless ``have``, the image's base layer digests, differ from it, when it is made
    again to name the paths that differ."""
    from frank.model.imagefile import load_image_file

    name = str(lock.base_image["name"])
    path = root / "images" / f"{name}.toml"
    img = load_image_file(path)
    want = lock.base_image.get("definition_sha256")
    if want is not None and sha256_file(path) != want:
        raise FrankError(f"images/{name}.toml is not the one the lock pins (run `frank lock`)",
                         file=path)
    if img.debs is not None:
        return _debs(lock, name, path, img.debs, store, mirrors, have)
    return _pinned_ref(name, path, img.ref or "", store)


def _debs(lock: Lock, name: str, path: Path, src: Any, store: BlobStore,
          mirrors: Iterable[Path], have: list[str] | None) -> DerivedBase:
    from frank.assemble.baselayout import base_documents
    from frank.assemble.debs.build import EPOCH, base_meta, pinned_debs
    from frank.assemble.debs.rootfs import write_root
    from frank.resolve.debs.lock import current_lock
    from frank.resolve.debs.resolver import archive_roots
    from frank.store.fetch import Fetcher

    debs, sha = current_lock(src, path)
    if lock.base_image.get("debs_lock_sha256") not in (None, sha):
        raise FrankError(f"images/{name}.debs.lock is not the one the lock pins "
                         "(run `frank lock`)", file=path.with_suffix(".debs.lock"))
    from frank.audit.kept import base_key, keep_base, kept_base

    key = base_key(sha)
    kept = kept_base(store, key)
    if kept is not None and (have is None or kept["layers"] == have[:len(kept["layers"])]):
        # the same .debs lock made this base before, with this code: the layer digest is
        # what it was (a base that differs from the image's is made again, to name paths)
        return DerivedBase(name, str(kept["digest"]), [str(x) for x in kept["layers"]],
                           kept["config"], None, f"{len(debs.packages)} pinned .debs")
    fetcher = Fetcher(BlobStore(store.root, full_verify=True), tuple(mirrors))
    paths = fetcher.fetch_all(pinned_debs(debs, archive_roots(src)))
    sink = _Sink()
    write_root([(p, paths[p.sha256]) for p in debs.packages], sink,  # type: ignore[arg-type]
               epoch=EPOCH, tmp_dir=store.tmp_dir)
    layer = "sha256:" + sink.hash.hexdigest()
    config_raw, manifest_raw = base_documents(layer, sink.size, epoch=EPOCH, **base_meta(debs))
    made = DerivedBase(name, "sha256:" + hashlib.sha256(manifest_raw).hexdigest(), [layer],
                       json.loads(config_raw), [sink.reader.close()],
                       f"{len(debs.packages)} pinned .debs")
    keep_base(store, key, {"digest": made.digest, "layers": made.layers,
                           "config": made.config})
    return made


def _pinned_ref(name: str, path: Path, ref: str, store: BlobStore) -> DerivedBase:
    from frank.assemble.base import resolve_base
    from frank.image.oci import read_layout_blob
    from frank.model.imagefile import parse_pinned_ref

    _, pinned = parse_pinned_ref(ref, file=path)
    base = resolve_base(path, store, quiet=True)

    def blob(digest: str, what: str) -> bytes:
        raw = read_layout_blob(base.layout, digest, what)
        if "sha256:" + hashlib.sha256(raw).hexdigest() != digest:
            raise FrankError(f"the base's {what} does not hash to {digest}", file=base.layout)
        return raw

    if base.pinned is not None:  # the pin names an index: it must list this manifest
        index = json.loads(blob(base.pinned, "index"))
        if base.digest not in {m.get("digest") for m in index.get("manifests") or []}:
            raise FrankError(f"the pinned index {base.pinned} lists no {base.digest}",
                             file=base.layout)
    if pinned not in (base.digest, base.pinned):
        raise FrankError(f"the base layout is {base.digest}, images/{name}.toml pins {pinned}",
                         file=base.layout)
    manifest = json.loads(blob(base.digest, "manifest"))
    config = json.loads(blob(str(manifest["config"]["digest"]), "config"))
    return DerivedBase(name, base.digest, [str(d["digest"]) for d in manifest["layers"]],
                       config, None, f"its pinned digest {pinned}")


def _key(e: Entry) -> tuple[str, str, int, str]:
    return (e.kind, e.sha256, e.mode & 0o7777, e.link)


def base_differences(view: MergedView, manifest: dict[str, Any], base: DerivedBase
                     ) -> tuple[list[Difference], int]:
    """Each image layer below frank's against the base its pins make; how many they are.
    (The manifest's base annotation: ``base_annotation``.)"""
    have = [str(d.get("digest")) for d in manifest.get("layers") or []]
    part = f"base:{base.name}"
    out: list[Difference] = []
    for i, digest in enumerate(base.layers):
        if i < len(have) and have[i] == digest:
            continue
        if base.entries is not None and i < len(have) and i < len(view.layers):
            mine = {e.path: e for e in view.layers[i].entries}
            want = {e.path: e for e in base.entries[i]}
            paths = sorted(p for p in set(mine) | set(want)
                           if p not in mine or p not in want or _key(mine[p]) != _key(want[p]))
            for p in paths[:SHOWN]:
                w, m = want.get(p), mine.get(p)
                out.append(Difference(
                    part=part, path="/" + p, check=f"base file differs from {base.how}",
                    lock=_said(w), image=_said(m)))
            if len(paths) > SHOWN:
                out.append(Difference(part=part, path=f"layer {i}", check="base layer",
                                      lock=digest, image=f"{have[i]} ({len(paths)} paths "
                                                         "differ)"))
            if paths:
                continue
        out.append(Difference(part=part, path=f"layer {i}", check=f"base layer from {base.how}",
                              lock=digest, image=have[i] if i < len(have) else "none"))
    return out, len(base.layers)


def base_annotation(manifest: dict[str, Any], base: DerivedBase,
                    engine_noted: bool = False) -> list[Difference]:
    """The base digest the manifest names, against the derived base's."""
    # an engine that built the image names its own copy of the base here; the base's layers
    # above are what is held to the pins
    noted = (manifest.get("annotations") or {}).get("org.opencontainers.image.base.digest")
    if noted is not None and noted != base.digest and not engine_noted:
        return [Difference(part=f"base:{base.name}", path="manifest annotations",
                           check="base digest", lock=base.digest, image=str(noted))]
    return []


def _said(e: Entry | None) -> str:
    if e is None:
        return "absent"
    if e.kind == "file":
        return f"file sha256 {e.sha256[:16]} mode {e.mode & 0o7777:o}"
    if e.kind in ("symlink", "hardlink"):
        return f"{e.kind} to {e.link}"
    return f"{e.kind} mode {e.mode & 0o7777:o}"
