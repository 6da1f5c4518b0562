"""Small ELF files made byte by byte, for the audit's device-code reader: fatbin containers
placed in any section (``.nv_fatbin``, ``.data``, ``.ldata``, even ``.text``), entries with
compressed payloads, and a dynamic symbol table. Real enough for the reader and readelf."""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAGIC = 0xBA55ED50
SHF_WRITE, SHF_ALLOC, SHF_EXECINSTR = 0x1, 0x2, 0x4
PROGBITS, SYMTAB, STRTAB, DYNSYM = 1, 2, 3, 11
COMPRESSED = 0x2000
FAMILY = 0x200000


@dataclass
class Section:
    name: str
    kind: int
    flags: int
    data: bytes
    link: int = 0
    entsize: int = 0


def entry(arch: int, *, ptx: bool = False, payload: bytes = b"\x11" * 48,
          flags: int = 0) -> bytes:
    """One fatbin entry: its 64-byte header (kind, version, header size, payload size,
    arch at 28, flags at 40) and its payload, stored as given (compressed or not)."""
    head = bytearray(64)
    struct.pack_into("<HHIQ", head, 0, 1 if ptx else 2, 0x0101, 64, len(payload))
    struct.pack_into("<I", head, 28, arch)
    struct.pack_into("<Q", head, 40, flags)
    return bytes(head) + payload


def container(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", MAGIC, 1, 16, len(body)) + body


def dynsym(names: list[str]) -> tuple[bytes, bytes]:
    """(.dynsym, .dynstr) defining each name in section 1."""
    strings = b"\0"
    table = bytes(24)
    for name in names:
        table += struct.pack("<IBBHQQ", len(strings), 0x12, 0, 1, 0, 0)
        strings += name.encode() + b"\0"
    return table, strings


def elf(sections: list[Section]) -> bytes:
    """An ELF64 little-endian shared object holding ``sections`` (plus null and
    .shstrtab)."""
    names = b"\0"
    offsets = []
    for s in sections:
        offsets.append(len(names))
        names += s.name.encode() + b"\0"
    shstr_name = len(names)
    names += b".shstrtab\0"
    body = bytearray(64)
    placed = []
    for s in sections:
        while len(body) % 16:
            body += b"\0"
        placed.append(len(body))
        body += s.data
    shstr_off = len(body)
    body += names
    while len(body) % 8:
        body += b"\0"
    shoff = len(body)
    table = bytes(64)
    for s, name, off in zip(sections, offsets, placed, strict=True):
        table += struct.pack("<IIQQQQIIQQ", name, s.kind, s.flags, 0, off, len(s.data),
                             s.link, 0, 8, s.entsize)
    table += struct.pack("<IIQQQQIIQQ", shstr_name, STRTAB, 0, 0, shstr_off, len(names),
                         0, 0, 1, 0)
    shnum = len(sections) + 2
    head = bytearray(b"\x7fELF\x02\x01\x01" + bytes(9))
    head += struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64, shnum,
                        shnum - 1)
    body[:64] = head
    return bytes(body) + table
