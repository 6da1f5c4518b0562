"""Warm caches: an engine's compile caches as an OCI artifact, keyed by image and device.

Why: the first start of an image compiles (torch.compile/Inductor, Triton and its
autotuning, FlashInfer JIT, CUDA graphs); the second start on the same machine reads what
the first wrote. ``frank warm`` makes that folder once and keeps it as an artifact, so every
later start, here or on another machine with the same device, starts warm.

The artifact (an OCI 1.1 image manifest with its own ``artifactType``): an empty config;
one layer, a deterministic tar of the cache folder (sorted names, mtime 0, owner 0:0, modes
0644/0755, regular files, folders and links inside the folder only) compressed with zstd;
``subject`` the image's manifest (so a registry lists it among the image's referrers); and
annotations naming the image digest, the device identity (``frank.run.device``), a person's
description of the device and when it was made. In the store the blobs are ordinary blobs
and ``warm/<image hex>/<device key>`` names the manifest (written last, atomically: a killed
``frank warm`` leaves blobs nothing names, which ``frank gc`` collects, never an entry).

Use (``choose`` then ``unpack``): the manifest is read whole and hashed, must be a warm
artifact for exactly this image digest and this device, and its layer is hashed while it is
decompressed and unpacked into a fresh folder, in one read; anything else is refused in one
line and the engine starts cold. A tar member that would land outside the folder, a device
node or a hard link is refused the same way.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import stat
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any

from frank.errors import FrankError
from frank.fsutil import write_atomic
from frank.image.oci import OCI_MANIFEST, canonical_json
from frank.run.device import Device
from frank.store.blobs import DIGEST_RE, BlobStore, sha256_bytes

ARTIFACT_TYPE = "application/vnd.frank.warm-cache.v1"
LAYER_MEDIA_TYPE = "application/vnd.frank.warm-cache.v1.tar+zstd"
EMPTY_MEDIA_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY_BLOB = b"{}"
IMAGE_ANNOTATION = "dev.frank.warm.image"
DEVICE_ANNOTATION = "dev.frank.warm.device"
DEVICE_KEY_ANNOTATION = "dev.frank.warm.device-key"
MADE_ON_ANNOTATION = "dev.frank.warm.made-on"
WORKLOAD_ANNOTATION = "dev.frank.warm.workload"
CREATED_ANNOTATION = "org.opencontainers.image.created"
ZSTD_LEVEL = 3
_CHUNK = 1 << 20

# Where the folder is in the container, and every engine cache pointed into it. HOME and
# XDG_CACHE_HOME are fixed too: a cache path must not differ between machines (Inductor and
# vLLM key some entries by path), and caches a library puts under ~/.cache land here.
IN_CONTAINER = "/frank/warm"


def engine_env(root: str = IN_CONTAINER) -> dict[str, str]:
    """The environment that points every engine cache into ``root``."""
    return {
        "VLLM_CACHE_ROOT": f"{root}/vllm",
        "TRITON_CACHE_DIR": f"{root}/triton",
        "TORCHINDUCTOR_CACHE_DIR": f"{root}/inductor",
        "FLASHINFER_WORKSPACE_BASE": f"{root}/flashinfer",
        "CUDA_CACHE_PATH": f"{root}/nv",
        "TILELANG_CACHE_DIR": f"{root}/tilelang",
        "PYTHONPYCACHEPREFIX": f"{root}/pycache",
        "HOME": f"{root}/home",
        "XDG_CACHE_HOME": f"{root}/home/.cache",
    }


def prepare(folder: Path) -> Path:
    """Make the folders the fixed HOME and XDG_CACHE_HOME name (a library writing under ``~``
    must find them), in an empty warm folder; returns ``folder``."""
    (folder / "home" / ".cache").mkdir(parents=True, exist_ok=True)
    return folder


class WarmRefused(FrankError):
    """An artifact that may not be used: the reason is one line; the engine starts cold."""


@dataclass(frozen=True)
class Artifact:
    """A warm cache's manifest, read and checked against its digest."""

    digest: str
    manifest: bytes
    image: str
    device: Device
    layer: str
    layer_size: int
    made_on: str
    created: str

    @property
    def doc(self) -> dict[str, Any]:
        return dict(json.loads(self.manifest))


def index_dir(store_root: Path) -> Path:
    """``<store>/warm``: one folder per image digest, one entry per device."""
    return store_root / "warm"


def _entry(store_root: Path, image: str, key: str) -> Path:
    return index_dir(store_root) / image.split(":", 1)[1] / key


# -- making ----------------------------------------------------------------------------------

def _members(folder: Path) -> Iterator[tuple[str, Path, os.stat_result]]:
    """Every path under ``folder`` in sorted order (folders before what they hold)."""
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        base = Path(dirpath)
        for name in sorted([*dirnames, *filenames]):
            path = base / name
            yield path.relative_to(folder).as_posix(), path, path.lstat()


def write_tar(folder: Path, out: IO[bytes]) -> int:
    """The deterministic tar of ``folder`` into ``out``; returns how many entries. A link
    pointing out of the folder, a socket or a fifo is left out (nothing a cache needs)."""
    count = 0
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for rel, path, st in _members(folder):
            info = tarfile.TarInfo(rel)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            executable = bool(st.st_mode & 0o111)
            if stat.S_ISDIR(st.st_mode):
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif stat.S_ISREG(st.st_mode):
                info.size, info.mode = st.st_size, 0o755 if executable else 0o644
                with path.open("rb") as f:
                    tar.addfile(info, f)
            elif stat.S_ISLNK(st.st_mode):
                target = os.readlink(path)
                if not _inside(rel, target):
                    continue
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
                tar.addfile(info)
            else:
                continue
            count += 1
    return count


def _inside(rel: str, target: str) -> bool:
    """Whether a link at ``rel`` with text ``target`` stays inside the folder."""
    if target.startswith("/"):
        return False
    depth = 0
    for part in (PurePosixPath(rel).parent / target).parts:
        depth += -1 if part == ".." else 0 if part == "." else 1
        if depth < 0:
            return False
    return True


def pack(store: BlobStore, folder: Path) -> tuple[str, int, int]:
    """Tar ``folder`` deterministically, compress it, store the blob: (digest, size, entries).

    The compressor is libzstd through the ``zstandard`` wheel at a fixed level with one
    worker thread (its multi-threaded mode writes the same bytes for any thread count), so
    the same folder gives the same digest on every machine."""
    import zstandard

    params = zstandard.ZstdCompressionParameters.from_level(ZSTD_LEVEL, threads=1,
                                                             write_checksum=True)
    with store.writer() as w, zstandard.ZstdCompressor(compression_params=params).stream_writer(
            w, closefd=False) as z:  # type: ignore[arg-type]
        entries = write_tar(folder, z)
    return w.digest, store.path(w.digest).stat().st_size, entries


def make(store: BlobStore, folder: Path, *, subject: dict[str, Any], image: str,
         device: Device, created: float | None = None,
         workload: dict[str, Any] | None = None) -> Artifact:
    """Pack ``folder`` as the warm artifact of ``image`` on ``device`` and name it in the
    store's warm index (the entry last, atomically). ``subject``: the image's descriptor;
    ``workload``: what was sent to fill it (recorded as an annotation)."""
    layer, size, _ = pack(store, folder)
    store.put_bytes(EMPTY_BLOB)
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created or time.time()))
    manifest = canonical_json({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": ARTIFACT_TYPE,
        "config": {"mediaType": EMPTY_MEDIA_TYPE, "digest": sha256_bytes(EMPTY_BLOB),
                   "size": len(EMPTY_BLOB)},
        "layers": [{"mediaType": LAYER_MEDIA_TYPE, "digest": layer, "size": size}],
        "subject": {"mediaType": subject["mediaType"], "digest": subject["digest"],
                    "size": subject["size"]},
        "annotations": {IMAGE_ANNOTATION: image, DEVICE_ANNOTATION: device.canonical(),
                        DEVICE_KEY_ANNOTATION: device.key, MADE_ON_ANNOTATION: device.describe(),
                        CREATED_ANNOTATION: when,
                        **({WORKLOAD_ANNOTATION: json.dumps(workload, sort_keys=True,
                                                            separators=(",", ":"))}
                           if workload is not None else {})},
    })
    digest = store.put_bytes(manifest)
    artifact = parse(digest, manifest)
    record(store.root, artifact)
    return artifact


def record(store_root: Path, artifact: Artifact) -> None:
    """Name ``artifact`` in the warm index under its image and device (atomic)."""
    entry = _entry(store_root, artifact.image, artifact.device.key)
    entry.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(entry, (artifact.digest + "\n").encode())


# -- reading ---------------------------------------------------------------------------------

def parse(digest: str, manifest: bytes) -> Artifact:
    """A warm artifact from its manifest bytes, checked against ``digest``; WarmRefused."""
    if sha256_bytes(manifest) != digest:
        raise WarmRefused(f"warm cache {digest}: its manifest does not match its digest")
    try:
        doc = json.loads(manifest)
        ann = doc["annotations"]
        layers = doc["layers"]
        if doc.get("artifactType") != ARTIFACT_TYPE or len(layers) != 1 or \
                layers[0]["mediaType"] != LAYER_MEDIA_TYPE:
            raise ValueError("not a warm cache")
        layer, size = str(layers[0]["digest"]), int(layers[0]["size"])
        if not DIGEST_RE.match(layer) or not DIGEST_RE.match(str(ann[IMAGE_ANNOTATION])):
            raise ValueError("a digest is malformed")
        device = Device.from_json(json.loads(ann[DEVICE_ANNOTATION]))
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise WarmRefused(f"warm cache {digest}: not a warm cache manifest ({exc})") from None
    return Artifact(digest, manifest, str(ann[IMAGE_ANNOTATION]), device, layer, size,
                    str(ann.get(MADE_ON_ANNOTATION) or device.describe()),
                    str(ann.get(CREATED_ANNOTATION) or ""))


def listed(store_root: Path, image: str) -> dict[str, str]:
    """device key -> manifest digest, for every warm artifact of ``image`` in the index."""
    folder = index_dir(store_root) / image.split(":", 1)[1]
    out = {}
    for entry in sorted(folder.iterdir()) if folder.is_dir() else []:
        with contextlib.suppress(OSError, UnicodeDecodeError):
            text = entry.read_text().strip()
            if DIGEST_RE.match(text) and not entry.name.startswith("."):
                out[entry.name] = text
    return out


def read(store: BlobStore, digest: str) -> Artifact:
    """The artifact ``digest`` of the store, its manifest hashed; WarmRefused."""
    try:
        manifest = store.path(digest).read_bytes()
    except OSError:
        raise WarmRefused(f"warm cache {digest}: its manifest is not in the store") from None
    return parse(digest, manifest)


def choose(store: BlobStore, image: str, device: Device) -> Artifact:
    """The warm artifact of ``image`` for ``device``; WarmRefused says why there is none
    (none made, only for other devices, or this one fails its check)."""
    found = listed(store.root, image)
    if not found:
        raise WarmRefused("none found for this image (make one with `frank warm`)")
    digest = found.get(device.key)
    if digest is None:
        others = []
        for other in found.values():
            with contextlib.suppress(FrankError):
                others.append(read(store, other).made_on)
        return _refuse_other(others, device)
    artifact = read(store, digest)
    check(artifact, image, device)
    return artifact


def _refuse_other(others: list[str], device: Device) -> Artifact:
    where = "; ".join(sorted(set(others))) or "other devices"
    raise WarmRefused(f"only for another device ({where}), this is {device.describe()}")


def check(artifact: Artifact, image: str, device: Device) -> None:
    """The artifact is for exactly ``image`` and ``device``; WarmRefused otherwise."""
    if artifact.image != image:
        raise WarmRefused(f"warm cache {artifact.digest} is for image {artifact.image}, "
                          f"not {image}")
    if artifact.device != device:
        raise WarmRefused(f"warm cache {artifact.digest} was made on another device "
                          f"({artifact.made_on}; its identity {artifact.device.canonical()}), "
                          f"this is {device.canonical()}")


class _HashingReader(io.RawIOBase):
    """Reads a file and hashes every byte read."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f = f
        self.hash = hashlib.sha256()
        self.size = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        data = self.f.read(len(b))
        n = len(data)
        b[:n] = data
        self.hash.update(data)
        self.size += n
        return n


def unpack(store: BlobStore, artifact: Artifact, dest: Path) -> int:
    """Unpack the artifact's layer into ``dest`` (made; must not exist), hashing the blob in
    the same read; returns the bytes unpacked. Any failure removes ``dest`` and is one line."""
    import zstandard

    what = f"warm cache {artifact.digest}"
    path = store.path(artifact.layer)
    dest.mkdir(parents=True)
    total = 0
    try:
        with path.open("rb") as raw:
            reader = _HashingReader(raw)
            stream = zstandard.ZstdDecompressor().stream_reader(reader, read_size=_CHUNK)  # type: ignore[arg-type]
            with tarfile.open(fileobj=stream, mode="r|") as tar:
                for m in tar:
                    total += _extract(tar, m, dest, what)
            while reader.readinto(bytearray(_CHUNK)):  # the rest of the blob is hashed too
                pass
        actual = "sha256:" + reader.hash.hexdigest()
        if actual != artifact.layer or reader.size != artifact.layer_size:
            raise WarmRefused(f"{what}: its layer does not match its digest {artifact.layer} "
                              f"(read {reader.size} bytes hashing to {actual})")
    except FileNotFoundError:
        shutil.rmtree(dest, ignore_errors=True)
        raise WarmRefused(f"{what}: its layer {artifact.layer} is not in the store") from None
    except (tarfile.TarError, zstandard.ZstdError, OSError, EOFError) as exc:
        shutil.rmtree(dest, ignore_errors=True)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise WarmRefused(f"{what}: its layer is corrupt or cut short ({first})") from None
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    return total


def _extract(tar: tarfile.TarFile, m: tarfile.TarInfo, dest: Path, what: str) -> int:
    rel = PurePosixPath(m.name)
    if rel.is_absolute() or ".." in rel.parts or not m.name:
        raise WarmRefused(f"{what}: member {m.name!r} would land outside the folder")
    target = dest / rel
    if m.isdir():
        target.mkdir(parents=True, exist_ok=True)
        return 0
    if m.issym():
        if not _inside(m.name, m.linkname):
            raise WarmRefused(f"{what}: link {m.name!r} points out of the folder")
        target.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(m.linkname, target)
        return 0
    if not m.isreg():
        raise WarmRefused(f"{what}: member {m.name!r} is neither a file, a folder nor a link")
    target.parent.mkdir(parents=True, exist_ok=True)
    src = tar.extractfile(m)
    assert src is not None
    with target.open("xb") as out:
        shutil.copyfileobj(src, out, _CHUNK)
    os.chmod(target, 0o755 if m.mode & 0o111 else 0o644)
    return m.size


def for_gc(store_root: Path, kept: set[str]) -> tuple[set[str], list[Path]]:
    """For ``frank gc`` (which opens no BlobStore): the manifest blob hexes of the warm
    artifacts of images whose manifest hex is in ``kept`` (gc follows them to their layers),
    and the index folders of the images not kept (their artifacts go with them)."""
    keep: set[str] = set()
    drop: list[Path] = []
    root = index_dir(store_root)
    for folder in sorted(root.iterdir()) if root.is_dir() else []:
        if folder.name not in kept:
            drop.append(folder)
            continue
        keep.update(d.split(":", 1)[1] for d in listed(store_root, "sha256:" + folder.name)
                    .values())
    return keep, drop
