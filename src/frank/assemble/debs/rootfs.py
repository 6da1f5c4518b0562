"""Unpack pinned .debs into one deterministic tar, as dpkg would, without running anything.

Each package's data.tar is read in lock order and merged by path (a later package's file
replaces an earlier one's, as a dpkg Replaces would); owners, modes and setuid bits come
from the .deb's own tar headers, never from the filesystem or the user running frank,
because nothing is extracted as a tree: file bytes are spooled and the layer tar is written
from the merged headers by ``frank.image.layer.write_tar`` (sorted, every mtime the epoch).
So the same lock gives the same bytes on any machine, as root or not.

The layout is Debian's merged /usr (bin, sbin, lib, lib64 are links into usr/), as
debootstrap makes for bookworm; a package's ``./bin/sh`` lands at ``usr/bin/sh``. What a
maintainer script would have generated and a container needs is written here instead, from
the packages' own files: dpkg's status and file lists (so scanners see the packages),
``/etc/passwd`` and ``/etc/group`` (root and nobody: getpass and torch need an entry) and the
CA bundle ``update-ca-certificates`` would concatenate. Docs, man pages and translations are
left out, as in Debian's slim images; each package's copyright file is kept.
"""

from __future__ import annotations

import lzma
import tarfile
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from debian.deb822 import Deb822
from debian.debfile import DebError, DebFile

from frank.errors import FrankError
from frank.image.layer import Entry, write_tar
from frank.resolve.debs.lock import LockedDeb

MERGED_USR = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
ALWAYS_LINKED = ("bin", "sbin", "lib")
PRUNE = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale",
         "usr/share/lintian")
PASSWD = ("root:x:0:0:root:/root:/bin/sh\n"
          "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
GROUP = "root:x:0:\nnogroup:x:65534:\n"
CA_DIR = "usr/share/ca-certificates"
CA_BUNDLE = "etc/ssl/certs/ca-certificates.crt"
# Control files dpkg keeps in its database (the maintainer scripts are left out: none runs).
INFO_FILES = ("md5sums", "conffiles", "shlibs", "symbols", "triggers")


@dataclass
class Tree:
    """The merged root being built: one layer Entry per path, file bytes spooled to ``dir``."""

    dir: Path
    members: dict[str, Entry] = field(default_factory=dict)
    owners: dict[str, str] = field(default_factory=dict)  # path -> package ("" if frank's)
    lists: dict[str, list[str]] = field(default_factory=dict)  # package -> its paths
    spooled: int = 0

    def spool(self, data: bytes) -> Path:
        self.spooled += 1
        path = self.dir / str(self.spooled)
        path.write_bytes(data)
        return path

    def add(self, e: Entry, owner: str) -> None:
        old = self.members.get(e.arcname)
        if old is not None and (old.kind == "dir") != (e.kind == "dir"):
            raise FrankError(f"/{e.arcname} is a {old.kind} in "
                             f"{self.owners[e.arcname] or 'frank'} and a {e.kind} in {owner}")
        if old is not None and old.kind == "dir":
            return  # the first package to ship a directory sets its owner and mode
        self.members[e.arcname] = e
        self.owners[e.arcname] = owner

    def generate(self, path: str, data: bytes) -> None:
        """A file no package ships but a script would have written (kept if one ships it)."""
        if path not in self.members:
            self.add(Entry(path, "file", self.spool(data), 0o644), "")


def _image_path(name: str) -> str:
    """A data.tar name as it lands in a merged-/usr root, without ./ or a trailing /."""
    path = name.removeprefix("./").removeprefix("/").rstrip("/")
    top = path.split("/", 1)[0]
    return f"usr/{path}" if top in MERGED_USR else path


def _pruned(path: str) -> bool:
    for p in PRUNE:
        if path == p or path.startswith(p + "/"):
            return not (p == "usr/share/doc" and path.endswith("/copyright"))
    return False


def _entry(tree: Tree, tar: tarfile.TarFile, info: tarfile.TarInfo, arcname: str,
           earlier: dict[str, Entry]) -> Entry | None:
    """The layer entry for one data.tar member: owner and mode from its header."""
    mode, uid, gid = info.mode & 0o7777, info.uid, info.gid
    if info.isdir():
        return Entry(arcname, "dir", None, mode, uid, gid)
    if info.issym():
        return Entry(arcname, "symlink", None, 0o777, uid, gid, info.linkname)
    if info.islnk():  # a hard link: the same bytes again (its target is earlier in this tar)
        target = earlier.get(_image_path(info.linkname))
        if target is None or target.kind != "file":
            raise FrankError(f"hard link {info.name} to a missing {info.linkname}")
        return Entry(arcname, "file", target.source, mode, uid, gid)
    if info.isfile():
        src = tar.extractfile(info)
        assert src is not None
        return Entry(arcname, "file", tree.spool(src.read()), mode, uid, gid)
    return None  # device nodes and fifos: the runtime provides /dev


def _unpack(tree: Tree, deb: LockedDeb, path: Path) -> str:
    """Merge one .deb's data and dpkg info files into ``tree``; its dpkg status stanza."""
    try:
        with DebFile(str(path)) as pkg:
            control = pkg.debcontrol()
            if (control.get("Package"), control.get("Version")) != (deb.name, deb.version):
                raise FrankError(f"{deb.filename} holds {control.get('Package')} "
                                 f"{control.get('Version')}, not {deb.name} {deb.version}")
            info_name = _info_name(deb, control)
            for part in INFO_FILES:
                if pkg.control.has_file(part):
                    data = pkg.control.get_content(part)
                    assert isinstance(data, bytes)
                    tree.generate(f"var/lib/dpkg/info/{info_name}.{part}", data)
            tar = pkg.data.tgz()
            listed = tree.lists.setdefault(info_name, ["/."])
            earlier: dict[str, Entry] = {}
            for info in tar:
                arcname = _image_path(info.name)
                if not arcname:
                    continue
                e = _entry(tree, tar, info, arcname, earlier)
                if e is None:
                    continue
                earlier[arcname] = e
                if not _pruned(arcname):
                    tree.add(e, deb.name)
                    listed.append("/" + info.name.removeprefix("./").rstrip("/"))
    except (DebError, tarfile.TarError, OSError, EOFError, lzma.LZMAError, zlib.error) as exc:
        raise FrankError(f"{deb.filename}: not a readable .deb: {exc}") from None
    return _status(control)


def _info_name(deb: LockedDeb, control: Deb822) -> str:
    """dpkg's name for a package's info files: ``pkg:arch`` when it is Multi-Arch: same."""
    return f"{deb.name}:{deb.arch}" if control.get("Multi-Arch") == "same" else deb.name


def _status(control: Deb822) -> str:
    """The package's dpkg status stanza: its control fields, Status after Package."""
    out = Deb822()
    for k, v in control.items():
        out[k] = v
        if k == "Package":
            out["Status"] = "install ok installed"
    return str(out.dump()).rstrip("\n") + "\n"


def _ca_bundle(tree: Tree) -> bytes:
    """The concatenation update-ca-certificates makes of every shipped certificate."""
    out = bytearray()
    for p in sorted(tree.members):
        e = tree.members[p]
        if p.startswith(CA_DIR + "/") and p.endswith(".crt") and e.source is not None:
            data = e.source.read_bytes()
            out += data if data.endswith(b"\n") else data + b"\n"
    return bytes(out)


def _finish(tree: Tree, stanzas: list[str]) -> list[Entry]:
    """Add what maintainer scripts would have written, the merged-/usr links and parents."""
    tree.generate("var/lib/dpkg/status", "\n".join(stanzas).encode())
    tree.generate("var/lib/dpkg/info/format", b"1\n")  # pkg:arch names (multiarch layout)
    for pkg, paths in tree.lists.items():
        tree.generate(f"var/lib/dpkg/info/{pkg}.list", ("\n".join(paths) + "\n").encode())
    tree.generate("etc/passwd", PASSWD.encode())
    tree.generate("etc/group", GROUP.encode())
    if any(p.startswith(CA_DIR + "/") for p in tree.members):
        tree.generate(CA_BUNDLE, _ca_bundle(tree))
    for top in MERGED_USR:
        if top in ALWAYS_LINKED or f"usr/{top}" in tree.members:
            tree.add(Entry(top, "symlink", None, 0o777, linkname=f"usr/{top}"), "")
    for path in list(tree.members):
        parts = path.split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            if parent not in tree.members:
                tree.add(Entry(parent, "dir", None, 0o755), "")
    return [tree.members[k] for k in sorted(tree.members)]


def write_root(debs: list[tuple[LockedDeb, Path]], out: IO[bytes], *, epoch: int,
               tmp_dir: Path | None = None) -> int:
    """Merge the .debs (in this order) into one tar on ``out``; how many paths it holds."""
    with tempfile.TemporaryDirectory(dir=tmp_dir, prefix="debs-spool-") as spool:
        tree = Tree(Path(spool))
        stanzas = {deb.name: _unpack(tree, deb, path) for deb, path in debs}
        members = _finish(tree, [stanzas[k] for k in sorted(stanzas)])
        write_tar(members, epoch, out)
        return len(members)
