"""The merged image held to its expectations: every difference, one line each.

Python: every locked distribution in the site folder at its locked version, each file its
``RECORD`` lists present with the hash and size the pinned wheel's own ``RECORD`` gives
(the image's ``RECORD`` for files the wheel does not list: entry-point scripts); no other
distribution in a layer frank made, and none of the base's at a second version beside a
locked one; a removed distribution absent, files included. Files: each data, binary and
frank file at its place with its hash; each binary folder's tree hash; each patched file
equal to the patch applied again; every file a frank layer holds owned by a RECORD or a
part. Config: the lock's env and entrypoint. GPU code: each part's declared archs present,
and per distribution and part whether its libraries run on ``[target] arch``.
"""

from __future__ import annotations

import posixpath
from collections import defaultdict
from dataclasses import dataclass, field
from functools import partial

from frank.audit.cuda import CudaCode
from frank.audit.expect import Expected, parse_record
from frank.audit.layers import Entry, MergedView
from frank.audit.report import CudaOwner, Difference
from frank.hashing import sha256_bytes
from frank.store.blobs import BlobStore

SITE_DIRS = ("site-packages", "dist-packages")
# files an image's own machinery writes at run or install time, never in a RECORD
_NOT_OWNED_OK = ("__pycache__",)
# the empty mount points a container engine leaves in a layer made by a RUN (the runtime
# mounts its own over them): not content anyone declared, and empty
ENGINE_MOUNT_POINTS = frozenset({"etc/hostname", "etc/hosts", "etc/resolv.conf"})


@dataclass
class Installed:
    """One ``*.dist-info`` folder found in a site folder."""

    name: str
    version: str
    site: str
    info: str  # the dist-info folder's image path
    layer: int
    record: dict[str, tuple[str, int | None]] = field(default_factory=dict)


def _canonical(name: str) -> str:
    from packaging.utils import canonicalize_name

    return str(canonicalize_name(name))


def installed_dists(view: MergedView, store: BlobStore | None = None) -> list[Installed]:
    """Every distribution the merged image holds directly in a site folder. With ``store``,
    each ``RECORD``'s parse is kept by the file's sha256 (``frank.audit.kept``)."""
    from frank.audit.kept import image_record

    out = []
    for path, (index, entry) in view.visible.items():
        if not path.endswith(".dist-info/RECORD") or entry.kind not in ("file", "hardlink"):
            continue
        info = path[: -len("/RECORD")]
        site, _, folder = info.rpartition("/")
        if not site.endswith(SITE_DIRS):
            continue  # a vendored copy inside a package (setuptools/_vendor/...)
        name, _, version = folder[: -len(".dist-info")].rpartition("-")
        real = view.get(path)
        if real is None:
            record: dict[str, tuple[str, int | None]] = {}
        elif store is None or not real.sha256:
            record = parse_record(view.read(index, real).decode("utf-8", "replace"))
        else:
            record = image_record(store, real.sha256, partial(view.read, index, real),
                                  parse_record)
        out.append(Installed(_canonical(name), version, site, info, index, record))
    return out


def _image_path(site: str, rel: str) -> str:
    if _plain(rel) and _plain(site):  # nothing to normalise: 106,000 calls on served
        return f"{site}/{rel}".lstrip("/")
    return posixpath.normpath(posixpath.join(site, rel)).lstrip("/")


def _plain(path: str) -> bool:
    """Whether ``path`` is relative and already normal: no ``.``, ``..`` or empty segment."""
    return bool(path) and path[0] not in "./" and path[-1] not in "./" and \
        "//" not in path and "/." not in path and "./" not in path


class _Allowed:
    """Image path -> the hashes some installed distribution's RECORD gives it: made on the
    first file that differs from its own RECORD (none, in an image that passes)."""

    def __init__(self, found: dict[str, list[Installed]]) -> None:
        self._dists = [d for dists in found.values() for d in dists if _plain(d.site)]
        self._all = [d for dists in found.values() for d in dists]
        self._odd: dict[str, set[str]] | None = None  # paths of RECORD lines not plain

    def of(self, path: str) -> set[str]:
        if self._odd is None:
            self._odd = defaultdict(set)
            for d in self._all:
                plain = _plain(d.site)
                for rel, (digest, _) in d.record.items():
                    if not (plain and _plain(rel)):
                        self._odd[_image_path(d.site, rel)].add(digest)
        out = set(self._odd.get(path, ()))
        for d in self._dists:  # a plain line under a plain site is the path as it stands
            if path.startswith(d.site + "/"):
                hit = d.record.get(path[len(d.site) + 1:])
                if hit is not None and _plain(path[len(d.site) + 1:]):
                    out.add(hit[0])
        return out


@dataclass
class Checker:
    """Collects differences; ``base_layers`` layers below frank's are the base image's."""

    view: MergedView
    want: Expected
    base_layers: int
    diffs: list[Difference] = field(default_factory=list)
    owned: dict[str, str] = field(default_factory=dict)  # image path -> owner
    store: BlobStore | None = None  # where RECORDs' parses are kept
    _patched: set[str] | None = field(default=None, repr=False)  # paths held to patches

    def add(self, part: str, path: str, check: str, lock: str, image: str) -> None:
        self.diffs.append(Difference(part=part, path="/" + path.lstrip("/"), check=check,
                                     lock=lock, image=image))

    def run(self) -> tuple[list[Difference], dict[str, str], list[str]]:
        base = self.python()
        self.files()
        self.unowned()
        return self.diffs, self.owned, base

    # -- Python -------------------------------------------------------------------------
    def python(self) -> list[str]:
        site = self.want.site
        found: dict[str, list[Installed]] = defaultdict(list)
        for dist in installed_dists(self.view, self.store):
            found[dist.name].append(dist)
        base_only: list[str] = []
        allowed = _Allowed(found)
        for name, want in sorted(self.want.dists.items()):
            here = [d for d in found.get(name, []) if d.site == site]
            if not here:
                self.add(want.part, f"{site}/{name}", "distribution missing",
                         f"{name} {want.version}", "no dist-info")
                continue
            dist = here[0]
            if want.version != "*" and dist.version != want.version:
                self.add(want.part, dist.info, "distribution version", want.version,
                         dist.version)
            if len(here) > 1:
                self.add(want.part, f"{site}/{name}", "distribution installed twice",
                         want.version, ", ".join(d.version for d in here))
            self._dist_files(want.part, dist, want.files, allowed)
        for name, dists in sorted(found.items()):
            for d in dists:
                if name in self.want.dists and d.site == site:
                    continue
                if name in self.want.removed:
                    self.add(self.want.removed[name], d.info, "removed distribution present",
                             "absent", f"{name} {d.version}")
                elif d.layer >= self.base_layers:
                    self.add("-", d.info, "distribution not in the lock", "absent",
                             f"{name} {d.version} (layer {d.layer})")
                elif name in self.want.dists:
                    self.add(self.want.dists[name].part, d.info,
                             "the base holds a second version", self.want.dists[name].version,
                             f"{d.version} in /{d.site}")
                else:
                    base_only.append(f"{name}=={d.version}")
                    for rel in d.record:
                        self.owned.setdefault(_image_path(d.site, rel), f"base:{name}")
        self._removed_files(found)
        return base_only

    def _dist_files(self, part: str, dist: Installed,
                    pinned: dict[str, tuple[str, int | None]] | None,
                    allowed: _Allowed) -> None:
        reference = dict(dist.record)
        if pinned is not None:
            for rel, (digest, size) in pinned.items():
                if rel in reference and reference[rel][0] != digest:
                    self.add(part, _image_path(dist.site, rel), "RECORD rewritten",
                             f"sha256 {digest[:16]} (the pinned wheel's RECORD)",
                             f"RECORD says {reference[rel][0][:16]}")
                reference[rel] = (digest, size)
        if self._patched is None:
            self._patched = {f.path for f in self.want.files}
        patched = self._patched
        for rel, (digest, size) in sorted(reference.items()):
            path = _image_path(dist.site, rel)
            self.owned.setdefault(path, f"{part}:{dist.name}")
            if path in patched:
                continue  # held to the patched content instead
            entry = self.view.get(path)
            if entry is None or entry.kind != "file":
                self.add(part, path, f"file of {dist.name} missing", f"sha256 {digest[:16]}",
                         "nothing" if entry is None else entry.kind)
                continue
            if entry.sha256 != digest and entry.sha256 not in allowed.of(path):
                self.add(part, path, f"file of {dist.name} differs",
                         f"sha256 {digest[:16]}" + (f" size {size}" if size is not None
                                                    else ""),
                         f"sha256 {entry.sha256[:16]} size {entry.size}")
            elif size is not None and entry.size != size and entry.sha256 == digest:
                self.add(part, path, f"file of {dist.name} size", str(size), str(entry.size))
        for path, _ in self.view.under(dist.info):  # its RECORD and INSTALLER are its own
            self.owned.setdefault(path, f"{part}:{dist.name}")

    def _removed_files(self, found: dict[str, list[Installed]]) -> None:
        """A removed distribution's files, from its RECORD in a lower layer, are gone."""
        for name, part in sorted(self.want.removed.items()):
            if found.get(name):
                continue
            for layer in self.view.layers:
                for entry in layer.entries:
                    if not entry.path.endswith(".dist-info/RECORD") or entry.kind != "file":
                        continue
                    info = entry.path[: -len("/RECORD")]
                    site, _, folder = info.rpartition("/")
                    if not site.endswith(SITE_DIRS) or _canonical(
                            folder[: -len(".dist-info")].rpartition("-")[0]) != name:
                        continue
                    text = self.view.read(layer.index, entry).decode("utf-8", "replace")
                    for rel in parse_record(text):
                        path = _image_path(site, rel)
                        if self.view.get(path) is not None and path not in self.owned:
                            self.add(part, path, f"file of removed {name} present", "absent",
                                     "present")
                    self._removed_folders(name, part, site, list(parse_record(text)))

    def _removed_folders(self, name: str, part: str, site: str, record: list[str]) -> None:
        """A removed distribution leaves no folder of its own: an empty package folder still
        imports (as a namespace package). A folder in which a distribution that stays has a
        file is not its own."""
        folders = {posixpath.dirname(_image_path(site, rel)) for rel in record}
        seen: set[str] = set()
        for folder in sorted(f for f in folders
                             if f.startswith(site + "/") and ".dist-info" not in f):
            parts = folder[len(site) + 1:].split("/")
            for depth in range(1, len(parts) + 1):  # its topmost folder that stayed
                here = "/".join([site, *parts[:depth]])
                entry = self.view.get(here)
                inside = [p for p, _ in self.view.under(here)]
                if here in seen or (entry is None and not inside) or (
                        entry is not None and entry.kind != "dir"):
                    break
                if any(p in self.owned for p in inside):
                    continue
                seen.add(here)
                self.add(part, here, f"folder of removed {name} present", "absent",
                         f"a folder of {len(inside)} entries: importable")
                break

    # -- files --------------------------------------------------------------------------
    def files(self) -> None:
        for f in self.want.files:
            self.owned[f.path] = f.part
            entry = self.view.get(f.path)
            if entry is None or entry.kind != "file":
                self.add(f.part, f.path, f"{f.what} missing", f"sha256 {f.sha256[:16]}",
                         "nothing" if entry is None else entry.kind)
            elif entry.sha256 != f.sha256:
                self.add(f.part, f.path, f"{f.what} differs", f"sha256 {f.sha256[:16]}",
                         f"sha256 {entry.sha256[:16]}")
        for path, part in self.want.deleted:
            if self.view.get(path) is not None:
                self.add(part, path, "file the patch deletes present", "absent", "present")
        for tree in self.want.trees:
            self._tree(tree.dest, tree.sha256, tree.part, tree.source)

    def _tree(self, dest: str, digest: str, part: str, source: object) -> None:
        from pathlib import Path

        entries = sorted((p, e) for p, e in self.view.under(dest) if e.kind != "dir")
        lines = []
        have: dict[str, str] = {}
        for path, entry in entries:
            rel = path[len(dest) + 1:]
            self.owned[path] = part
            real = self.view.get(path) if entry.kind == "hardlink" else entry
            if entry.kind == "symlink":
                lines.append(f"{sha256_bytes(entry.link.encode())} l {rel}\n")
            elif real is not None and real.kind == "file":
                mode = "x" if real.mode & 0o111 else "-"
                lines.append(f"{real.sha256} {mode} {rel}\n")
                have[rel] = real.sha256
        actual = sha256_bytes("".join(lines).encode())
        if actual == digest:
            return
        named = False
        if isinstance(source, Path) and source.is_dir():
            from frank.hashing import sha256_file, sha256_tree, tree_files

            if sha256_tree(source) == digest:  # the repo folder is the locked one: name files
                files = {p.relative_to(source).as_posix(): p for p in tree_files(source)}
                for rel, p in sorted(files.items()):
                    want = sha256_file(p) if p.is_file() and not p.is_symlink() else None
                    if want is not None and have.get(rel) != want:
                        self.add(part, f"{dest}/{rel}", "file of the folder differs",
                                 f"sha256 {want[:16]}",
                                 f"sha256 {have[rel][:16]}" if rel in have else "nothing")
                        named = True
                for rel in sorted(set(have) - set(files)):
                    self.add(part, f"{dest}/{rel}", "file not in the locked folder", "absent",
                             f"sha256 {have[rel][:16]}")
                    named = True
        if not named:
            self.add(part, dest, "folder tree hash", digest[:16], actual[:16])

    def unowned(self) -> None:
        """Every file a frank layer holds belongs to a RECORD, a part, or a step's outputs."""
        if self.want.unpredicted:
            return
        free = self.want.free
        for path, (index, entry) in sorted(self.view.visible.items()):
            if index < self.base_layers or entry.kind == "dir" or path in self.owned:
                continue
            if any(path == f or path.startswith(f + "/") for f, _ in free):
                self.owned[path] = next(p for f, p in free if path == f or
                                        path.startswith(f + "/"))
                continue
            if any(x in path.split("/") for x in _NOT_OWNED_OK) or (
                    path in ENGINE_MOUNT_POINTS and entry.kind == "file" and not entry.size):
                continue
            self.add("-", path, "file no part declares", "absent",
                     f"{entry.kind} in layer {index}" + (f" sha256 {entry.sha256[:16]}"
                                                          if entry.sha256 else ""))


def cuda_summary(view: MergedView, owned: dict[str, str], target: str,
                 base_layers: int) -> tuple[list[CudaOwner], list[tuple[str, CudaCode]]]:
    """GPU code per owner (a distribution, a part, the base) and the files that have it."""
    from frank.model.archs import parse_arch, runs_on

    device = None
    if target.startswith("sm_"):
        try:
            device = parse_arch(target)
        except ValueError:
            device = None
    groups: dict[str, list[tuple[str, CudaCode]]] = defaultdict(list)
    files: list[tuple[str, CudaCode]] = []
    for path, (index, entry) in view.visible.items():
        code = entry.cuda
        if code is None or entry.kind != "file":
            continue
        owner = owned.get(path) or ("base" if index < base_layers else "unowned")
        groups[owner].append((path, code))
        files.append((path, code))
    out = []
    for owner, items in sorted(groups.items()):
        sass: set[str] = set()
        ptx: set[str] = set()
        as_sass = as_ptx = never = 0
        examples: list[str] = []
        for path, code in items:
            sass |= code.sass
            ptx |= code.ptx
            if device is None:
                continue
            if any(_runs(a, device, False, parse_arch, runs_on) for a in code.sass):
                as_sass += 1
            elif any(_runs(a, device, True, parse_arch, runs_on) for a in code.ptx):
                as_ptx += 1
            else:
                never += 1
                if len(examples) < 3:
                    examples.append("/" + path)
        out.append(CudaOwner(owner=owner, files=len(items), sass=_sorted(sass),
                             ptx=_sorted(ptx), runs_as_sass=as_sass, runs_as_ptx=as_ptx,
                             runs_not=never, not_examples=examples))
    return out, files


def _runs(arch: str, device: object, ptx: bool, parse: object, rule: object) -> bool:
    try:
        code = parse(arch)  # type: ignore[operator]
    except ValueError:
        return False
    return bool(rule(code, device, ptx=ptx))  # type: ignore[operator]


def _sorted(archs: set[str]) -> list[str]:
    from frank.model.archs import parse_arch

    def key(a: str) -> tuple[int, int, str]:
        try:
            t = parse_arch(a)
            return (t.major, t.minor, t.suffix)
        except ValueError:
            return (999, 0, a)
    return sorted(archs, key=key)


def declared_archs(want: Expected, files: list[tuple[str, CudaCode]]) -> list[Difference]:
    """Each part's declared archs present in the code of its files."""
    from frank.model.archs import parse_arch

    out = []
    for decl in want.archs:
        have: set[str] = set()
        for path, code in files:
            if path == decl.dest or path.startswith(decl.dest + "/"):
                have |= code.sass | code.ptx
        for arch in decl.archs:
            try:
                name = parse_arch(arch).spell("sm")
            except ValueError:
                name = arch
            if name not in have:
                out.append(Difference(part=decl.part, path="/" + decl.dest,
                                      check="declared arch missing", lock=name,
                                      image=" ".join(_sorted(have)) or "no GPU code"))
    return out


def config(want: Expected, image_config: dict[str, object]) -> list[Difference]:
    """The lock's env and entrypoint in the image config."""
    cc = image_config.get("config") or {}
    assert isinstance(cc, dict)
    env = {}
    for item in cc.get("Env") or []:
        key, _, value = str(item).partition("=")
        env[key] = value
    out = []
    for key, value in sorted(want.env.items()):
        if env.get(key) != value:
            out.append(Difference(part="-", path="config Env", check=f"env {key}",
                                  lock=repr(value), image=repr(env[key]) if key in env
                                  else "unset"))
    entry = list(cc.get("Entrypoint") or [])
    if entry != want.entrypoint:
        out.append(Difference(part="-", path="config Entrypoint", check="entrypoint",
                              lock=" ".join(want.entrypoint), image=" ".join(entry) or "none"))
    labels = cc.get("Labels") or {}
    assert isinstance(labels, dict)
    for key in ("dev.frank.lock.digest",):
        if labels.get(key) != want.labels.get(key):
            out.append(Difference(part="-", path="config Labels", check=f"label {key}",
                                  lock=str(want.labels.get(key)), image=str(labels.get(key))))
    return out


__all__ = ["Checker", "Entry", "config", "cuda_summary", "declared_archs", "installed_dists"]
