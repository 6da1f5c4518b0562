"""The audit's reading of a layer, kept by the layer's digest, so that a layer audited once is
not read again (issue 53: a one-part change of served read its 36 unchanged layers back).

What a layer holds (every entry, each file's sha256, its first bytes, the GPU code of its ELF
files) is a function of the layer's bytes and of this package's reader, so it is kept under
the blob's digest together with the reader's own hash (``layers.py``, ``cuda.py``,
``expect.py``): a new reader reads every layer again. The same holds for the files a pinned
wheel's RECORD lists (``wheel_record``), kept by the wheel's sha256. A record is a file in
the store, used only while the stat ledger vouches for it (``frank.store.ledger``: the file
frank wrote, nothing changed since), and only for a layer blob the ledger vouches holds its
digest (``vouched``: a compose's output check has just hashed it or found it unchanged); a
reading is kept only of such a blob, or of the bytes a build tapped as it wrote them. What
the audit holds the entries to is unchanged: the lock and the pinned sources.

Trust: a kept reading is as good as the ledger, which answers local mistakes (an edited or
truncated record moves its ctime and is read anew). A writer who can forge the ledger can
forge a reading; ``FRANK_VERIFY=full`` (and the release mode, docs/trust.md) reads every
layer.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from frank.audit.cuda import CudaCode
from frank.audit.layers import Entry
from frank.store.blobs import BlobStore

FORMAT = "frank-audit-kept-1"
_READER: str | None = None


def reader_key() -> str:
    """The hash of the code that reads a layer: another reader, another reading."""
    global _READER
    if _READER is None:
        here = Path(__file__).resolve().parent
        digest = hashlib.sha256(FORMAT.encode())
        for name in ("layers.py", "cuda.py", "expect.py"):
            digest.update((here / name).read_bytes())
        _READER = digest.hexdigest()
    return _READER


def _load(store: BlobStore, folder: str, name: str, key: str) -> Any:
    """The ``data`` of record ``folder/name`` if the ledger vouches for the file and it was
    made for ``key`` by this reader; else None."""
    path = store.root / folder / f"{name}.json"
    if store.full_verify or store.ledger.known(path) is None:
        return None
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("key") != key or doc.get("reader") != reader_key():
        return None
    return doc.get("data")


def _save(store: BlobStore, folder: str, name: str, key: str, data: Any) -> None:
    """Write record ``folder/name`` (temp + rename) and tell the ledger what was written."""
    path = store.root / folder / f"{name}.json"
    raw = json.dumps({"format": FORMAT, "key": key, "reader": reader_key(), "data": data},
                     separators=(",", ":")).encode()
    try:
        path.parent.mkdir(exist_ok=True)
        store._atomic_write(path, raw)
    except OSError:
        return  # a record that cannot be kept is worked out again next time
    store.ledger.note(path, hashlib.sha256(raw).hexdigest())


def kept_readings(store: BlobStore, digests: Iterable[str]) -> dict[str, list[Entry]]:
    """layer digest -> its kept entries, for those with a record the ledger vouches for."""
    out: dict[str, list[Entry]] = {}
    if not shape_known():
        return out
    for digest in digests:
        rows = _load(store, "audit-layers", digest.split(":", 1)[1], digest)
        try:
            if rows is not None:
                out[digest] = [_entry(row) for row in rows]
        except (ValueError, TypeError):
            continue
    return out


def keep_readings(store: BlobStore, readings: Mapping[str, list[Entry]]) -> None:
    """Keep each layer's reading under its digest."""
    if not shape_known():
        return
    for digest, entries in readings.items():
        _save(store, "audit-layers", digest.split(":", 1)[1], digest,
              [_row(e) for e in entries])


def wheel_record(store: BlobStore, sha256: str, wheel: Path,
                 read: Callable[[Path], dict[str, tuple[str, int | None]]]
                 ) -> dict[str, tuple[str, int | None]]:
    """``read(wheel)`` (the files a wheel's RECORD lists), kept by the wheel's pinned sha256:
    served's 197 wheels were opened and their RECORDs parsed on every audit. Only for a wheel
    the ledger vouches holds that sha256 (the store's own file)."""
    hexd = sha256.removeprefix("sha256:")
    kept = _load(store, "audit-wheels", hexd, hexd)
    if isinstance(kept, dict):
        return {str(p): (str(v[0]), None if v[1] is None else int(v[1]))
                for p, v in kept.items()}
    files = read(wheel)
    if store.ledger.known(wheel) == hexd:
        _save(store, "audit-wheels", hexd, hexd, files)
    return files


def vouched(store: BlobStore, blob: Path, digest: str) -> bool:
    """Whether the ledger vouches that ``blob`` holds ``digest``: under its own name, or as
    the very file (the same inode) the store keeps under the digest's name."""
    hexd = digest.split(":", 1)[1]
    if store.full_verify:
        return False
    if store.ledger.known(blob) == hexd:
        return True
    try:
        mine, stored = os.stat(blob), os.stat(store.path(digest))
    except (OSError, ValueError):
        return False
    return (mine.st_dev, mine.st_ino) == (stored.st_dev, stored.st_ino) and \
        store.ledger.known(store.path(digest)) == hexd


# The fields this module writes and reads back; a reader whose Entry or CudaCode has others
# keeps nothing (every layer is read) until they are added here: none is dropped silently.
ENTRY_FIELDS = ("path", "kind", "size", "offset", "mode", "link", "sha256", "head", "cuda",
                "cuda_read")
CUDA_FIELDS = ("sass", "ptx", "sizes", "hidden")


def shape_known() -> bool:
    """Whether Entry and CudaCode have exactly the fields a kept reading holds."""
    return (tuple(f.name for f in fields(Entry)) == ENTRY_FIELDS
            and tuple(f.name for f in fields(CudaCode)) == CUDA_FIELDS)


def _row(e: Entry) -> list[object]:
    cuda = None if e.cuda is None else [sorted(e.cuda.sass), sorted(e.cuda.ptx),
                                        [list(x) for x in e.cuda.sizes], e.cuda.hidden]
    return [e.path, e.kind, e.size, e.offset, e.mode, e.link, e.sha256, e.head.hex(), cuda,
            e.cuda_read]


def _entry(row: list[object]) -> Entry:
    path, kind, size, offset, mode, link, sha, head, cuda, cuda_read = row
    code = None
    if isinstance(cuda, list):
        sass, ptx, sizes, hidden = cuda
        code = CudaCode(frozenset(str(x) for x in sass), frozenset(str(x) for x in ptx),
                        tuple((str(k), str(a), int(n)) for k, a, n in sizes), int(hidden))
    return Entry(str(path), str(kind), int(str(size)), int(str(offset)), int(str(mode)),
                 str(link), str(sha), bytes.fromhex(str(head)), code, bool(cuda_read))
