"""Deterministic tar layers: the same files and epoch give the same bytes on any machine.

What varies between machines and days is stripped: entries are sorted by path, owners are
uid/gid 0 with empty names, modes are normalized (0755 dirs and executables, 0644 files,
0777 symlinks), every mtime is SOURCE_DATE_EPOCH, parent directories are always present,
and ``__pycache__``/``*.pyc`` (which embed source mtimes) are left out.

Layers are stored **uncompressed** (``application/vnd.oci.image.layer.v1.tar``). gzip with
mtime=0 at a fixed level is only byte-identical while every machine runs the same deflate
implementation: zlib, zlib-ng and Chromium's zlib (all found in distro Pythons) produce
different streams at the same level, so a gzip layer's digest would depend on the machine.
The tar itself is ours, so its digest doubles as the diff_id; registries and engines accept
the uncompressed media type, and the cost is transfer size, not correctness.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from frank.errors import FrankError
from frank.hashing import check_link_inside
from frank.image.spec import LayerInput
from frank.store.blobs import BlobStore, LayerRecord

LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar"
# Bump when the tar bytes for the same input would change, so old index entries stop matching.
LAYER_FORMAT = "frank-layer-1"
EXCLUDED_DIRS = frozenset({"__pycache__"})
EXCLUDED_SUFFIXES = (".pyc",)


@dataclass(frozen=True)
class Entry:
    """One tar member to write: its path in the image and where its content comes from."""

    arcname: str  # relative, no leading slash, e.g. "opt/frank/lock.json"
    kind: str  # "dir" | "file" | "symlink"
    source: Path | None  # None for synthesized parent directories
    mode: int
    uid: int = 0
    gid: int = 0
    linkname: str = ""


def _excluded(name: str, is_dir: bool) -> bool:
    return (is_dir and name in EXCLUDED_DIRS) or (not is_dir and name.endswith(EXCLUDED_SUFFIXES))


def _arcname(dest: str, *, file: Path) -> str:
    p = PurePosixPath(dest)
    if not p.is_absolute() or ".." in p.parts:
        raise FrankError(f"image path must be absolute and without '..': {dest!r}", file=file)
    rel = str(p.relative_to("/"))
    return "" if rel == "." else rel


def _entry(src: Path, arcname: str, st: os.stat_result, preserve: bool) -> Entry | None:
    """An Entry for one filesystem object; None for special files in preserve (rootfs) mode."""
    m = st.st_mode
    uid, gid = (st.st_uid, st.st_gid) if preserve else (0, 0)
    if stat.S_ISDIR(m):
        return Entry(arcname, "dir", src, (m & 0o7777) if preserve else 0o755, uid, gid)
    if stat.S_ISREG(m):
        mode = (m & 0o7777) if preserve else (0o755 if m & 0o111 else 0o644)
        return Entry(arcname, "file", src, mode, uid, gid)
    if stat.S_ISLNK(m):
        return Entry(arcname, "symlink", src, 0o777, uid, gid, os.readlink(src))
    if preserve:
        return None  # device nodes, fifos, sockets: the runtime provides /dev
    raise FrankError("only files, directories and symlinks can go in a layer", file=src)


def collect(
    entries: Iterable[tuple[Path, str]],
    *,
    preserve_owner: bool = False,
    skip: Iterable[str] = (),
) -> list[Entry]:
    """Walk the (source, image path) pairs into a sorted, conflict-free list of members.

    ``preserve_owner`` keeps uid/gid/mode (with setuid bits) for importing a rootfs; ``skip``
    names image paths whose contents are left out (e.g. ``dev`` for a rootfs). Outside a
    rootfs, a symlink is kept as a link and must point inside the tree it is in, as the
    tree hash requires (``frank.hashing.check_link_inside``).
    """
    found: dict[str, Entry] = {}
    skip_set = {s.strip("/") for s in skip}
    tree = Path()

    def add(e: Entry) -> None:
        if e.kind == "symlink" and not preserve_owner and e.source not in (None, tree):
            assert e.source is not None
            check_link_inside(e.source, tree)
        old = found.get(e.arcname)
        if old is not None and old.kind == "dir" and e.kind == "dir":
            if old.source is None:
                found[e.arcname] = e
            return
        if old is not None and old != e:
            where = old.source or e.source or Path(e.arcname)
            raise FrankError(f"two sources for image path /{e.arcname}", file=where)
        found[e.arcname] = e

    for src, dest in entries:
        src = Path(src)
        root = _arcname(dest, file=src)
        try:
            st = src.lstat()
        except FileNotFoundError:
            raise FrankError("layer source does not exist", file=src) from None
        top = _entry(src, root, st, preserve_owner)
        if top is None:
            continue
        tree = src
        if root:
            add(top)
        if top.kind != "dir":
            continue
        for dirpath, dirnames, filenames in os.walk(src):
            rel_dir = os.path.relpath(dirpath, src)
            base = root if rel_dir == "." else (f"{root}/{rel_dir}" if root else rel_dir)
            if base in skip_set:
                dirnames[:] = []
                continue
            keep = []
            for d in sorted(dirnames):
                p = Path(dirpath, d)
                arc = f"{base}/{d}" if base else d
                if _excluded(d, True):
                    continue
                dst = p.lstat()
                e = _entry(p, arc, dst, preserve_owner)
                if e is None:
                    continue
                add(e)
                if e.kind == "dir":
                    keep.append(d)  # symlinks to dirs are members, not walked
            dirnames[:] = keep
            for f in sorted(filenames):
                if _excluded(f, False):
                    continue
                p = Path(dirpath, f)
                e = _entry(p, f"{base}/{f}" if base else f, p.lstat(), preserve_owner)
                if e is not None:
                    add(e)

    # parent directories, so the layer never depends on the base having them
    for arc in list(found):
        parts = arc.split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            if parent not in found:
                found[parent] = Entry(parent, "dir", None, 0o755)
            elif found[parent].kind != "dir":
                raise FrankError(f"/{parent} is both a file and a directory in one layer",
                                 file=found[parent].source)
    return [found[k] for k in sorted(found)]


# A PAX record on a layer's first member naming the index key the layer was made for: a
# record of the layer index is believed only when the blob it names says it was made for
# that key. (A per-member record, not a global header: umoci refuses those.)
KEY_HEADER = "FRANK.layer.key"


def write_tar(members: list[Entry], epoch: int, out: IO[bytes], *,
              key: str | None = None) -> None:
    """Write ``members`` as a PAX tar with every varying field fixed (``key``: the layer
    index key, a PAX record of the first member)."""
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT,
                      encoding="utf-8") as tar:
        for i, e in enumerate(members):
            info = tarfile.TarInfo(e.arcname + ("/" if e.kind == "dir" else ""))
            if key and i == 0:
                info.pax_headers = {KEY_HEADER: key}
            info.mtime = epoch
            info.uid, info.gid = e.uid, e.gid
            info.uname = info.gname = ""
            info.mode = e.mode
            if e.kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif e.kind == "symlink":
                info.type = tarfile.SYMTYPE
                info.linkname = e.linkname
                tar.addfile(info)
            else:
                assert e.source is not None
                info.type = tarfile.REGTYPE
                with e.source.open("rb") as f:
                    info.size = os.fstat(f.fileno()).st_size
                    tar.addfile(info, f)


def index_key(layer: LayerInput, epoch: int) -> str:
    """The layer-index key: the lock's content key plus everything else that shapes the tar."""
    doc = {
        "format": LAYER_FORMAT,
        "record": 2,  # the blob names its key (KEY_HEADER)
        "key": layer.key,
        "epoch": epoch,
        "dests": sorted(dest for _, dest in layer.entries),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def build_layer(store: BlobStore, layer: LayerInput, epoch: int) -> tuple[LayerRecord, bool]:
    """The layer's blob record, tarring only when its key is not in the index.

    Returns (record, built) where ``built`` is False when the index already had it. The lock's
    key is trusted to cover the files' content: the files are not re-read on a hit.
    """
    key = index_key(layer, epoch)
    rec = indexed(store, key)
    if rec is not None:
        store.stats.layer_hits += 1
        return rec, False
    store.stats.layer_misses += 1
    members = collect(layer.entries)
    try:
        with store.writer() as w:
            write_tar(members, epoch, w, key=key)  # type: ignore[arg-type]
    except OSError as exc:  # a source vanished, shrank or is unreadable mid-tar
        raise FrankError(f"layer {layer.name}: cannot read its files: {exc.strerror or exc}",
                         file=exc.filename) from None
    rec = LayerRecord(digest=w.digest, diff_id=w.digest, size=w.size, media_type=LAYER_MEDIA_TYPE)
    store.put_layer(key, rec)
    return rec, True


def indexed(store: BlobStore, key: str) -> LayerRecord | None:
    """The layer index's record for ``key`` when the blob it names was made for ``key`` (its
    first header says so); a record pointing at any other blob is dropped: a miss."""
    rec = store.get_layer(key)
    if rec is None:
        return None
    try:
        with tarfile.open(store.path(rec.digest), mode="r|") as tar:
            first = tar.next()
            named = first.pax_headers.get(KEY_HEADER) if first is not None else None
    except (OSError, tarfile.TarError):
        named = None
    if named != key:
        store.drop_layer(key)
        return None
    return rec
