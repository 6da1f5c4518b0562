"""A content-addressed blob store plus a layer index, shared by every build on the machine.

Blobs live at ``<root>/blobs/sha256/<hex>`` (the OCI layout convention, so a blob can be
copied into a layout as is). Writes go to a temp file in the same filesystem and are renamed
into place, so a reader never sees a half-written blob. Every read verifies the blob against
its digest; a mismatch is a one-line FrankError and the bad blob is moved aside, never used.

Re-hashing multi-gigabyte layers on every no-op rebuild would dominate its time, so a full
hash is remembered in the store's stat ledger (``frank.store.ledger``: path -> stat ->
sha256, git's racy rule, FUSE and NFS always hashed): a blob whose stat still matches is the
blob that was hashed. Blobs are written read-only (0444), as Nix does: nothing writes one in
place. ``FRANK_VERIFY=full`` (or ``BlobStore(full_verify=True)``) re-hashes on every read
anyway; a disk that flips bits without a write is only seen that way (docs/trust.md).

The layer index maps a layer key to a blob. An entry names its own key, and the blob keeps
a record of each key it was made for (``layer-keys/<blob>-<key>``): an entry copied from
another key, or edited to point at another blob, is a miss (the layer is made again), not
an image with another layer's content in it.

Temp files live in ``<root>/tmp``. Every process using the store holds ``users.lock``
shared; the first one to find it free takes it exclusively and removes what killed
processes left in ``tmp/``, since nobody else can be writing there then.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from pydantic import BaseModel, ConfigDict, ValidationError

from frank.errors import FrankError
from frank.model.pins import DIGEST_RE as DIGEST_RE
from frank.store.direct import DirectFile
from frank.store.ledger import Ledger

BLOB_MODE = 0o444  # a blob is never written in place (Nix's store paths are read-only too)

_CHUNK = 1 << 20


class BlobMovedAside(FrankError):
    """A stored blob did not hash to its name and was moved aside: building again makes it
    anew (the layer index no longer finds it), so a build may retry once."""


def default_root() -> Path:
    """FRANK_CACHE if set, else ~/.cache/frank: one cache per user, shared by all stacks."""
    env = os.environ.get("FRANK_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "frank"


def check_digest(digest: str, *, file: Path | str | None = None, field: str | None = None) -> str:
    """Return ``digest`` if it is ``sha256:<64 hex>``; anything else is a FrankError."""
    if not isinstance(digest, str) or not DIGEST_RE.match(digest):
        raise FrankError(f"not a sha256 digest: {digest!r}", file=file, field=field)
    return digest


def sha256_file(path: Path) -> str:
    """The ``sha256:<hex>`` digest of a file, streamed."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    """The ``sha256:<hex>`` digest of bytes."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


class LayerRecord(BaseModel):
    """What the index remembers for a layer key: enough to reuse the blob without re-tarring."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    digest: str  # blob digest (what the manifest names)
    diff_id: str  # digest of the uncompressed tar (what the config names)
    size: int
    media_type: str


@dataclass
class StoreStats:
    """Counters so tests and the benchmark can see what a build actually did."""

    blobs_written: int = 0
    blobs_reused: int = 0  # put_* found the blob already present
    layer_hits: int = 0
    layer_misses: int = 0
    full_hashes: int = 0  # reads that re-hashed the blob
    stamp_hits: int = 0  # reads trusted via an unchanged stamp


class _HashingWriter:
    """A write-only file wrapper that hashes and counts what passes through."""

    def __init__(self, f: IO[bytes] | DirectFile):
        self._f = f
        self.hash = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        self.hash.update(data)
        self.size += len(data)
        return self._f.write(data)

    def flush(self) -> None:
        self._f.flush()


class BlobStore:
    """Content-addressed blobs under ``root``; see the module docstring for the guarantees."""

    def __init__(self, root: Path | None = None, *, full_verify: bool | None = None):
        self.root = Path(root) if root is not None else default_root()
        self.blob_dir = self.root / "blobs" / "sha256"
        self.layer_dir = self.root / "layers"
        self.tmp_dir = self.root / "tmp"
        for d in (self.blob_dir, self.layer_dir, self.tmp_dir):
            d.mkdir(parents=True, exist_ok=True)
        if full_verify is None:
            full_verify = os.environ.get("FRANK_VERIFY", "") == "full"
        self.full_verify = full_verify
        self.stats = StoreStats()
        self.ledger = _ledger_of(self.root, full=full_verify)
        self.key_dir = self.root / "layer-keys"
        self.key_dir.mkdir(exist_ok=True)
        _join_users(self.root, self.tmp_dir)

    # -- paths -------------------------------------------------------------------------------
    def path(self, digest: str) -> Path:
        """Where the blob for ``digest`` lives (it may not exist)."""
        check_digest(digest)
        return self.blob_dir / digest.split(":", 1)[1]

    def has(self, digest: str) -> bool:
        """Whether a blob file exists for ``digest`` (not verified; use ``verified_path``)."""
        return self.path(digest).is_file()

    # -- verification ------------------------------------------------------------------------
    def note(self, digest: str, path: Path | None = None) -> None:
        """Record in the ledger that ``path`` (the blob's own by default), as it is now,
        holds ``digest``: for bytes frank has just written or hashed itself."""
        self.ledger.note(path or self.path(digest), digest.split(":", 1)[1])

    def verified_path(self, digest: str) -> Path:
        """The blob's path after checking its content matches ``digest``.

        A mismatch moves the blob aside (so the next build re-creates it) and raises a
        one-line FrankError naming the blob; a missing blob raises too.
        """
        path = self.path(digest)
        hashed = self.ledger.hashed
        try:
            actual = "sha256:" + self.ledger.sha256(path)
        except FileNotFoundError:
            raise FrankError(f"blob {digest} is missing from the cache", file=path) from None
        if self.ledger.hashed == hashed:
            self.stats.stamp_hits += 1
        else:
            self.stats.full_hashes += 1
        if actual != digest:
            self._quarantine(path)
            raise BlobMovedAside(
                f"cached blob does not match its digest {digest} (content is {actual}); "
                "it was moved aside, rebuild to re-create it",
                file=path,
            )
        return path

    def _quarantine(self, path: Path) -> None:
        bad = self.root / "quarantine"
        bad.mkdir(exist_ok=True)
        with contextlib.suppress(OSError):
            os.replace(path, bad / path.name)
        self.ledger.forget(path)

    def read_bytes(self, digest: str) -> bytes:
        """A small blob's content, verified (manifests, configs)."""
        path = self.path(digest)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise FrankError(f"blob {digest} is missing from the cache", file=path) from None
        if sha256_bytes(data) != digest:
            self._quarantine(path)
            raise FrankError(f"cached blob does not match its digest {digest}", file=path)
        return data

    # -- writing -----------------------------------------------------------------------------
    def _atomic_write(self, dest: Path, data: bytes, mode: int | None = None) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.tmp_dir, prefix=".w-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            if mode is not None:
                os.chmod(tmp, mode)
            os.replace(tmp, dest)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def put_bytes(self, data: bytes) -> str:
        """Store bytes, return their digest; an existing verified blob is reused."""
        digest = sha256_bytes(data)
        path = self.path(digest)
        if path.is_file():
            try:
                self.verified_path(digest)
                self.stats.blobs_reused += 1
                return digest
            except FrankError:
                pass  # a bad copy was moved aside; write a good one
        self._atomic_write(path, data, BLOB_MODE)
        self.note(digest)
        self.stats.blobs_written += 1
        return digest

    def put_file(self, src: Path, expected: str | None = None) -> str:
        """Copy a file into the store (verifying ``expected`` if given), return its digest."""
        with self.writer() as w, src.open("rb") as f:
            while chunk := f.read(_CHUNK):
                w.write(chunk)
        if expected is not None and w.digest != expected:
            raise FrankError(f"blob does not match its digest {expected} (content is "
                             f"{w.digest})", file=src)
        return w.digest

    @contextlib.contextmanager
    def writer(self, expected: str | None = None, *,
               around_cache: bool = False) -> Iterator[BlobWriter]:
        """Stream a new blob: write to the yielded object; on exit it is hashed and renamed in.

        If the body raises, or the content is not ``expected`` (a pinned digest), the temp
        file is removed and nothing enters the store. ``around_cache``: a big blob nothing
        will read soon (a layer) is written with ``O_DIRECT`` (``frank.store.direct``).
        """
        fd, tmp = tempfile.mkstemp(dir=self.tmp_dir, prefix=".blob-")
        f: IO[bytes] | DirectFile = DirectFile(fd) if around_cache else os.fdopen(fd, "wb")
        w = BlobWriter(f)
        try:
            yield w
            f.close()
            w.digest = "sha256:" + w.hash.hexdigest()
            if expected is not None and w.digest != expected:
                raise FrankError(f"content has {w.digest}, the pin says {expected}")
            dest = self.path(w.digest)
            if self.ledger.known(dest) == w.digest.split(":", 1)[1]:
                os.unlink(tmp)
                self.stats.blobs_reused += 1
            else:
                os.chmod(tmp, BLOB_MODE)
                os.replace(tmp, dest)
                self.note(w.digest)
                self.stats.blobs_written += 1
        except BaseException:
            f.close()
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    # -- layer index -------------------------------------------------------------------------
    def _layer_path(self, key: str) -> Path:
        if not re.fullmatch(r"[0-9a-f]{64}", key):
            raise FrankError(f"layer key is not a sha256 hex string: {key!r}")
        return self.layer_dir / key

    def _key_record(self, digest: str, key: str) -> Path:
        return self.key_dir / f"{digest.split(':', 1)[1]}-{key}"

    def get_layer(self, key: str) -> LayerRecord | None:
        """The indexed layer for ``key`` if its blob is still present and was made for
        ``key``, else None (an entry that fails is dropped: it only costs a re-tar)."""
        p = self._layer_path(key)
        try:
            doc = json.loads(p.read_bytes())
            if not isinstance(doc, dict) or doc.get("key") != key:
                raise ValueError("index entry filed under another key")
            rec = LayerRecord.model_validate(doc.get("record"))
            check_digest(rec.digest)
        except FileNotFoundError:
            return None
        except (ValueError, ValidationError, OSError, FrankError):
            with contextlib.suppress(OSError):
                p.unlink()
            return None
        if not self.has(rec.digest):
            return None
        if not self._key_record(rec.digest, key).is_file():
            with contextlib.suppress(OSError):
                p.unlink()  # the blob was never made for this key
            return None
        return rec

    def drop_layer(self, key: str) -> None:
        """Forget the index entry for ``key`` (its layer is made again)."""
        with contextlib.suppress(OSError):
            self._layer_path(key).unlink()

    def put_layer(self, key: str, rec: LayerRecord) -> None:
        """Remember that layer ``key`` is blob ``rec.digest`` (on both sides)."""
        self._atomic_write(self._key_record(rec.digest, self._layer_path(key).name),
                           key.encode())
        doc = {"key": key, "record": rec.model_dump(mode="json")}
        self._atomic_write(self._layer_path(key), json.dumps(doc, sort_keys=True).encode())


# cache root -> its ledger, one per process (every BlobStore of a root shares what it noted)
_LEDGERS: dict[tuple[Path, bool], Ledger] = {}


def _ledger_of(root: Path, *, full: bool) -> Ledger:
    key = (root.resolve(), full)
    if key not in _LEDGERS:
        _LEDGERS[key] = Ledger(root, full=full)
    return _LEDGERS[key]


# cache root -> the fd holding its users.lock shared, for the life of the process
_USERS: dict[Path, int] = {}


def _join_users(root: Path, tmp_dir: Path) -> None:
    """Hold ``users.lock`` shared; first clear ``tmp_dir`` if no other process holds it."""
    from frank.store.flock import relock, try_exclusive

    key = root.resolve()
    if key in _USERS:
        return
    fd = os.open(root / "users.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    if try_exclusive(fd):
        for entry in tmp_dir.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    entry.unlink()
    relock(fd, shared=True)
    _USERS[key] = fd


def leave_users(root: Path) -> None:
    """Give up this process's shared hold on ``root``'s ``users.lock`` (taken again by its
    next use of the store), so that a gc can have the store: for a process that outlives
    many commands (the test suite between its modules)."""
    fd = _USERS.pop(root.resolve(), None)
    if fd is not None:
        os.close(fd)


class BlobWriter(_HashingWriter):
    """The object ``BlobStore.writer`` yields; ``digest`` is set once the block exits."""

    digest: str = ""
