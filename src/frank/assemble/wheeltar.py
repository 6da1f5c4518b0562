"""Wheels streamed straight into a layer tar: each byte inflated, hashed and written once.

The staging route (``install_wheels`` writes a tree, ``layer.collect`` walks it,
``layer.write_tar`` reads it back) writes every installed byte twice, and creates and then
deletes every file on the host: in a cold build of served that was 80,000 files and most of
the time (bench/results/profile-build-2026-12-02.md). Here ``installer`` itself still decides
every path, script launcher, shebang and RECORD line (through a destination that plans
instead of writing), and the tar is written from the wheel members directly, in the order
``collect`` sorts, with the modes it normalizes to, so the blob is byte-identical to the
staging route's.

A RECORD line needs a file's sha256 before the file is tarred (``pkg-1.dist-info`` sorts
before ``pkg/``), so the wheel's own RECORD claim is used. It is not hashed again on the way
into the tar: that was a second sha256 of every installed byte (8 CPU s of a served build,
issue 41), and it proved nothing the audit does not. The wheel is pinned by its sha256, and
``frank.audit`` holds every file of the image to that pinned wheel's RECORD, so a wheel whose
RECORD lies gives an image whose audit names the file, by either route (the staging route's
RECORD would say "RECORD rewritten" instead). A zip that does not read back as its directory
says (a member cut short, a size that does not hold, no local header) raises
``StreamRefused`` and the caller builds that layer the staging way, which fails in its own
words.
"""

from __future__ import annotations

import base64
import hashlib
import io
import struct
import tarfile
import warnings
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, BinaryIO

from installer import install
from installer.destinations import SchemeDictionaryDestination
from installer.records import Hash, RecordEntry, parse_record_file
from installer.scripts import Script
from installer.sources import WheelFile
from installer.utils import Scheme

from frank.assemble.install import INTERPRETER, scheme
from frank.image.layer import EXCLUDED_DIRS, EXCLUDED_SUFFIXES, KEY_HEADER

if TYPE_CHECKING:
    from installer.scripts import ScriptSection

try:  # ISA-L inflates about twice as fast as zlib here; the bytes out are the same
    from isal import isal_zlib as _inflate
except ImportError:  # pragma: no cover - isal is a dependency; zlib gives the same bytes
    _inflate = zlib  # type: ignore[misc]
# what a bad deflate stream raises, from either module
_BAD_DATA: tuple[type[BaseException], ...] = (
    zipfile.BadZipFile, ValueError, EOFError, zlib.error, getattr(_inflate, "error", zlib.error))

_CHUNK = 1 << 20
_LOCAL_HEADER = 30  # bytes before the name in a zip local file header


class StreamRefused(Exception):
    """This layer cannot be streamed byte-identically (a zip member that does not read back
    as its directory says, a file that is also a folder): build it the staging way."""


@dataclass
class Member:
    """One file of the layer: where its bytes come from and the sha256 its RECORD line
    gives (the wheel's claim; the audit holds the file to it)."""

    wheel: Path | None  # None: ``data`` holds the bytes (a generated file)
    info: zipfile.ZipInfo | None
    data: bytes | None
    digest: bytes  # sha256, raw
    size: int
    executable: bool


def _b64(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")


def _claimed(value: str) -> bytes | None:
    try:
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
    except (ValueError, TypeError):
        return None
    return raw if len(raw) == 32 else None


class _Planner(SchemeDictionaryDestination):
    """An installer destination that records what it would write instead of writing it."""

    def __init__(self, scheme_dict: dict[str, str], members: dict[str, Member]):
        super().__init__(scheme_dict, interpreter=INTERPRETER, script_kind="posix",
                         bytecode_optimization_levels=(), overwrite_existing=True)
        self.members = members
        self.wheel: Path | None = None
        self.zf: zipfile.ZipFile | None = None
        self.claims: dict[str, bytes] = {}

    def start(self, wheel: Path, zf: zipfile.ZipFile, dist_info: str) -> None:
        """The next wheel: its RECORD's sha256 claims, by path inside the wheel."""
        self.wheel, self.zf = wheel, zf
        self.claims = {}
        lines = zf.read(f"{dist_info}/RECORD").decode("utf-8").splitlines()
        for path, hash_, _size in parse_record_file(lines):
            if hash_.startswith("sha256="):
                raw = _claimed(hash_.split("=", 1)[1])
                if raw is not None:
                    self.claims[path] = raw

    def write_to_fs(self, scheme: Scheme, path: str, stream: BinaryIO,
                    is_executable: bool) -> RecordEntry:
        target = self._path_with_destdir(scheme, path)  # installer's own path checks
        arc = target.as_posix().lstrip("/")
        name = getattr(stream, "name", None)
        if isinstance(stream, zipfile.ZipExtFile) and self.zf is not None \
                and isinstance(name, str):
            info = self.zf.getinfo(name)
            digest = self.claims.get(name)
            if digest is None:  # no usable claim: hash it now
                h = hashlib.sha256()
                with self.zf.open(info) as again:
                    while chunk := again.read(_CHUNK):
                        h.update(chunk)
                digest = h.digest()
            member = Member(self.wheel, info, None, digest, info.file_size, is_executable)
        else:  # generated: a script launcher, a fixed shebang, INSTALLER, RECORD
            data = stream.read()
            member = Member(None, None, data, hashlib.sha256(data).digest(), len(data),
                            is_executable)
        old = self.members.get(arc)
        if old is not None:  # installer reopens it "wb": the mode stays, +x is only added
            member.executable = member.executable or old.executable
        self.members[arc] = member
        return RecordEntry(path, Hash(self.hash_algorithm, _b64(member.digest)), member.size)

    def write_script(self, name: str, module: str, attr: str,
                     section: ScriptSection) -> RecordEntry:
        script_name, data = Script(name, module, attr, section).generate(
            self.interpreter, self.script_kind)
        with io.BytesIO(data) as stream:
            return self.write_to_fs(Scheme("scripts"), script_name, stream, is_executable=True)


def plan_wheels(wheels: list[tuple[str, Path]], site: str) -> dict[str, Member]:
    """Every file ``install_wheels`` would write for these wheels, in this order, by image
    path (relative, no leading slash); a later wheel's file replaces an earlier one's.
    A wheel installer refuses raises installer's error (the staging route names it)."""
    members: dict[str, Member] = {}
    dest = _Planner(scheme(Path("/"), site), members)
    for filename, path in wheels:
        with zipfile.ZipFile(path) as zf, warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # stray __pycache__ files
            zf.filename = filename  # WheelFile reads the name from it; the store's is a hash
            source = WheelFile(zf)
            dest.start(path, zf, source.dist_info_dir)
            install(source, dest, {"INSTALLER": b"frank\n"})
    return members


def _excluded(arc: str) -> bool:
    parts = arc.split("/")
    return any(p in EXCLUDED_DIRS for p in parts[:-1]) or parts[-1].endswith(EXCLUDED_SUFFIXES)


def entries(members: dict[str, Member]) -> list[tuple[str, Member | None]]:
    """(image path, member; None for a directory), as ``layer.collect`` lists the staged
    tree: every directory a file was written under, ``__pycache__`` and ``*.pyc`` left out."""
    found: dict[str, Member | None] = {}
    for arc, m in members.items():
        parts = arc.split("/")
        for i in range(1, len(parts)):
            if parts[i - 1] in EXCLUDED_DIRS:
                break
            parent = "/".join(parts[:i])
            if found.get(parent) is not None:
                raise StreamRefused(f"/{parent} is both a file and a directory")
            found[parent] = None
        if not _excluded(arc):
            if arc in found and found[arc] is None:
                raise StreamRefused(f"/{arc} is both a file and a directory")
            found[arc] = m
    return [(k, found[k]) for k in sorted(found)]


def _chunks(m: Member, files: dict[Path, IO[bytes]]) -> Iterator[bytes]:
    """One member's bytes as they come: inflated from its wheel (at most 1 MB at a time), or
    the generated bytes in memory."""
    if m.data is not None:
        yield m.data
        return
    assert m.wheel is not None and m.info is not None
    info = m.info
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        with zipfile.ZipFile(m.wheel) as zf, zf.open(info.filename) as stream:
            while chunk := stream.read(_CHUNK):
                yield chunk
        return
    f = files.get(m.wheel)
    if f is None:
        f = files[m.wheel] = m.wheel.open("rb")
    f.seek(info.header_offset)
    head = f.read(_LOCAL_HEADER)
    if len(head) != _LOCAL_HEADER or head[:4] != b"PK\x03\x04":
        raise StreamRefused(f"{info.filename}: no local header where the zip says")
    name_len, extra_len = struct.unpack("<HH", head[26:30])
    f.seek(info.header_offset + _LOCAL_HEADER + name_len + extra_len)
    left = info.compress_size
    d = _inflate.decompressobj(-15) if info.compress_type == zipfile.ZIP_DEFLATED else None
    pending = b""
    while pending or left > 0:
        if not pending:
            pending = f.read(min(_CHUNK, left))
            if not pending:
                raise StreamRefused(f"{info.filename} is cut short")
            left -= len(pending)
        if d is None:
            out, pending = pending, b""
        else:  # bounded output: a member that inflates 1000x stays 1 MB at a time
            out = d.decompress(pending, _CHUNK)
            pending = d.unconsumed_tail
        if out:
            yield out
    if d is not None and (out := d.flush()):
        yield out


def _write_member(m: Member, files: dict[Path, IO[bytes]], out: IO[bytes]) -> None:
    """A member's bytes into the tar as they are inflated: each chunk written once, no copy
    (the tar reader used to re-buffer them into the tar's block sizes), and held to the
    size the header was written with. The blob's own hash sees every byte; the RECORD claim
    is the audit's to check (module docstring)."""
    what = m.info.filename if m.info is not None else "a generated file"
    size = 0
    for chunk in _chunks(m, files):
        size += len(chunk)
        if size > m.size:
            raise StreamRefused(f"{what} is not the {m.size} bytes its zip says")
        out.write(chunk)
    if size != m.size:
        raise StreamRefused(f"{what} is not the {m.size} bytes its zip says")
    if size % tarfile.BLOCKSIZE:
        out.write(tarfile.NUL * (tarfile.BLOCKSIZE - size % tarfile.BLOCKSIZE))


def write_wheel_tar(members: dict[str, Member], epoch: int, out: IO[bytes],
                    stop: object = None, *, key: str | None = None) -> None:
    """Write the layer tar of ``members``: the bytes ``layer.write_tar`` gives for the tree
    ``install_wheels`` would stage (``key``: the layer index key its first member names, as
    ``layer.write_tar`` writes it). ``stop`` (an Event) ends it early.

    The archive is what ``tarfile.open(mode="w", format=PAX_FORMAT, encoding="utf-8")``
    writes with ``addfile`` and ``close``: each header from ``TarInfo.tobuf`` with those
    settings, the data padded to 512 bytes, two zero blocks and zeros up to a 10 KiB record.
    Written here rather than through ``addfile`` so each member's bytes pass once, with no
    re-buffering into the reader's block sizes (a copy of most bytes, under the GIL).
    """
    files: dict[Path, IO[bytes]] = {}
    offset = 0
    try:
        for i, (arc, m) in enumerate(entries(members)):
            if stop is not None and i % 64 == 0 and stop.is_set():  # type: ignore[attr-defined]
                raise StreamRefused("stopped")
            info = tarfile.TarInfo(arc + ("/" if m is None else ""))
            if key and i == 0:
                info.pax_headers = {KEY_HEADER: key}
            info.mtime = epoch
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if m is None:
                info.mode = 0o755
                info.type = tarfile.DIRTYPE
            else:
                info.mode = 0o755 if m.executable else 0o644
                info.type = tarfile.REGTYPE
                info.size = m.size
            header = info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
            out.write(header)
            offset += len(header)
            if m is None:
                continue
            try:
                _write_member(m, files, out)
            except _BAD_DATA as exc:
                raise StreamRefused(f"{arc}: {exc}") from None
            offset += -(-m.size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
        end = offset + 2 * tarfile.BLOCKSIZE
        out.write(tarfile.NUL * (2 * tarfile.BLOCKSIZE + -end % tarfile.RECORDSIZE))
    finally:
        for f in files.values():
            f.close()
