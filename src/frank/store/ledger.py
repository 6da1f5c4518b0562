"""The stat ledger: what frank hashed, so that a file nobody touched is not hashed again.

The threat it answers is a *local mistake* (docs/trust.md): an edit by a tool or a person, a
copy cut short, a full disk. Each entry maps a path to the stat it had when it was hashed,
``(st_dev, st_ino, size, mtime_ns, ctime_ns)``, the time it was taken, and the sha256. A file
whose stat still matches is taken as hashed; anything else is hashed again. ctime is the
key: every write, truncate, chmod or utime moves it, and no call sets it back (short of root
changing the clock), so an edit that restores mtime and size is still seen.

Git's racy-index rule: a file changed in the same clock tick as the stat that recorded it
keeps its ctime (a tick is 4 ms here), so an entry whose ctime is not older than the time it
was taken is not trusted; ``save`` waits for the tick to pass and takes the stat once more,
so that a file frank has just written is not hashed again by the next command. Files on
FUSE, NFS and other network or user-space filesystems (``statfs`` f_type) are always hashed:
their stat is whatever the server says.

The ledger lives in the store (``ledger.json``), written whole (temp + rename) under
``ledger.lock``: a writer reads what is there, adds its own entries and writes the union, so
two commands saving at once lose nothing. What it cannot see: a disk that flips bits in
place (no write, so no new ctime) and a writer who forges the ledger itself; both are the
release mode's (``FRANK_VERIFY=full`` hashes everything in every mode).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import hashlib
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from frank.store.flock import held

FORMAT = "frank-ledger-1"
_CHUNK = 1 << 20
_COARSE = getattr(time, "CLOCK_REALTIME_COARSE", 5)  # the clock file times are taken from
# statfs f_type of filesystems whose stat frank does not trust: FUSE, NFS, SMB/CIFS, 9p,
# Ceph, AFS, Coda, virtiofs is FUSE
UNTRUSTED_FS = frozenset({0x65735546, 0x6969, 0x517B, 0xFF534D42, 0xFE534D42, 0x01021997,
                          0x00C36400, 0x5346414F, 0x73757245, 0x6B414653})
KEEP = 20_000  # entries kept; past it those whose file is gone are dropped first


def coarse_ns() -> int:
    """Now, on the clock the kernel stamps file times with (coarse real time)."""
    try:
        return time.clock_gettime_ns(_COARSE)
    except OSError:
        return time.time_ns()


@dataclass(frozen=True, slots=True)
class Entry:
    """One hashed file: its stat then, when that stat was taken, and its sha256 (hex)."""

    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int
    at_ns: int
    sha256: str

    def key(self) -> tuple[int, int, int, int, int]:
        return (self.dev, self.ino, self.size, self.mtime_ns, self.ctime_ns)

    @property
    def racy(self) -> bool:
        """Changed in the tick its stat was taken: it may have changed again unseen."""
        return self.ctime_ns >= self.at_ns


def stat_key(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class _StatFs(ctypes.Structure):
    _fields_ = [("f_type", ctypes.c_long), ("rest", ctypes.c_byte * 256)]


_FS_OF_DEV: dict[int, bool] = {}


def untrusted_fs(path: Path | str, dev: int) -> bool:
    """Whether ``path`` (on device ``dev``) is on FUSE, NFS or another filesystem whose stat
    frank does not trust; asked once per device (``statfs``)."""
    if dev not in _FS_OF_DEV:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            buf = _StatFs()
            ok = libc.statfs(os.fsencode(path), ctypes.byref(buf)) == 0
            _FS_OF_DEV[dev] = (not ok) or (buf.f_type & 0xFFFFFFFF) in UNTRUSTED_FS
        except (OSError, AttributeError):
            _FS_OF_DEV[dev] = True  # cannot tell: hash
    return _FS_OF_DEV[dev]


def hash_file(path: Path | str) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class Ledger:
    """The ledger of one store (see the module docstring). ``full``: trust no entry."""

    def __init__(self, root: Path, *, full: bool = False):
        self.path = Path(root) / "ledger.json"
        self.lock = Path(root) / "ledger.lock"
        self.full = full
        self.hits = 0
        self.hashed = 0
        self._entries: dict[str, Entry] | None = None
        self._mine: dict[str, Entry | None] = {}  # what this process noted (None: forgotten)
        # name -> (stat key, st_nlink, sha256): files frank verified, noted at save
        self._carried: dict[str, tuple[tuple[int, int, int, int, int], int, str]] = {}
        atexit.register(self.save)

    # -- reading -----------------------------------------------------------------------------
    def _load(self) -> dict[str, Entry]:
        if self._entries is None:
            self._entries = _read(self.path)
        return self._entries

    def known(self, path: Path | str, st: os.stat_result | None = None) -> str | None:
        """The sha256 (hex) the ledger holds for ``path`` if it still applies, else None."""
        if self.full:
            return None
        name = os.path.abspath(path)
        try:
            st = st or os.stat(name)
        except OSError:
            return None
        entry = self._mine[name] if name in self._mine else self._load().get(name)
        if entry is None or stat_key(st) != entry.key() or untrusted_fs(name, st.st_dev):
            return None
        if entry.racy:  # taken in the tick of its last change: once that tick is over,
            at = _after(entry.ctime_ns)  # a stat still the same is the file hashed
            try:
                if stat_key(os.stat(name)) != entry.key() or at <= entry.ctime_ns:
                    return None
            except OSError:
                return None
            self._mine[name] = Entry(*entry.key(), at_ns=at, sha256=entry.sha256)
        self.hits += 1
        return entry.sha256

    def carried(self, path: Path | str) -> str | None:
        """The sha256 (hex) of a file this process verified and ``carry``-noted under another
        name, when ``path`` is that very file as it is now (same inode, size, mtime and
        ctime): a layout's blob linked in while it is built, asked about before ``save``."""
        if self.full or not self._carried:
            return None
        try:
            st = os.stat(path)
        except OSError:
            return None
        if untrusted_fs(path, st.st_dev):
            return None
        key = stat_key(st)
        for then, _, sha256 in self._carried.values():
            if then == key:
                return sha256
        return None

    def sha256(self, path: Path | str) -> str:
        """``path``'s sha256 (hex): from the ledger where its stat matches, else hashed (and
        noted, if the file held still while it was read)."""
        name = os.path.abspath(path)
        at = coarse_ns()
        st = os.stat(name)
        digest = self.known(name, st)
        if digest is not None:
            return digest
        digest = hash_file(name)
        self.hashed += 1
        with contextlib.suppress(OSError):
            if stat_key(os.stat(name)) == stat_key(st):
                self._note(name, st, at, digest)
        return digest

    # -- writing -----------------------------------------------------------------------------
    def note(self, path: Path | str, sha256: str) -> None:
        """Record that ``path`` as it is now has ``sha256`` (hex): for a file frank has just
        written from bytes it hashed, or just hashed itself."""
        name = os.path.abspath(path)
        at = coarse_ns()
        try:
            st = os.stat(name)
        except OSError:
            return
        self._note(name, st, at, sha256)

    def _note(self, name: str, st: os.stat_result, at: int, sha256: str) -> None:
        if untrusted_fs(name, st.st_dev):
            return
        self._mine[name] = Entry(*stat_key(st), at_ns=at, sha256=sha256)

    def carry(self, name: Path | str, now: Path | str, sha256: str) -> None:
        """``now`` holds ``sha256`` (frank hashed it, or wrote it from bytes it hashed) and
        will be found at ``name`` (a layout is built beside its place and renamed in): note
        ``name`` at ``save``, if it is still that inode with that size and mtime, and its
        ctime is the same or moved with its link count.

        Why not now: frank's own links and removals of the other names of a blob (a store
        blob and the layouts that link it) move its ctime, and the output they are done for
        is swapped in after the layout is written; the entry is taken once they are done.
        A link or an unlink changes the link count, an edit does not: what this cannot tell
        from frank's own is an edit that restores mtime (``cp -p`` over the file) *and* a
        link or unlink of the same file, both while the compose runs (docs/trust.md)."""
        at = coarse_ns()
        try:
            st = os.stat(now)
        except OSError:
            return
        name = os.path.abspath(name)
        self._carried[name] = (stat_key(st), st.st_nlink, sha256)
        with contextlib.suppress(OSError):  # already there (a store blob): noted as it is now
            there = os.stat(name)
            if stat_key(there) == stat_key(st):
                self._note(name, there, at, sha256)

    def forget(self, path: Path | str) -> None:
        """Drop ``path``'s entry (a file found bad, or moved aside)."""
        self._mine[os.path.abspath(path)] = None
        self._carried.pop(os.path.abspath(path), None)

    def save(self) -> None:
        """Merge this process's entries into the ledger file (under its lock, whole)."""
        if not self.path.parent.is_dir():  # the store was removed meanwhile: nothing to keep
            self._mine, self._carried = {}, {}
            return
        self._take_carried()
        if not self._mine:
            return
        self._settle()
        mine, self._mine = self._mine, {}
        try:
            with held(self.lock):
                entries = _read(self.path)
                for name, entry in mine.items():
                    if entry is None:
                        entries.pop(name, None)
                    else:
                        entries[name] = entry
                if len(entries) > KEEP:
                    entries = _pruned(entries)
                _write(self.path, entries)
                self._entries = entries
        except OSError:
            pass  # a ledger that cannot be written only costs hashing again

    def _take_carried(self) -> None:
        """Note the carried files; and every other name the ledger holds for one of their
        inodes with the same content (another output that links the same store blob: its
        ctime moved with this compose's links, not with an edit, under the same test)."""
        carried, self._carried = self._carried, {}
        if not carried:
            return
        inodes = {(key[0], key[1]): (key, nlink, sha256)
                  for key, nlink, sha256 in carried.values()}
        others = {name: inodes[(e.dev, e.ino)][2] for name, e in self._load().items()
                  if (e.dev, e.ino) in inodes and name not in carried
                  and e.sha256 == inodes[(e.dev, e.ino)][2]}
        for name, sha256 in [*((n, c[2]) for n, c in carried.items()), *others.items()]:
            at = coarse_ns()
            try:
                st = os.stat(name)
            except OSError:
                continue
            now = stat_key(st)
            key, nlink, held = inodes.get(now[:2], (None, 0, ""))
            if key is not None and held == sha256 and now[:4] == key[:4] and (
                    now[4] == key[4] or st.st_nlink != nlink):
                self._note(name, st, at, sha256)

    def _settle(self) -> None:
        """Entries taken in the tick their file last changed: once the clock has moved on,
        their stat is taken again; one unchanged is the file that was hashed (a change in
        between would have a newer ctime, see the module docstring) and is noted anew."""
        racy = {n: e for n, e in self._mine.items() if e is not None and e.racy}
        if not racy:
            return
        _after(max(e.ctime_ns for e in racy.values()))
        for name, entry in racy.items():
            at = coarse_ns()
            try:
                st = os.stat(name)
            except OSError:
                self._mine[name] = None
                continue
            if stat_key(st) == entry.key() and at > entry.ctime_ns:
                self._mine[name] = Entry(*entry.key(), at_ns=at, sha256=entry.sha256)


def _after(ns: int) -> int:
    """Wait (a clock tick at most, 4 ms here) until the file clock has passed ``ns``; now."""
    for _ in range(50):
        now = coarse_ns()
        if now > ns:
            return now
        time.sleep(0.002)
    return coarse_ns()


def _read(path: Path) -> dict[str, Entry]:
    try:
        doc = json.loads(path.read_bytes())
        if doc.get("format") != FORMAT:
            return {}
        return {str(name): _entry(row) for name, row in doc["entries"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError):
        return {}  # none yet, or unreadable: everything is hashed again


def _entry(row: list[object]) -> Entry:
    dev, ino, size, mtime, ctime, at = (int(str(x)) for x in row[:6])
    return Entry(dev, ino, size, mtime, ctime, at, str(row[6]))


def _write(path: Path, entries: dict[str, Entry]) -> None:
    rows = {name: [e.dev, e.ino, e.size, e.mtime_ns, e.ctime_ns, e.at_ns, e.sha256]
            for name, e in sorted(entries.items())}
    data = json.dumps({"format": FORMAT, "entries": rows}, separators=(",", ":")).encode()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".ledger-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _pruned(entries: dict[str, Entry]) -> dict[str, Entry]:
    """The entries whose file is still there, the newest KEEP of them."""
    alive = {n: e for n, e in entries.items() if os.path.lexists(n)}
    newest = sorted(alive.items(), key=lambda item: -item[1].at_ns)[:KEEP]
    return dict(newest)
