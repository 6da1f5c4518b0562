"""What Python distributions a pinned base image holds, read from its own layers.

An official engine image (vLLM's) is a base frank did not build: its torch, its vLLM and
their whole closure are already installed. Resolving a stack's Python closure without
knowing them gives a closure that is not the image's (another torch, no vLLM), and taking a
distribution out needs the paths its ``RECORD`` lists. So the layers are read once, merged
as a container sees them (whiteouts and opaque folders honoured), and every ``*.dist-info``
folder directly in a ``site-packages``/``dist-packages`` folder is listed with its version
and the files its ``RECORD`` names.

The base is pinned by digest, so its inventory is a function of that digest: it is kept in
the store as a blob (content-addressed, verified on every read) with a small pointer per
image digest; a pointer whose blob fails its hash, or whose inventory names another image,
is ignored and the layers are read again. Every layer blob is hashed against the manifest
while it is read.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import posixpath
import tarfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any

from frank.errors import FrankError
from frank.fsutil import write_atomic
from frank.store.blobs import BlobStore

INVENTORY_FORMAT = "frank-base-inventory-1"
SITE_DIRS = ("site-packages", "dist-packages")


@dataclass(frozen=True)
class BaseDist:
    """One distribution installed in the base: canonical name, version, its dist-info
    folder (image path, no leading slash) and the site-relative paths its RECORD lists."""

    name: str
    version: str
    info: str
    files: tuple[str, ...]

    @property
    def site(self) -> str:
        return self.info.rsplit("/", 1)[0]

    def image_paths(self) -> list[str]:
        """Every path the distribution installed (RECORD's, resolved against its site
        folder), and its dist-info folder."""
        out = {posixpath.normpath(posixpath.join(self.site, rel)) for rel in self.files}
        out.add(self.info)
        return sorted(p for p in out if not p.startswith(".."))


@dataclass(frozen=True)
class Inventory:
    """The base image's distributions, as read from its layers."""

    image: str  # the manifest digest read
    dists: tuple[BaseDist, ...]
    sha256: str  # of the canonical JSON (the lock records it)

    def site(self) -> str | None:
        """The site folder most of the base's distributions are in (where a frank layer
        installs over them); None for a base without Python distributions."""
        counts: dict[str, int] = {}
        for d in self.dists:
            counts[d.site] = counts.get(d.site, 0) + 1
        return max(sorted(counts), key=lambda s: counts[s]) if counts else None

    def versions(self) -> dict[str, str]:
        return {d.name: d.version for d in self.dists}

    def get(self, name: str) -> BaseDist | None:
        return next((d for d in self.dists if d.name == name), None)


def _canonical(name: str) -> str:
    from packaging.utils import canonicalize_name

    return str(canonicalize_name(name))


def _doc(image: str, dists: Iterable[BaseDist]) -> bytes:
    body = {"format": INVENTORY_FORMAT, "image": image,
            "dists": [{"name": d.name, "version": d.version, "info": d.info,
                       "files": list(d.files)} for d in sorted(dists, key=lambda d: d.info)]}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def _parse(raw: bytes, image: str) -> Inventory | None:
    try:
        doc = json.loads(raw)
        if doc.get("format") != INVENTORY_FORMAT or doc.get("image") != image:
            return None
        dists = tuple(BaseDist(str(d["name"]), str(d["version"]), str(d["info"]),
                               tuple(str(f) for f in d["files"])) for d in doc["dists"])
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None
    return Inventory(image=image, dists=dists, sha256=hashlib.sha256(raw).hexdigest())


def _pointer(store: BlobStore, image: str) -> Path:
    return store.root / "bases" / "inventory" / image.split(":", 1)[1]


def cached_inventory(store: BlobStore, image: str) -> Inventory | None:
    """The kept inventory of ``image``, checked by content (its blob's hash, and that it
    names this image); None when there is none or it does not hold."""
    try:
        digest = _pointer(store, image).read_text(encoding="ascii").strip()
        raw = store.read_bytes(digest)
    except (OSError, UnicodeDecodeError, FrankError):
        return None
    return _parse(raw, image)


def base_inventory(layout: Path, image: str, store: BlobStore) -> Inventory:
    """The inventory of the image ``image`` in ``layout``: kept, or read and kept."""
    kept = cached_inventory(store, image)
    if kept is not None:
        return kept
    raw = _doc(image, read_dists(layout, image))
    digest = store.put_bytes(raw)
    pointer = _pointer(store, image)
    pointer.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(pointer, digest + "\n")
    parsed = _parse(raw, image)
    assert parsed is not None
    return parsed


def inventory_for(definition: Path, store: BlobStore | None = None, *,
                  offline: bool = False) -> Inventory:
    """The inventory of the base ``images/<name>.toml`` names by digest (fetched once;
    ``offline``: a registry image not yet copied here is an error, not a download)."""
    store = store or BlobStore()
    kept = kept_inventory(definition, store)
    if kept is not None:
        return kept
    layout, image = pinned_layout(definition, store, offline=offline)
    return base_inventory(layout, image, store)


def pinned_layout(definition: Path, store: BlobStore, *,
                  offline: bool = False) -> tuple[Path, str]:
    """(layout, manifest digest) of a base named by reference in ``images/<name>.toml``:
    a local layout (``oci:DIR@sha256:...``, DIR relative to the file) or a registry image
    copied once into the cache (``offline``: only if it is there already)."""
    from frank.model.imagefile import load_image_file, parse_pinned_ref

    img = load_image_file(definition)
    if img.ref is None:
        raise FrankError("the base is not named by reference (ref = NAME@sha256:...)",
                         file=definition, field="ref")
    name, digest = parse_pinned_ref(img.ref, file=definition)
    if name.startswith("oci:"):
        layout = Path(name[4:])
        if not layout.is_absolute():
            layout = (Path(definition).parent / layout).resolve()
        return layout, digest
    from frank.image.remote import pull_pinned

    layout = pulled_layout(store, digest)
    if offline and not layout.with_name(f"{layout.name}.pinned").is_file():
        raise FrankError(f"the engine image {img.ref} is not in the cache yet, so its Python "
                         "distributions cannot be read offline (run `frank lock`, which "
                         "reads it once, or `frank image import FILE` with a saved copy)",
                         file=definition, field="ref")
    return pull_pinned(name, digest, layout)


def pulled_layout(store: BlobStore, digest: str) -> Path:
    """Where a registry image pinned by ``digest`` is kept once pulled (or imported)."""
    return store.root / "bases" / digest.split(":")[1]


def kept_inventory(definition: Path, store: BlobStore) -> Inventory | None:
    """The inventory of the registry image ``images/<name>.toml`` pins, when it was read
    before (kept by digest): no layout, no registry needed (issue 54: every command of an
    official-image stack asked the registry again)."""
    from frank.model.imagefile import load_image_file, parse_pinned_ref

    img = load_image_file(definition)
    if img.ref is None:
        return None
    name, digest = parse_pinned_ref(img.ref, file=definition)
    if name.startswith("oci:"):
        return None
    record = pulled_layout(store, digest).with_name(f"{digest.split(':')[1]}.pinned")
    try:
        words = record.read_text(encoding="ascii").split()
    except (OSError, UnicodeDecodeError):
        words = []
    target = words[1] if len(words) == 2 and words[0] == digest else digest
    return cached_inventory(store, target)


# -- reading the layers ----------------------------------------------------------------------

class _Hashing(io.RawIOBase):
    """A file read through sha256 (the layer blob checked against its digest as it passes)."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f = f
        self.h = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        data = self.f.read(len(buf))
        self.h.update(data)
        buf[:len(data)] = data
        return len(data)


def _layers(layout: Path, image: str) -> list[tuple[str, Path]]:
    from frank.image.oci import layout_blob_path, resolve_manifest

    _, _, manifest = resolve_manifest(layout, image)
    return [(str(d.get("digest", "")), layout_blob_path(layout, str(d.get("digest", ""))))
            for d in manifest.get("layers") or []]


def _members(digest: str, blob: Path) -> Iterator[tuple[tarfile.TarFile, tarfile.TarInfo]]:
    """Every member of one layer blob (any compression tarfile reads), the blob hashed."""
    try:
        with blob.open("rb") as raw:
            hashed = _Hashing(raw)
            with tarfile.open(fileobj=io.BufferedReader(hashed, 1 << 20), mode="r|*") as tar:
                for member in tar:
                    yield tar, member
            while hashed.read(1 << 20):  # the tar's padding after its end, hashed too
                pass
    except (OSError, tarfile.TarError) as exc:
        raise FrankError(f"a layer of the base is not a readable tar ({exc})",
                         file=blob) from None
    if f"sha256:{hashed.h.hexdigest()}" != digest:
        raise FrankError(f"a layer of the base does not match its digest {digest}", file=blob)


def _norm(name: str) -> str:
    return posixpath.normpath("/" + name).lstrip("/")


def _gone(path: str, cut: str) -> bool:
    return cut == "" or path == cut or path.startswith(cut + "/")


def _merged(layout: Path, image: str, wanted: Callable[[str], bool]) -> dict[str, bytes]:
    """The bytes of every regular file whose image path ``wanted`` accepts, as the merged
    image holds it: an upper layer's file wins, a whiteout or an opaque marker hides the
    layers below it (never its own layer)."""
    found: dict[str, bytes] = {}
    for digest, blob in _layers(layout, image):
        cuts: list[str] = []
        mine: dict[str, bytes] = {}
        for tar, member in _members(digest, blob):
            path = _norm(member.name)
            base = PurePosixPath(path).name
            if base == ".wh..wh..opq":
                cuts.append(posixpath.dirname(path))  # everything below it, in lower layers
            elif base.startswith(".wh."):
                cuts.append(posixpath.join(posixpath.dirname(path), base[4:]))
            elif member.isfile() and wanted(path):
                f = tar.extractfile(member)
                mine[path] = f.read() if f is not None else b""
        for cut in cuts:
            for path in [p for p in found if _gone(p, cut)]:
                del found[path]
        found.update(mine)
    return found


def read_dists(layout: Path, image: str) -> list[BaseDist]:
    """Every distribution in a site folder of the merged image (see the module docstring)."""
    records = _merged(layout, image, lambda p: p.endswith(".dist-info/RECORD"))
    out = []
    for path, text in sorted(records.items()):
        info = path[: -len("/RECORD")]
        site, _, folder = info.rpartition("/")
        if not site.endswith(SITE_DIRS):
            continue
        name, _, version = folder[: -len(".dist-info")].rpartition("-")
        files = [row[0] for row in csv.reader(io.StringIO(text.decode("utf-8", "replace")))
                 if row and row[0]]
        out.append(BaseDist(_canonical(name), version, info, tuple(sorted(set(files)))))
    return out


def read_files(layout: Path, image: str, paths: set[str]) -> dict[str, bytes]:
    """The bytes of the regular files at ``paths`` (image paths, no leading slash) in the
    merged image; a path the image does not hold is left out."""
    return _merged(layout, image, paths.__contains__)
