"""The compressed form of an image for a push: same config, same diff_ids, layers compressed
by a pinned compressor, so any machine pushes the same manifest digest.

Why layers stay uncompressed on disk: a layer's digest is then its diff_id, the same on every
machine whatever compressor is installed. A registry, though, should not carry 10 GB of
plain tars, and some clients handle uncompressed layers poorly. So a push sends a second
form of the same image: each layer compressed, the manifest rewritten to name the compressed
blobs (config, annotations and layer order unchanged).

Reproducibility, per compression:

- ``zstd`` (default): the ``zstandard`` wheel carries its own libzstd (1.5.7 in 0.25.0,
  pinned in pyproject), level 3, checksum and content size in the frame, and always the
  multi-threaded compressor (``threads >= 1``): its output is the same for 1, 2 or N worker
  threads and for any read size, while libzstd's single-threaded mode (threads=0) writes
  different bytes. Read by containerd >= 1.5, Docker >= 23, podman/buildah, CRI-O; not by
  Docker 20.10 (``docker pull`` of a zstd layer fails there: use gzip).
- ``gzip``: Python's ``zlib`` at level 6, header without name or time. Its bytes depend on
  the zlib the interpreter links (Debian's 1.2.13 here; zlib-ng or another version writes
  other bytes for the same input), so the digest is reproducible only between machines
  with the same zlib. The form is recorded with the zlib version it was made with.
- ``none``: the layout's own manifest and blobs (what frank pushed before).

Compressed blobs are kept in the frank cache by (diff_id, compressor), and checked before
each reuse: the blob hashes to its name and decompresses to bytes that hash to the diff_id.

Each compressed layer's descriptor carries the uncompressed size (``UNCOMPRESSED_SIZE``), so
the uncompressed form's manifest, and its digest, can be rebuilt from the pushed manifest and
config alone (``uncompressed_form_digest``): that is how ``frank verify`` matches a pushed
compressed image with attestations signed for the layout's digest.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

from frank.errors import FrankError
from frank.image.oci import canonical_json, layout_blob_path, resolve_manifest
from frank.store.blobs import check_digest

Compression = Literal["zstd", "gzip", "none"]
COMPRESSIONS: tuple[Compression, ...] = ("zstd", "gzip", "none")
ZSTD_LEVEL = 3
GZIP_LEVEL = 6
TAR = "application/vnd.oci.image.layer.v1.tar"
MEDIA_TYPES = {"zstd": f"{TAR}+zstd", "gzip": f"{TAR}+gzip", "none": TAR}
_CHUNK = 1 << 20
UNCOMPRESSED_SIZE = "dev.frank.uncompressed-size"


def compressor_id(kind: Compression) -> str:
    """What made the bytes: the format, its level, and the library version that writes them."""
    if kind == "zstd":
        import zstandard

        return f"zstd-{ZSTD_LEVEL}/libzstd-{'.'.join(map(str, zstandard.ZSTD_VERSION))}"
    if kind == "gzip":
        return f"gzip-{GZIP_LEVEL}/zlib-{zlib.ZLIB_RUNTIME_VERSION}"
    return "none"


def threads() -> int:
    """Worker threads for zstd: the cores this process may use (never 0, see above)."""
    return max(1, len(os.sched_getaffinity(0)))


class _Sink:
    """A writable that hashes and counts what passes, and writes it on."""

    def __init__(self, out: IO[bytes] | None) -> None:
        self.out, self.sha, self.size = out, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        if self.out is not None:
            self.out.write(data)
        return len(data)

    @property
    def digest(self) -> str:
        return f"sha256:{self.sha.hexdigest()}"


def compress_stream(kind: Compression, src: IO[bytes], size: int, out: IO[bytes] | None,
                    ) -> tuple[str, int, str]:
    """Compress ``size`` bytes of ``src`` into ``out``; (compressed digest, its size, the
    digest of what was read)."""
    sink, read = _Sink(out), hashlib.sha256()
    if kind == "zstd":
        import zstandard

        params = zstandard.ZstdCompressionParameters.from_level(
            ZSTD_LEVEL, threads=threads(), write_checksum=True, write_content_size=True)
        obj = zstandard.ZstdCompressor(compression_params=params).compressobj(size=size)
        while chunk := src.read(_CHUNK):
            read.update(chunk)
            sink.write(obj.compress(chunk))
        sink.write(obj.flush())
    elif kind == "gzip":
        # wbits 31: a gzip member; zlib writes mtime 0, no name, OS 255: the same every time
        gz = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31, 9, zlib.Z_DEFAULT_STRATEGY)
        while chunk := src.read(_CHUNK):
            read.update(chunk)
            sink.write(gz.compress(chunk))
        sink.write(gz.flush())
    else:
        raise ValueError(kind)
    return sink.digest, sink.size, f"sha256:{read.hexdigest()}"


def decompressed_digest(kind: Compression, path: Path) -> str:
    """sha256 of what a compressed blob decompresses to."""
    sha = hashlib.sha256()
    with path.open("rb") as f:
        if kind == "zstd":
            import zstandard

            reader = zstandard.ZstdDecompressor().stream_reader(f)
            while chunk := reader.read(_CHUNK):
                sha.update(chunk)
        else:
            dec = zlib.decompressobj(31)
            while chunk := f.read(_CHUNK):
                sha.update(dec.decompress(chunk))
            sha.update(dec.flush())
    return f"sha256:{sha.hexdigest()}"


def _sha256_file(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            sha.update(chunk)
    return f"sha256:{sha.hexdigest()}"


@dataclass
class Form:
    """One form of an image: its manifest bytes and where each of its blobs is."""

    compression: Compression
    compressor: str
    digest: str
    manifest: bytes
    blobs: dict[str, Path] = field(default_factory=dict)  # digest -> file
    compressed_bytes: int = 0  # of the layers
    uncompressed_bytes: int = 0
    layers_compressed: int = 0  # made now (the rest were kept in the cache and checked)

    def write_view(self, folder: Path) -> Path:
        """An OCI layout listing only this form, its blobs linked (nothing copied)."""
        blobs = folder / "blobs" / "sha256"
        blobs.mkdir(parents=True)
        for digest, path in self.blobs.items():
            (blobs / digest.split(":", 1)[1]).symlink_to(path.absolute())
        (blobs / self.digest.split(":", 1)[1]).write_bytes(self.manifest)
        (folder / "oci-layout").write_bytes(canonical_json({"imageLayoutVersion": "1.0.0"}))
        doc = json.loads(self.manifest)
        (folder / "index.json").write_bytes(canonical_json({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [{"mediaType": doc.get("mediaType"), "digest": self.digest,
                           "size": len(self.manifest)}]}))
        return folder


class _Kept:
    """Compressed layers kept in the frank cache: ``<root>/<compressor>/<diff hex>`` holds
    the compressed blob's digest, ``blobs/<hex>`` its bytes."""

    def __init__(self, root: Path, kind: Compression) -> None:
        self.kind = kind
        self.index = root / compressor_id(kind).replace("/", "_")
        self.blobs = root / "blobs"

    def get(self, diff_id: str) -> tuple[str, Path] | None:
        """The kept compressed blob of ``diff_id``, checked by content; None if absent or bad."""
        record = self.index / diff_id.split(":", 1)[1]
        try:
            digest = check_digest(record.read_text().strip())
        except (OSError, FrankError):
            return None
        path = self.blobs / digest.split(":", 1)[1]
        if not path.is_file() or _sha256_file(path) != digest or \
                decompressed_digest(self.kind, path) != diff_id:
            return None
        return digest, path

    def put(self, diff_id: str, make: Callable[[IO[bytes]], tuple[str, int, str]]
            ) -> tuple[str, Path]:
        """Compress into the cache (temp + rename) and record it."""
        self.index.mkdir(parents=True, exist_ok=True)
        self.blobs.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=self.blobs)
        try:
            with os.fdopen(fd, "wb") as out:
                digest, _, read = make(out)
            if read != diff_id:
                raise FrankError(f"layer {diff_id} changed while it was compressed (read "
                                 f"{read})")
            path = self.blobs / digest.split(":", 1)[1]
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        fd, rtmp = tempfile.mkstemp(prefix=".tmp-", dir=self.index)
        with os.fdopen(fd, "w") as f:
            f.write(digest + "\n")
        os.replace(rtmp, self.index / diff_id.split(":", 1)[1])
        return digest, path


def image_form(layout: Path, kind: Compression, cache: Path, *,
               progress: Callable[[str], None] | None = None) -> Form:
    """The ``kind`` form of the layout's image (its layers must be uncompressed tars).

    The manifest keeps every field but each layer's media type, digest and size; the
    config is the layout's own, so its diff_ids (and the image id a client computes) are
    unchanged.
    """
    layout = Path(layout).absolute()
    digest, raw, manifest = resolve_manifest(layout)
    config = manifest["config"]
    blobs = {config["digest"]: layout_blob_path(layout, config["digest"])}
    if kind == "none":
        form = Form("none", "none", digest, raw, blobs)
        for d in manifest["layers"]:
            form.blobs[d["digest"]] = layout_blob_path(layout, d["digest"])
            form.compressed_bytes += int(d["size"])
            form.uncompressed_bytes += int(d["size"])
        return form
    kept = _Kept(cache, kind)
    out: dict[str, Any] = json.loads(raw)
    form = Form(kind, compressor_id(kind), "", b"", blobs)
    descs = list(manifest["layers"])
    for i, desc in enumerate(descs):
        if desc.get("mediaType") != TAR or desc.get("annotations"):
            raise FrankError(f"layer {i} is not a plain uncompressed tar descriptor: frank "
                             "compresses only the layers it keeps uncompressed", file=layout)

    def one(i: int) -> tuple[str, Path, bool]:
        diff_id, size = str(descs[i]["digest"]), int(descs[i]["size"])
        got = kept.get(diff_id)
        if got is not None:
            return (*got, False)
        if progress:
            progress(f"compressing layer {i + 1}/{len(descs)} ({size / 1e6:.0f} MB, {kind})")
        src_path = layout_blob_path(layout, diff_id)

        def make(dest: IO[bytes]) -> tuple[str, int, str]:
            with src_path.open("rb") as src:
                return compress_stream(kind, src, size, dest)

        return (*kept.put(diff_id, make), True)

    # zstd runs its own worker threads per layer; zlib has none, so gzip compresses one layer
    # per core at once (zlib lets go of the GIL while it works)
    workers = 1 if kind == "zstd" else threads()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        done = list(pool.map(one, range(len(descs))))
    layers = []
    for desc, (cdigest, cpath, made) in zip(descs, done, strict=True):
        csize = cpath.stat().st_size
        form.layers_compressed += made
        layers.append({**desc, "mediaType": MEDIA_TYPES[kind], "digest": cdigest,
                       "size": csize, "annotations": {UNCOMPRESSED_SIZE: str(desc["size"])}})
        form.blobs[cdigest] = cpath
        form.compressed_bytes += csize
        form.uncompressed_bytes += int(desc["size"])
    out["layers"] = layers
    form.manifest = canonical_json(out)
    form.digest = f"sha256:{hashlib.sha256(form.manifest).hexdigest()}"
    return form


def uncompressed_form_digest(manifest: dict[str, Any], config: dict[str, Any]) -> str | None:
    """The digest of the uncompressed form a compressed manifest (``image_form``) was made
    from: each layer back to an uncompressed tar named by its diff_id, with the size the
    layer's annotation gives. None when the manifest is not such a form."""
    diff_ids = list((config.get("rootfs") or {}).get("diff_ids") or [])
    descs = list(manifest.get("layers") or [])
    if not descs or len(diff_ids) != len(descs):
        return None
    layers = []
    for desc, diff_id in zip(descs, diff_ids, strict=True):
        notes = desc.get("annotations") or {}
        size = str(notes.get(UNCOMPRESSED_SIZE, ""))
        if desc.get("mediaType") not in (MEDIA_TYPES["zstd"], MEDIA_TYPES["gzip"]) or \
                set(notes) != {UNCOMPRESSED_SIZE} or not size.isdigit():
            return None
        plain = {k: v for k, v in desc.items() if k != "annotations"}
        layers.append({**plain, "mediaType": TAR, "digest": diff_id, "size": int(size)})
    raw = canonical_json({**manifest, "layers": layers})
    return f"sha256:{hashlib.sha256(raw).hexdigest()}"


def decompress_bytes(media_type: str, data: bytes) -> bytes:
    """A layer blob's tar bytes, whichever of frank's forms it is in."""
    if media_type == MEDIA_TYPES["zstd"]:
        import zstandard

        return zstandard.ZstdDecompressor().decompressobj().decompress(data)
    if media_type == MEDIA_TYPES["gzip"]:
        return zlib.decompress(data, 31)
    return data
