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
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

from frank.audit.cuda import CudaCode
from frank.audit.layers import Entry
from frank.store.blobs import BlobStore

FORMAT = "frank-audit-kept-2"
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


# the code that makes a [debs] base's layer and documents from its .debs (``audit.base``)
_BASE_CODE = ("frank/assemble/debs/rootfs.py", "frank/assemble/debs/build.py",
              "frank/assemble/baselayout.py", "frank/image/layer.py", "frank/image/oci.py",
              "frank/audit/base.py", "frank/audit/layers.py")


def base_key(debs_lock_sha256: str) -> str:
    """What a derived [debs] base is a function of: its .debs lock (every package's sha256,
    the recipe) and the code that makes it."""
    src = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256(f"{FORMAT}-base\0{debs_lock_sha256}".encode())
    for name in _BASE_CODE:
        digest.update((src / name).read_bytes())
    return digest.hexdigest()


def kept_base(store: BlobStore, key: str) -> dict[str, Any] | None:
    """A base derived earlier from the same .debs lock by the same code (``audit.base``):
    its manifest digest, layer digests and config; None unless the ledger vouches for the
    record (and never under FRANK_VERIFY=full: release mode derives it again)."""
    data = _load(store, "audit-bases", key, key)
    if not isinstance(data, dict) or not isinstance(data.get("config"), dict) or \
            not isinstance(data.get("layers"), list) or not isinstance(data.get("digest"), str):
        return None
    return data


def keep_base(store: BlobStore, key: str, data: dict[str, Any]) -> None:
    """Keep a base just derived from its pinned .debs."""
    _save(store, "audit-bases", key, key, data)


_PATCH_CODE = ("frank/assemble/patching.py", "frank/model/diffs.py", "frank/audit/expect.py")


def patch_key(step: dict[str, Any], text: str) -> str:
    """What a patch applied to a pinned engine wheel makes is a function of: the step (its
    wheel's sha256, destinations), the patch's text, the code that applies it and the
    ``patch`` program it runs (``patching.patch_program``)."""
    from frank.assemble.patching import patch_program

    src = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256(f"{FORMAT}-patch\0{patch_program()}\0".encode())
    digest.update(json.dumps(step, sort_keys=True).encode() + b"\0" + text.encode())
    for name in _PATCH_CODE:
        digest.update((src / name).read_bytes())
    return digest.hexdigest()


def kept_patch(store: BlobStore, key: str) -> dict[str, Any] | None:
    """The files a patch changed, placed and deleted (with their sha256), when the same
    patch was applied to the same wheel before (``audit.expect``); vouched by the ledger."""
    data = _load(store, "audit-patches", key, key)
    try:
        return {"changed": [(str(r), str(h)) for r, h in data["changed"]],
                "placed": [(str(p), str(h)) for p, h in data["placed"]],
                "deleted": [str(r) for r in data["deleted"]]}
    except (TypeError, KeyError, ValueError):
        return None


def keep_patch(store: BlobStore, key: str, data: dict[str, Any]) -> None:
    _save(store, "audit-patches", key, key, data)


_VERDICT_CODE: str | None = None


def verdict_key(facts: Any) -> str:
    """What an audit's verdict on the files is a function of: ``facts`` (the layer digests,
    the derived base, the expectations, the plan's facts the checks read) and the code of
    every check (this whole package and the plan it reads): other code, another verdict."""
    global _VERDICT_CODE
    if _VERDICT_CODE is None:
        here = Path(__file__).resolve().parent
        digest = hashlib.sha256(f"{FORMAT}-verdict".encode())
        for path in [*sorted(here.glob("*.py")), here.parent / "assemble" / "plan.py"]:
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
        _VERDICT_CODE = digest.hexdigest()
    raw = json.dumps(facts, sort_keys=True, separators=(",", ":"), default=_plain)
    return hashlib.sha256(_VERDICT_CODE.encode() + b"\0" + raw.encode()).hexdigest()


def _plain(obj: Any) -> Any:
    """JSON for what ``verdict_key``'s facts hold besides JSON's own types."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: getattr(obj, f.name) for f in fields(obj)}
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"no JSON for {type(obj).__name__}")


def kept_verdict(store: BlobStore, key: str) -> dict[str, Any] | None:
    """The verdict on the files of an image with the same layers, held to the same
    expectations by the same code (an env part changed only the config), vouched by the
    ledger; never under FRANK_VERIFY=full (release mode)."""
    data = _load(store, "audit-verdicts", key, key)
    return data if isinstance(data, dict) else None


def keep_verdict(store: BlobStore, key: str, data: dict[str, Any]) -> None:
    _save(store, "audit-verdicts", key, key, data)


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
        columns = _load(store, "audit-layers", digest.split(":", 1)[1], digest)
        try:
            if columns is not None:
                out[digest] = _entries(columns)
        except (ValueError, TypeError, AttributeError):
            continue
    return out


def keep_readings(store: BlobStore, readings: Mapping[str, list[Entry]]) -> None:
    """Keep each layer's reading under its digest."""
    if not shape_known():
        return
    for digest, entries in readings.items():
        _save(store, "audit-layers", digest.split(":", 1)[1], digest, _columns(entries))


def wheel_record(store: BlobStore, sha256: str, wheel: Path,
                 read: Callable[[Path], dict[str, tuple[str, int | None]]]
                 ) -> dict[str, tuple[str, int | None]]:
    """``read(wheel)`` (the files a wheel's RECORD lists), kept by the wheel's pinned sha256:
    served's 197 wheels were opened and their RECORDs parsed on every audit. Only for a wheel
    the ledger vouches holds that sha256 (the store's own file)."""
    hexd = sha256.removeprefix("sha256:")
    kept = _load(store, "audit-wheels", hexd, hexd)
    if isinstance(kept, dict) and (files := _files(kept)) is not None:
        return files
    files = read(wheel)
    if store.ledger.known(wheel) == hexd:
        _save(store, "audit-wheels", hexd, hexd, files)
    return files


def image_record(store: BlobStore, sha256: str, read: Callable[[], bytes],
                 parse: Callable[[str], dict[str, tuple[str, int | None]]]
                 ) -> dict[str, tuple[str, int | None]]:
    """``parse`` of a ``RECORD`` file in an image whose bytes hash to ``sha256`` (its entry's
    reading), kept by that hash: served's 196 RECORDs were read from the blobs and parsed
    on every audit. A record is kept only of bytes that hash to ``sha256``."""
    kept = _load(store, "audit-records", sha256, sha256)
    if isinstance(kept, dict) and (files := _files(kept)) is not None:
        return files
    raw = read()
    files = parse(raw.decode("utf-8", "replace"))
    if hashlib.sha256(raw).hexdigest() == sha256:
        _save(store, "audit-records", sha256, sha256, files)
    return files


def _files(kept: dict[str, Any]) -> dict[str, tuple[str, int | None]] | None:
    """A kept RECORD parse (path -> [sha256, size or null]) back, or None if it is not one."""
    try:
        files = {p: (v[0], v[1]) for p, v in kept.items()}
    except (TypeError, KeyError, IndexError):
        return None
    if any(type(h) is not str or (n is not None and type(n) is not int)
           for h, n in files.values()):
        return None
    return files


def vouched(store: BlobStore, blob: Path, digest: str) -> bool:
    """Whether the ledger vouches that ``blob`` holds ``digest``: under its own name, as
    the very file (the same inode) the store keeps under the digest's name, or as a file
    this process verified and carries into the ledger (an output's blob linked into the
    stage of the next one)."""
    hexd = digest.split(":", 1)[1]
    if store.full_verify:
        return False
    if store.ledger.known(blob) == hexd or store.ledger.carried(blob) == hexd:
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


def _columns(entries: list[Entry]) -> list[list[object]]:
    """A layer's entries as one list per field (``ENTRY_FIELDS``): read back field by field,
    not row by row (served's 64,000 entries were a third of a one-part change's audit)."""
    return [[e.path for e in entries], [e.kind for e in entries],
            [e.size for e in entries], [e.offset for e in entries],
            [e.mode for e in entries], [e.link for e in entries],
            [e.sha256 for e in entries], [e.head.hex() for e in entries],
            [None if e.cuda is None else [sorted(e.cuda.sass), sorted(e.cuda.ptx),
                                          [list(x) for x in e.cuda.sizes], e.cuda.hidden]
             for e in entries],
            [e.cuda_read for e in entries]]


def _entries(columns: Any) -> list[Entry]:
    """The entries back from ``_columns``; ValueError if any field is of another type."""
    paths, kinds, sizes, offsets, modes, links, shas, heads, cudas, reads = columns
    n = len(paths)
    for col, kind in ((paths, str), (kinds, str), (sizes, int), (offsets, int), (modes, int),
                      (links, str), (shas, str), (heads, str), (reads, bool)):
        if not isinstance(col, list) or len(col) != n or (n and set(map(type, col)) != {kind}):
            raise ValueError("a kept reading of another shape")
    if not isinstance(cudas, list) or len(cudas) != n:
        raise ValueError("a kept reading of another shape")
    code = [None if c is None else _cuda(c) for c in cudas]
    return list(map(Entry, paths, kinds, sizes, offsets, modes, links, shas,
                    map(bytes.fromhex, heads), code, reads))


def _cuda(cuda: list[Any]) -> CudaCode:
    sass, ptx, sizes, hidden = cuda
    return CudaCode(frozenset(str(x) for x in sass), frozenset(str(x) for x in ptx),
                    tuple((str(k), str(a), int(n)) for k, a, n in sizes), int(hidden))
