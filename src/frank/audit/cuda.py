"""Which GPU code an ELF file holds: SASS (cubins) and PTX, by architecture.

Read from the headers alone, by offset, without reading the file through: an ELF's section
table names ``.nv_fatbin`` (an executable's or library's embedded fatbins) and
``__nv_relfatbin`` (relocatable device code); each fatbin is a run of containers (magic
``0xBA55ED50``), each a run of entries whose 64-byte header gives the kind (1 PTX, 2 ELF
cubin), the compute capability, and the ``a``/``f`` suffix bits. A standalone cubin
(``e_machine`` 190, EM_CUDA) holds the SASS of one arch in its ELF flags; its suffix is in
the ptxas command line its ``.note.nv.tkinfo`` records. That is what ``cuobjdump
--list-elf --list-ptx`` prints, and ``list_with_cuobjdump`` runs it, for the tests to hold
this reader to it (one difference: cuobjdump names a family cubin ``sm_120f`` as
``sm_120``). Reading headers costs a few small reads a file; cuobjdump needs the whole file
on disk, 6 ms a process, and served has 16,000 ELF files.

Containers hide outside those sections too: cuFFT 12.0 keeps ~24,000 of them in ``.ldata``
(12.5 in ``.data``, with no ``.nv_fatbin`` at all), many with compressed payloads, and
cuobjdump 13.5 lists none of them. So every other data section (allocated, not executable:
device code is data the runtime registers, never host instructions) is scanned for the magic,
and a hit counts only when its header holds together (version 1, a 16-byte header, a body
inside the section, a first entry of a known kind with a plausible arch). An entry's header
names its arch whether or not its payload is compressed, so nothing is inflated.
"""

from __future__ import annotations

import re
import struct
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

EM_CUDA = 190
FATBIN_MAGIC = 0xBA55ED50
_MAGIC_BYTES = struct.pack("<I", FATBIN_MAGIC)
FATBIN_SECTIONS = (".nv_fatbin", "__nv_relfatbin")
KIND_PTX = 1
KIND_ELF = 2
# every kind a container's entry may be: PTX, ELF (SASS), and two that hold neither (LTO IR:
# cuFFT 12.0 keeps 12,728 sm_75 ones in .ldata); only the first two say what can run
_KINDS = (KIND_PTX, KIND_ELF, 4, 8)
FLAG_COMPRESSED = 0x2000  # the entry's payload is compressed (its header still names the arch)
SHF_ALLOC = 0x2
SHF_EXECINSTR = 0x4
SHT_PROGBITS = 1
_SCAN_WINDOW = 1 << 20
FLAG_ARCH_SPECIFIC = 0x100000  # sm_90a
FLAG_FAMILY = 0x200000  # sm_120f
SHT_NOBITS = 8
_TK_ARCH = re.compile(rb"-arch[ =]?(sm_[0-9]+[af]?)")

Read = Callable[[int, int], bytes]  # (offset in the file, length) -> bytes


@dataclass(frozen=True)
class CudaCode:
    """The archs a file holds code for, as ``sm_90a`` words; ``sizes``: each entry's kind
    (``sass``/``ptx``), arch and stored bytes (what a target that cannot run it carries for
    nothing); ``hidden``: entries found outside the fatbin sections."""

    sass: frozenset[str]
    ptx: frozenset[str]
    sizes: tuple[tuple[str, str, int], ...] = field(default=(), compare=False)
    hidden: int = field(default=0, compare=False)


def is_elf(head: bytes) -> bool:
    return head[:4] == b"\x7fELF"


def read_cuda(read: Read, size: int) -> CudaCode | None:
    """The file's CUDA code, or None when it holds none (or is not a 64-bit ELF)."""
    head = read(0, 64)
    if len(head) < 64 or not is_elf(head) or head[4] != 2 or head[5] != 1:
        return None
    e_machine, = struct.unpack_from("<H", head, 18)
    e_flags, = struct.unpack_from("<I", head, 48)
    shoff, = struct.unpack_from("<Q", head, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", head, 0x3A)
    sections = _sections(read, size, shoff, shentsize, shnum, shstrndx)
    if e_machine == EM_CUDA:
        sm = (e_flags >> 8) & 0xFF if head[8] >= 8 else e_flags & 0xFF  # ELF ABI v8 moved it
        suffix = ""
        if ".note.nv.tkinfo" in sections:
            off, length, _ = sections[".note.nv.tkinfo"]
            m = _TK_ARCH.search(read(off, min(length, 4096)))
            if m and m.group(1).decode()[:-1] == f"sm_{sm}" and m.group(1)[-1:] in b"af":
                suffix = m.group(1).decode()[-1]
        arch = f"sm_{sm}{suffix}"
        return CudaCode(frozenset({arch}), frozenset(), (("sass", arch, size),))
    found = _Found()
    carried = [sections[n] for n in FATBIN_SECTIONS if n in sections]
    for off, length, _ in carried:
        _fatbin(read, off, min(length, max(0, size - off)), found, strict=False)
    for name, (off, length, flags) in sections.items():
        if name in FATBIN_SECTIONS or flags & SHF_EXECINSTR or not flags & SHF_ALLOC \
                or length < 80:
            continue
        before = len(found.sizes)
        _fatbin(read, off, min(length, max(0, size - off)), found, strict=True)
        found.hidden += len(found.sizes) - before
    if not carried and not found.sizes:
        return None
    return CudaCode(frozenset(found.sass), frozenset(found.ptx), tuple(found.sizes),
                    found.hidden)


@dataclass
class _Found:
    sass: set[str] = field(default_factory=set)
    ptx: set[str] = field(default_factory=set)
    sizes: list[tuple[str, str, int]] = field(default_factory=list)
    hidden: int = 0


def _sections(read: Read, size: int, shoff: int, shentsize: int, shnum: int,
              shstrndx: int) -> dict[str, tuple[int, int, int]]:
    """Section name -> (offset, size, flags) of the sections that have bytes in the file."""
    if not shoff or not shnum or shentsize < 64 or shoff + shnum * shentsize > size \
            or shstrndx >= shnum:
        return {}
    table = read(shoff, shnum * shentsize)
    rows = [struct.unpack_from("<IIQQQQ", table, i * shentsize) for i in range(shnum)]
    _, _, _, _, str_off, str_size = rows[shstrndx]
    if str_off + str_size > size:
        return {}
    names = read(str_off, str_size)
    out = {}
    for name, kind, flags, _addr, off, length in rows:
        if kind != SHT_NOBITS and name < len(names):
            end = names.find(b"\0", name)
            out[names[name:end if end >= 0 else None].decode("latin-1")] = (off, length,
                                                                            flags)
    return out


def _fatbin(read: Read, start: int, length: int, found: _Found, *, strict: bool) -> None:
    """Every container in ``[start, start + length)``: a fatbin section's run (``strict``
    False: whatever carries the magic is one) or a data section scanned for them.

    One window of the section is read at a time and searched for every magic in it; a
    container's headers come from the window when they lie in it (cuFFT's .ldata holds
    23,983 containers in 278 MB: a window read per container was 24 GB of copying)."""
    end = start + length
    base, window = start, b""

    def get(off: int, n: int) -> bytes:
        if base <= off and off + n <= base + len(window):
            return window[off - base:off - base + n]
        return read(off, n)

    pos = start
    while pos + 16 <= end:
        if not (base <= pos and pos + 16 <= base + len(window)):
            base, window = pos, read(pos, min(_SCAN_WINDOW, end - pos))
            if len(window) < 16:
                return
        hit = window.find(_MAGIC_BYTES, pos - base)
        if hit < 0:
            if base + len(window) >= end:
                return
            pos = base + len(window) - 3  # a magic may straddle the windows
            window = b""
            continue
        pos = base + hit
        if pos + 16 > end:
            return
        _magic, version, header, body = struct.unpack("<IHHQ", get(pos, 16))
        if strict and not _plausible(get, pos, version, header, body, end):
            pos += 4
            continue
        entry, stop = pos + header, min(pos + header + body, end)
        while entry + 64 <= stop:
            h = get(entry, 64)
            kind, _v, entry_header, payload = struct.unpack_from("<HHIQ", h, 0)
            arch, = struct.unpack_from("<I", h, 28)
            flags, = struct.unpack_from("<Q", h, 40)
            if entry_header < 64:
                break
            suffix = "a" if flags & FLAG_ARCH_SPECIFIC else "f" if flags & FLAG_FAMILY else ""
            name = f"sm_{arch}{suffix}"
            if kind == KIND_PTX:
                found.ptx.add(name)
                found.sizes.append(("ptx", name, payload))
            elif kind == KIND_ELF or not strict:
                found.sass.add(name)
                found.sizes.append(("sass", name, payload))
            entry += entry_header + payload
        pos = max(stop, pos + 16)


def _plausible(read: Read, pos: int, version: int, header: int, body: int, end: int) -> bool:
    """Whether a magic found in a data section starts a real container."""
    if version != 1 or header != 16 or body < 64 or pos + 16 + body > end:
        return False
    h = read(pos + 16, 64)
    if len(h) < 64:
        return False
    kind, _v, entry_header, payload = struct.unpack_from("<HHIQ", h, 0)
    arch, = struct.unpack_from("<I", h, 28)
    return kind in _KINDS and 64 <= entry_header <= 4096 \
        and 10 <= arch <= 200 and entry_header + payload <= body


def file_reader(path: Path) -> tuple[Read, int]:
    """A reader over a file on disk (the tests, cuobjdump's comparisons)."""
    data = path.read_bytes()
    return (lambda off, n: data[off:off + n]), len(data)


_ELF_LINE = re.compile(r"ELF file\s+\d+: \S*?\.(sm_\w+?)\.cubin")
_PTX_LINE = re.compile(r"PTX file\s+\d+: \S*?\.(sm_\w+?)\.ptx")


def list_with_cuobjdump(path: Path, cuobjdump: str) -> CudaCode:
    """What ``cuobjdump --list-elf --list-ptx`` says the file holds."""
    out = subprocess.run([cuobjdump, "--list-elf", "--list-ptx", str(path)],
                         capture_output=True, text=True, check=False, timeout=600).stdout
    return CudaCode(frozenset(_ELF_LINE.findall(out)), frozenset(_PTX_LINE.findall(out)))


def has_symbol(read: Read, size: int, name: str) -> bool:
    """Whether the ELF file defines ``name`` in its dynamic symbol table (what dlsym and
    torch's op registry can reach), read by offset."""
    head = read(0, 64)
    if len(head) < 64 or not is_elf(head) or head[4] != 2:
        return False
    shoff, = struct.unpack_from("<Q", head, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", head, 0x3A)
    sections = _sections(read, size, shoff, shentsize, shnum, shstrndx)
    if ".dynsym" not in sections or ".dynstr" not in sections:
        return False
    sym_off, sym_len, _ = sections[".dynsym"]
    str_off, str_len, _ = sections[".dynstr"]
    strings = read(str_off, str_len)
    want = name.encode()
    at = strings.find(b"\0" + want + b"\0")
    if at < 0:
        return False
    table = read(sym_off, sym_len)
    for i in range(0, len(table) - 23, 24):
        st_name, = struct.unpack_from("<I", table, i)
        shndx, = struct.unpack_from("<H", table, i + 6)
        if shndx and strings[st_name:st_name + len(want) + 1] == want + b"\0":
            return True
    return False
