"""An image of an OCI layout as one tar stream that every Docker daemon loads.

Why not the layout's own tar: Docker before 25 loads only the ``docker save`` format (a
``manifest.json`` naming the config and the layer tars; an OCI archive fails with ``open
.../blobs/json: no such file or directory`` on Docker 20.10), while newer daemons, and the
containerd image store, read ``index.json``. The stream written here is both: the layout's
``oci-layout``, ``index.json`` (the one image) and blobs, plus a ``manifest.json`` whose
``Config`` and ``Layers`` point at those same blob files, as ``docker save`` has written since
Docker 25. Nothing is staged on disk: headers and blob bytes are produced as the daemon reads.

Every blob is hashed on the way out; one whose bytes no longer match its digest stops the
stream before the archive ends, so the daemon never finishes the load (``FrankError``).
"""

from __future__ import annotations

import hashlib
import tarfile
from collections.abc import Iterator
from pathlib import Path

from frank.errors import FrankError
from frank.image.oci import (
    OCI_INDEX,
    OCI_MANIFEST,
    canonical_json,
    layout_blob_path,
    resolve_manifest,
)

_CHUNK = 1 << 20
_EPOCH = 0  # the tar's own mtimes: the daemon ignores them; fixed so the stream is too


def _header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, _EPOCH, 0o644
    return info.tobuf(format=tarfile.USTAR_FORMAT)


def _padding(size: int) -> bytes:
    return b"\0" * (-size % tarfile.BLOCKSIZE)


def _member(name: str, data: bytes) -> bytes:
    return _header(name, len(data)) + data + _padding(len(data))


def _blob_name(digest: str) -> str:
    return f"blobs/sha256/{digest.split(':', 1)[1]}"


def _blob(layout: Path, digest: str, size: int, what: str) -> Iterator[bytes]:
    """A blob file as a tar member, checked against its digest and size while it is read."""
    path = layout_blob_path(layout, digest)
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        raise FrankError(f"{what} blob {digest} is missing from the layout", file=path) from None
    with handle:
        have = path.stat().st_size
        if have != size:
            raise FrankError(f"{what} blob {digest} has {have} bytes, the manifest says {size}",
                             file=path)
        yield _header(_blob_name(digest), size)
        h, n = hashlib.sha256(), 0
        while chunk := handle.read(_CHUNK):
            n += len(chunk)
            if n > size:
                break
            h.update(chunk)
            yield chunk
    if n != size or f"sha256:{h.hexdigest()}" != digest:
        raise FrankError(f"{what} blob {digest} changed while it was sent to the daemon "
                         "(its bytes no longer match the digest)", file=path)
    yield _padding(size)


def archive_size(layout: Path, digest: str | None = None) -> int:
    """Bytes of the blobs the stream carries (for progress lines)."""
    _, raw, manifest = resolve_manifest(Path(layout), digest)
    sizes = {d["digest"]: int(d["size"]) for d in [manifest["config"], *manifest["layers"]]}
    return len(raw) + sum(sizes.values())


def docker_archive(layout: Path, tag: str, digest: str | None = None) -> Iterator[bytes]:
    """The tar stream of the image ``digest`` (default: the layout's one image), tagged ``tag``.

    The manifest is read and checked first (``resolve_manifest``); config and layers are
    checked as they stream. The image's config digest is what the daemon will call the
    image's id (Docker before the containerd store) and what the caller must compare.
    """
    layout = Path(layout)
    digest, raw, manifest = resolve_manifest(layout, digest)
    config = manifest["config"]
    layers = list(manifest["layers"])
    index = canonical_json({
        "schemaVersion": 2, "mediaType": OCI_INDEX,
        "manifests": [{"mediaType": OCI_MANIFEST, "digest": digest, "size": len(raw),
                       "annotations": {"io.containerd.image.name": tag,
                                       "org.opencontainers.image.ref.name": tag}}]})
    legacy = canonical_json([{"Config": _blob_name(config["digest"]), "RepoTags": [tag],
                              "Layers": [_blob_name(d["digest"]) for d in layers]}])
    yield _member("oci-layout", canonical_json({"imageLayoutVersion": "1.0.0"}))
    yield _member("index.json", index)
    yield _member("manifest.json", legacy)
    yield _member(_blob_name(digest), raw)
    seen = {digest}
    for i, desc in enumerate([config, *layers]):
        if desc["digest"] in seen:  # a layer twice in one image: one file serves both
            continue
        seen.add(desc["digest"])
        what = "config" if i == 0 else f"layer {i - 1}"
        yield from _blob(layout, str(desc["digest"]), int(desc["size"]), what)
    yield b"\0" * (2 * tarfile.BLOCKSIZE)
