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
"""

from __future__ import annotations

import re
import struct
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

EM_CUDA = 190
FATBIN_MAGIC = 0xBA55ED50
_MAGIC_BYTES = struct.pack("<I", FATBIN_MAGIC)
FATBIN_SECTIONS = (".nv_fatbin", "__nv_relfatbin")
KIND_PTX = 1
FLAG_ARCH_SPECIFIC = 0x100000  # sm_90a
FLAG_FAMILY = 0x200000  # sm_120f
SHT_NOBITS = 8
_TK_ARCH = re.compile(rb"-arch[ =]?(sm_[0-9]+[af]?)")

Read = Callable[[int, int], bytes]  # (offset in the file, length) -> bytes


@dataclass(frozen=True)
class CudaCode:
    """The archs a file holds code for, as ``sm_90a`` words."""

    sass: frozenset[str]
    ptx: frozenset[str]


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
            off, length = sections[".note.nv.tkinfo"]
            m = _TK_ARCH.search(read(off, min(length, 4096)))
            if m and m.group(1).decode()[:-1] == f"sm_{sm}" and m.group(1)[-1:] in b"af":
                suffix = m.group(1).decode()[-1]
        return CudaCode(frozenset({f"sm_{sm}{suffix}"}), frozenset())
    sass: set[str] = set()
    ptx: set[str] = set()
    carried = [sections[n] for n in FATBIN_SECTIONS if n in sections]
    for off, length in carried:
        _fatbin(read, off, min(length, max(0, size - off)), sass, ptx)
    return CudaCode(frozenset(sass), frozenset(ptx)) if carried else None


def _sections(read: Read, size: int, shoff: int, shentsize: int, shnum: int,
              shstrndx: int) -> dict[str, tuple[int, int]]:
    """Section name -> (offset, size) of the sections that have bytes in the file."""
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
    for name, kind, _flags, _addr, off, length in rows:
        if kind != SHT_NOBITS and name < len(names):
            end = names.find(b"\0", name)
            out[names[name:end if end >= 0 else None].decode("latin-1")] = (off, length)
    return out


def _fatbin(read: Read, start: int, length: int, sass: set[str], ptx: set[str]) -> None:
    pos, end = start, start + length
    while pos + 16 <= end:
        magic, _version, header, body = struct.unpack("<IHHQ", read(pos, 16))
        if magic != FATBIN_MAGIC:  # padding between containers: find the next one
            window = read(pos, min(1 << 16, end - pos))
            found = window.find(_MAGIC_BYTES, 1)
            if found < 0:
                if len(window) < (1 << 16):
                    return
                pos += len(window) - 3
                continue
            pos += found
            continue
        entry, stop = pos + header, min(pos + header + body, end)
        while entry + 64 <= stop:
            h = read(entry, 64)
            kind, _v, entry_header, payload = struct.unpack_from("<HHIQ", h, 0)
            arch, = struct.unpack_from("<I", h, 28)
            flags, = struct.unpack_from("<Q", h, 40)
            if entry_header < 64:
                break
            suffix = "a" if flags & FLAG_ARCH_SPECIFIC else "f" if flags & FLAG_FAMILY else ""
            (ptx if kind == KIND_PTX else sass).add(f"sm_{arch}{suffix}")
            entry += entry_header + payload
        pos = max(stop, pos + 16)


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
