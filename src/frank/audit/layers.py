"""An image's layers merged as a container sees them, read in one sequential pass per layer.

Why our own tar reader: ``tarfile`` costs about 100 µs a member in Python and reads each
member's data with a second seek; served's 77,000 members and 9.7 GB must be hashed in
seconds. Each layer blob is read once, front to back, in large chunks: the headers are
parsed as they pass (ustar, GNU long names, PAX ``path``/``linkpath``/``size``) and every
regular file's bytes go to its own sha256 (``hashlib`` lets go of the GIL, so two layers
hash on two cores at once). The first 64 bytes of each file are kept: they say whether it is
an ELF file worth opening again (``frank.audit.cuda`` reads its section headers by offset).

The merge follows the OCI layer rules, top layer first: a path present in an upper layer
hides the same path below; ``.wh.NAME`` hides NAME (and everything under it) in the layers
below; ``.wh..wh..opq`` hides everything below in lower layers of its folder; a non-folder
in an upper layer hides whatever lower layers have under that path. A whiteout applies to
lower layers only, never to its own layer.
"""

from __future__ import annotations

import bisect
import hashlib
import os
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from frank.audit.cuda import CudaCode, Read, is_elf, read_cuda
from frank.errors import FrankError

CHUNK = 4 << 20
# ELF files up to this size are kept in memory while they pass, and their GPU code read
# from there; a bigger one (libtorch_cuda.so) is read again by offset, a few small reads
KEEP_ELF = 32 << 20
BLOCK = 512
_ZERO = bytes(BLOCK)
_KIND = {b"0": "file", b"\0": "file", b"7": "file", b"5": "dir", b"2": "symlink",
         b"1": "hardlink", b"3": "device", b"4": "device", b"6": "fifo"}
_META = (b"x", b"g", b"L", b"K")
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


@dataclass(slots=True)
class Entry:
    """One tar member: image path (no leading slash), what it is, where its bytes are."""

    path: str
    kind: str  # file dir symlink hardlink whiteout opaque device fifo other
    size: int
    offset: int  # where its data starts in the layer blob
    mode: int
    link: str = ""
    sha256: str = ""  # hex, regular files only
    head: bytes = b""  # first 64 bytes, regular files only
    cuda: CudaCode | None = None  # GPU code found in it (ELF files)
    cuda_read: bool = False  # whether ``cuda`` was read yet


@dataclass
class LayerRead:
    """What one layer blob holds, in tar order."""

    index: int
    blob: Path
    entries: list[Entry]


@dataclass
class MergedView:
    """path -> (layer index, entry) of everything a container sees; the layers as read."""

    layers: list[LayerRead]
    visible: dict[str, tuple[int, Entry]] = field(default_factory=dict)
    _order: list[str] = field(default_factory=list, repr=False)  # visible's keys, sorted

    def get(self, path: str) -> Entry | None:
        """The visible entry at ``path`` (``/usr/x`` or ``usr/x``), hardlinks resolved."""
        hit = self.visible.get(path.lstrip("/"))
        if hit is None:
            return None
        index, entry = hit
        if entry.kind == "hardlink":
            return self._link_target(index, entry)
        return entry

    def layer_of(self, path: str) -> int | None:
        hit = self.visible.get(path.lstrip("/"))
        return hit[0] if hit else None

    def read(self, index: int, entry: Entry) -> bytes:
        """The bytes of a (small) regular file of layer ``index``."""
        with self.layers[index].blob.open("rb") as f:
            f.seek(entry.offset)
            return f.read(entry.size)

    def _link_target(self, index: int, entry: Entry) -> Entry | None:
        target = _norm(entry.link)
        for e in self.layers[index].entries:  # a hardlink names an earlier member of its layer
            if e.path == target and e.kind == "file":
                return Entry(entry.path, "file", e.size, e.offset, entry.mode, "", e.sha256,
                             e.head)
        hit = self.visible.get(target)
        return hit[1] if hit and hit[1].kind == "file" else None

    def under(self, folder: str) -> Iterator[tuple[str, Entry]]:
        """Visible entries strictly under ``folder``, in path order: a binary search in the
        sorted paths (a scan of all 70,000 for each of served's 196 distributions was a
        third of its audit)."""
        if len(self._order) != len(self.visible):
            self._order = sorted(self.visible)
        prefix = folder.strip("/") + "/"
        for at in range(bisect.bisect_left(self._order, prefix), len(self._order)):
            path = self._order[at]
            if not path.startswith(prefix):
                break
            yield path, self.visible[path][1]


def _num(field: bytes) -> int:
    if field and field[0] & 0x80:  # GNU base-256 for sizes of 8 GiB and more
        return int.from_bytes(field[1:], "big")
    text = field.split(b"\0", 1)[0].strip()
    return int(text, 8) if text else 0


def _pax(data: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.index(b" ", pos)
        length = int(data[pos:space])
        key, _, value = data[space + 1:pos + length - 1].partition(b"=")
        out[key.decode()] = value.decode("utf-8", "surrogateescape")
        pos += length
    return out


def _norm(name: str) -> str:
    while name.startswith("./"):
        name = name[2:]
    name = name.strip("/")
    return "" if name == "." else name


def read_layer(index: int, blob: Path) -> LayerRead:
    """Parse and hash one uncompressed layer blob in a single sequential read."""
    try:
        return LayerRead(index, blob, _read(blob))
    except (OSError, ValueError) as exc:
        raise FrankError(f"layer {index} is not a readable tar ({exc})", file=blob) from None


def _read(blob: Path) -> list[Entry]:
    reader = TarReader()
    with blob.open("rb", buffering=0) as f:
        while chunk := f.read(CHUNK):
            reader.feed(chunk)
    return reader.close()


class TarReader:
    """The layer parser fed the tar's bytes in pieces of any size, as they pass.

    ``read_layer`` feeds it a blob read back from disk; a build can feed it the bytes it is
    writing into a blob (the same bytes its digest is made of), so that the audit of a layer
    just made need not read 9.7 GB back (``frank.assemble.layerpool``'s tap). ``close`` gives
    the entries, offsets counted from the first byte fed, and raises ``ValueError`` on a tar
    cut short.
    """

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self._carry = b""
        self._state = "header"
        self._remaining = self._pad = 0
        self._cur: Entry | None = None
        self._hasher: Any = None
        self._kept: bytearray | None = None  # the bytes of a small ELF file passing by
        self._meta: bytearray | None = None
        self._meta_kind = b""
        self._pax: dict[str, str] = {}
        self._long_name: str | None = None
        self._long_link: str | None = None
        self._pos = 0

    def close(self) -> list[Entry]:
        if self._state != "header" or self._carry:
            raise ValueError("the tar ends in the middle of a member")
        return self.entries

    def feed(self, chunk: bytes | bytearray | memoryview) -> None:
        entries = self.entries
        carry, state = self._carry, self._state
        remaining, pad = self._remaining, self._pad
        cur, hasher, kept, meta = self._cur, self._hasher, self._kept, self._meta
        meta_kind, pax = self._meta_kind, self._pax
        long_name, long_link = self._long_name, self._long_link
        pos = self._pos
        view = memoryview(chunk)
        i, n = 0, len(view)
        while i < n:
            if state == "data":
                take = min(remaining, n - i)
                piece = view[i:i + take]
                if hasher is not None:
                    hasher.update(piece)
                    if cur is not None and len(cur.head) < 64:
                        if not cur.head and cur.size <= KEEP_ELF and (
                                len(piece) < 4 or is_elf(bytes(piece[:4]))):
                            kept = bytearray()
                        cur.head += bytes(piece[:64 - len(cur.head)])
                    if kept is not None:
                        kept += piece
                elif meta is not None:
                    meta += piece
                i += take
                remaining -= take
                if remaining:
                    continue
                if hasher is not None and cur is not None:
                    cur.sha256 = hasher.hexdigest()
                    if kept is not None and is_elf(cur.head):
                        cur.cuda = _cuda_of(bytes(kept))
                        cur.cuda_read = True
                    kept = None
                elif meta is not None and meta_kind in _META:
                    if meta_kind == b"x":
                        pax = _pax(bytes(meta))
                    elif meta_kind == b"L":
                        long_name = bytes(meta).split(b"\0", 1)[0].decode(
                            "utf-8", "surrogateescape")
                    elif meta_kind == b"K":
                        long_link = bytes(meta).split(b"\0", 1)[0].decode(
                            "utf-8", "surrogateescape")
                hasher, meta = None, None
                state = "pad" if pad else "header"
                continue
            if state == "pad":
                take = min(pad, n - i)
                i += take
                pad -= take
                if not pad:
                    state = "header"
                continue
            need = BLOCK - len(carry)
            if n - i < need:
                carry += bytes(view[i:n])
                i = n
                continue
            header = carry + bytes(view[i:i + need])
            carry = b""
            i += need
            if header == _ZERO:
                continue
            typeflag = header[156:157]
            size = _num(header[124:136])
            if typeflag in _META:
                meta, meta_kind, hasher, cur = bytearray(), typeflag, None, None
                remaining, pad = size, (-size) % BLOCK
                state = "data" if size else ("pad" if pad else "header")
                continue
            name = header[0:100].split(b"\0", 1)[0]
            if header[257:263] == b"ustar\0":
                prefix = header[345:500].split(b"\0", 1)[0]
                if prefix:
                    name = prefix + b"/" + name
            path = long_name or pax.get("path") or name.decode("utf-8", "surrogateescape")
            link = long_link or pax.get("linkpath") or header[157:257].split(
                b"\0", 1)[0].decode("utf-8", "surrogateescape")
            if "size" in pax:
                size = int(pax["size"])
            pax, long_name, long_link = {}, None, None
            path = _norm(path)
            kind = _KIND.get(typeflag, "other")
            base = path.rsplit("/", 1)[-1]
            if base.startswith(".wh."):
                kind = "opaque" if base == ".wh..wh..opq" else "whiteout"
            entry = Entry(path, kind, size if kind == "file" else 0, pos + i,
                          _num(header[100:108]), link if kind in ("symlink", "hardlink")
                          else "")
            entries.append(entry)
            remaining, pad = size, (-size) % BLOCK
            if kind == "file":
                cur, hasher, meta = entry, hashlib.sha256(), None
                if not size:
                    entry.sha256 = EMPTY_SHA256
            else:
                cur, hasher, meta = None, None, None  # data of other members is skipped
            state = "data" if size else ("pad" if pad else "header")
        self._carry, self._state = carry, state
        self._remaining, self._pad = remaining, pad
        self._cur, self._hasher, self._kept, self._meta = cur, hasher, kept, meta
        self._meta_kind, self._pax = meta_kind, pax
        self._long_name, self._long_link = long_name, long_link
        self._pos = pos + n


def _cuda_of(data: bytes) -> CudaCode | None:
    return read_cuda(lambda o, k: data[o:o + k], len(data))


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0] if "/" in path else ""


def merge(layers: list[LayerRead]) -> MergedView:
    """The merged view, top layer first (see the module docstring for the rules)."""
    view = MergedView(layers)
    decided: set[str] = set()  # paths an upper layer has (or whited out)
    cut: set[str] = set()  # paths below which lower layers are hidden
    for layer in reversed(layers):
        mine: dict[str, Entry] = {}
        whiteouts: list[str] = []
        opaque: list[str] = []
        hidden: dict[str, bool] = {}  # folder -> whether ``cut`` hides what is in it
        for entry in layer.entries:
            if entry.kind == "whiteout":
                parent = _parent(entry.path)
                name = entry.path.rsplit("/", 1)[-1][4:]
                whiteouts.append(f"{parent}/{name}" if parent else name)
                continue
            if entry.kind == "opaque":
                opaque.append(_parent(entry.path))
                continue
            if entry.path in decided:
                continue
            folder = _parent(entry.path)
            under = hidden.get(folder)
            if under is None:  # ``cut`` changes only between layers
                under = hidden[folder] = _hidden(entry.path, cut)
            if under:
                continue
            mine[entry.path] = entry  # a later member of the same path wins, as in tar
        for path, entry in mine.items():
            view.visible[path] = (layer.index, entry)
            decided.add(path)
            if entry.kind != "dir":
                cut.add(path)
        decided.update(whiteouts)
        cut.update(whiteouts)
        cut.update(opaque)
    return view


def _hidden(path: str, cut: set[str]) -> bool:
    if "" in cut:  # an opaque marker at the root hides every lower layer
        return True
    while "/" in path:
        path = path.rsplit("/", 1)[0]
        if path in cut:
            return True
    return False


def read_image(blobs: list[Path], workers: int | None = None,
               known: Mapping[int, list[Entry]] | None = None) -> MergedView:
    """Read every layer (biggest first, on all cores) and merge them. ``known``: layers
    whose entries the build read as it wrote them (by index), not read again."""
    known = known or {}
    order = sorted((i for i in range(len(blobs)) if i not in known),
                   key=lambda i: -blobs[i].stat().st_size)
    with ThreadPoolExecutor(workers or os.cpu_count() or 1) as pool:
        done = dict(zip(order, pool.map(lambda i: read_layer(i, blobs[i]), order),
                        strict=True))
    done.update((i, LayerRead(i, blobs[i], entries)) for i, entries in known.items())
    return merge([done[i] for i in range(len(blobs))])


def _pread(fd: int, base: int) -> Read:
    return lambda offset, size: os.pread(fd, size, base + offset)


def read_large_cuda(view: MergedView) -> None:
    """Read the GPU code of the visible ELF files too big to have been kept in passing."""

    fds: dict[int, int] = {}
    try:
        for _, (index, entry) in view.visible.items():
            if entry.kind != "file" or entry.cuda_read or not is_elf(entry.head):
                continue
            if index not in fds:
                fds[index] = os.open(view.layers[index].blob, os.O_RDONLY)
            entry.cuda = read_cuda(_pread(fds[index], entry.offset), entry.size)
            entry.cuda_read = True
    finally:
        for fd in fds.values():
            os.close(fd)
