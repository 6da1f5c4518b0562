"""What an image built from a lock must hold: derived from the lock and its build plan alone.

Never from the image: each expectation comes from a pinned input. A closure wheel's files
come from the wheel's own ``RECORD`` (the wheel is read from the store by its locked sha256,
so a rewritten ``RECORD`` in the image cannot vouch for a rewritten file); a repo plugin's
files from its source folder; a patched file from applying the patch again to the pinned
engine wheel; a data or binary part's file from the hash the lock recorded; frank's own
files (launcher, lock, pinned requirement lines) from their text. What cannot be derived (a
file a container step makes, a wheel built in a step) is said in ``notes`` and only its
declared place is checked.
"""

from __future__ import annotations

import base64
import csv
import io
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import canonicalize_name

from frank.assemble.plan import BuildPlan, PlanLayer
from frank.errors import FrankError
from frank.hashing import sha256_bytes, sha256_file
from frank.resolve.lock import Lock, LockedPart
from frank.store.blobs import BlobStore


@dataclass(frozen=True)
class WantDist:
    """A distribution the image must hold in the site folder, at ``version`` (``*``: any,
    a wheel built in a step), with ``files`` (site-relative path -> (sha256 hex, size))
    where they are known from a pinned input."""

    name: str
    version: str
    part: str
    files: dict[str, tuple[str, int | None]] | None = None


@dataclass(frozen=True)
class WantFile:
    """A file at ``path`` (image path, no leading slash) with ``sha256``."""

    path: str
    sha256: str
    part: str
    what: str


@dataclass(frozen=True)
class WantTree:
    """A folder at ``dest`` whose content hashes (``hashing.sha256_tree``) to ``sha256``."""

    dest: str
    sha256: str
    part: str
    source: Path | None  # the repo folder, to name the files that differ


@dataclass(frozen=True)
class WantArchs:
    """A part that declares GPU archs: its files under ``dest`` must hold code for each."""

    part: str
    archs: tuple[str, ...]
    dest: str


@dataclass
class Expected:
    """Everything the image is held to."""

    site: str
    dists: dict[str, WantDist] = field(default_factory=dict)
    removed: dict[str, str] = field(default_factory=dict)  # distribution -> part
    files: list[WantFile] = field(default_factory=list)
    trees: list[WantTree] = field(default_factory=list)
    deleted: list[tuple[str, str]] = field(default_factory=list)  # (path, part)
    archs: list[WantArchs] = field(default_factory=list)
    free: list[tuple[str, str]] = field(default_factory=list)  # (folder, part): step outputs
    env: dict[str, str] = field(default_factory=dict)
    entrypoint: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    target: str = ""
    notes: list[str] = field(default_factory=list)
    unpredicted: bool = False  # some layer runs commands whose files cannot be predicted

    @property
    def declared_paths(self) -> dict[str, str]:
        """Image path -> part of every file a part declares outside a RECORD."""
        out = {f.path: f.part for f in self.files}
        out.update({p: part for p, part in self.deleted})
        return out


def _b64_hex(value: str) -> str | None:
    algo, _, digest = value.partition("=")
    if algo != "sha256" or not digest:
        return None
    try:
        return base64.urlsafe_b64decode(digest + "=" * (-len(digest) % 4)).hex()
    except ValueError:
        return None


def parse_record(text: str) -> dict[str, tuple[str, int | None]]:
    """A RECORD's hashed lines: path -> (sha256 hex, size). Bytecode is left out: the
    layer writer drops ``__pycache__`` and ``*.pyc`` (they embed mtimes)."""
    out: dict[str, tuple[str, int | None]] = {}
    for row in csv.reader(io.StringIO(text)):
        if len(row) < 2 or not row[1]:
            continue
        path = row[0]
        if path.endswith(".pyc") or "__pycache__" in path.split("/"):  # no pathlib: 137k rows
            continue
        digest = _b64_hex(row[1])
        if digest is None:
            continue
        size = int(row[2]) if len(row) > 2 and row[2].isdigit() else None
        out[path] = (digest, size)
    return out


def wheel_record(wheel: Path) -> dict[str, tuple[str, int | None]]:
    """The files a wheel installs into site-packages, from its own RECORD: what lands
    elsewhere (``*.data/``) or is rewritten on install (the RECORD itself) is left out."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            name = next((n for n in zf.namelist() if n.count("/") == 1
                         and n.endswith(".dist-info/RECORD")), None)
            if name is None:
                raise FrankError("the wheel has no RECORD", file=wheel)
            text = zf.read(name).decode("utf-8")
    except (zipfile.BadZipFile, OSError, UnicodeDecodeError) as exc:
        raise FrankError(f"cannot read the wheel's RECORD ({exc})", file=wheel) from None
    info = name.split("/", 1)[0]
    return {p: v for p, v in parse_record(text).items()
            if not p.split("/", 1)[0].endswith(".data") and p not in (
                f"{info}/RECORD", f"{info}/INSTALLER", f"{info}/direct_url.json")}


def expected(plan: BuildPlan, lock: Lock, root: Path, store: BlobStore) -> Expected:
    """What ``plan`` (made from ``lock`` in the repo at ``root``) puts in the image."""
    want = Expected(site=plan.site_packages.strip("/"), env=dict(plan.config.env),
                    entrypoint=list(plan.config.entrypoint), labels=dict(plan.config.labels),
                    target=str(lock.target.get("arch", "")))
    for layer in plan.layers:
        part = layer.part or "frank"
        for w in layer.wheels:
            files = None
            path = _stored(store, w.sha256)
            if path is None:
                want.notes.append(f"{w.filename} is not in the store: its files are checked "
                                  "against the image's own RECORD only")
            else:
                from frank.audit.kept import wheel_record as kept_record

                files = kept_record(store, w.sha256, path, wheel_record)
            want.dists[canonicalize_name(w.name)] = WantDist(
                canonicalize_name(w.name), w.version, layer.part or "closure", files)
        for folder in layer.build_wheels:
            _repo_wheel(want, layer, root, folder)
        for gen in layer.generated if layer.stage is None else ():  # a stage's: its inputs
            want.files.append(WantFile(gen.dest.strip("/"), sha256_bytes(gen.text.encode()),
                                       part, "generated by frank"))
        for item in layer.fetched:
            want.files.append(WantFile(item.dest.strip("/"), item.sha256, part,
                                       f"fetched from {item.url}"))
        for step in layer.files if layer.stage is None else ():  # a stage's are its inputs
            _copied(want, layer, lock, root, step.src, step.dest)
        if layer.patch is not None:
            _patched(want, layer, plan, root, store)
        if layer.kernel is not None and layer.part is not None:
            from frank.model.kinds.kernel import kernel_dest

            # compiled on the host: the libraries are the build's; their archs are checked
            want.free.append((kernel_dest(layer.part).strip("/"), layer.part))
        if layer.aot is not None and layer.part is not None:
            # modules built on the host: their bytes are the build's; their archs are checked
            aot_dir = f"{want.site}/{layer.aot['dest']}"
            want.free.append((aot_dir, layer.part))
            want.archs.append(WantArchs(layer.part, tuple(layer.aot["archs"]), aot_dir))
        if layer.extension is not None and layer.part is not None:
            # a module built on the host: its bytes are the build's; its archs are checked
            from frank.model.kinds.extension import Extension, ext_suffix

            ext = Extension.model_validate(layer.extension)
            module = f"{want.site}/{ext.module}{ext_suffix(ext.python_headers)}"
            want.free.append((module, layer.part))
            want.archs.append(WantArchs(layer.part, tuple(ext.archs), module))
        if layer.stage is not None:
            for out in layer.stage.outputs:
                want.free.append((out.strip("/"), part))
            want.notes.append(f"{layer.name}: made by commands in a container; only its "
                              f"declared outputs ({', '.join(layer.stage.outputs)}) may change "
                              "files, their content is not predicted")
        elif layer.run or layer.pip_install:
            want.unpredicted = True
            want.notes.append(f"{layer.name}: runs commands in the image; the files they "
                              "write are not predicted (files no part declares are not "
                              "looked for)")
    for locked in lock.parts:
        spec = locked.spec
        for dist in spec.get("remove") or []:
            want.removed[canonicalize_name(dist)] = locked.name
        _step_removals(want, locked)
        if locked.kind == "package" and spec.get("distribution") and (
                spec.get("git") or spec.get("wheel")):
            name = canonicalize_name(spec["distribution"])
            want.dists.setdefault(name, WantDist(name, _wheel_version(spec) or "*",
                                                 locked.name))
        if locked.kind == "engine" and plan.engine is not None \
                and plan.engine.strategy in ("source", "precompiled"):
            want.dists.setdefault("vllm", WantDist("vllm", "*", locked.name))
        if locked.kind in ("binary", "kernel") and spec.get("archs"):
            from frank.model.kinds.kernel import kernel_dest

            dest = spec["dest"] if locked.kind == "binary" else kernel_dest(locked.name)
            want.archs.append(WantArchs(locked.name, tuple(spec["archs"]), dest.strip("/")))
    return want


def _wheel_version(spec: dict[str, object]) -> str | None:
    """The version a package part's pinned wheel file names (None for a git build)."""
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    from frank.model.pins import wheel_filename

    wheel = spec.get("wheel")
    if not isinstance(wheel, dict):
        return None
    name = str(wheel.get("filename") or wheel_filename(str(wheel.get("url", ""))))
    try:
        return str(parse_wheel_filename(name)[1])
    except InvalidWheelFilename:
        return None


def _stored(store: BlobStore, sha256: str) -> Path | None:
    digest = f"sha256:{sha256}"
    if not store.has(digest):
        return None
    try:
        return store.verified_path(digest)
    except FrankError:
        return None


def _repo_wheel(want: Expected, layer: PlanLayer, root: Path, folder: str) -> None:
    """A wheel frank builds from a repo package folder: its files are the folder's."""
    from frank.model.pyproject import read_project

    project = read_project(root / folder)
    files: dict[str, tuple[str, int | None]] = {
        rel: (sha256_file(path), path.stat().st_size) for rel, path in project.files}
    name = canonicalize_name(project.name)
    if layer.kernel is not None:  # built from the compiled tree, which adds libraries
        want.notes.append(f"{layer.name}: {project.name} is built from the kernel's compiled "
                          "tree; its compiled files are checked against its RECORD")
    want.dists[name] = WantDist(name, project.version, layer.part or "frank", files)


def _copied(want: Expected, layer: PlanLayer, lock: Lock, root: Path, src: str,
            dest: str) -> None:
    part = layer.part or "frank"
    locked = lock.part(part)
    inputs = locked.inputs if locked is not None else {}
    dest = dest.strip("/")
    if f"{src}/" in inputs or (root / src).is_dir():
        digest = inputs.get(f"{src}/") or inputs.get(src)
        if digest is None:
            from frank.hashing import sha256_tree

            digest = sha256_tree(root / src)
            want.notes.append(f"{layer.name}: {src}/ has no hash in the lock; held to the "
                              "folder as it is now")
        want.trees.append(WantTree(dest, digest, part, root / src))
        return
    digest = inputs.get(src) or sha256_file(root / src)
    want.files.append(WantFile(dest, digest, part, f"{layer.kind} file {src}"))


def _patched(want: Expected, layer: PlanLayer, plan: BuildPlan, root: Path,
             store: BlobStore) -> None:
    """Apply the patch again to the pinned engine wheel (or the official engine image's own
    files, read from its layers): the patched files' content."""
    from frank.assemble.patching import apply_to_wheel
    from frank.store.fetch import Fetcher, Pinned

    step = layer.patch
    assert step is not None
    fetcher = Fetcher(store)
    if "://" in step.source:
        text = fetcher.fetch(Pinned(step.source, step.sha256)).read_text(encoding="utf-8")
    else:
        text = (root / step.source).read_text(encoding="utf-8")
    from frank.audit.kept import keep_patch, kept_patch, patch_key

    key = patch_key(step.model_dump(mode="json"), text)
    kept = kept_patch(store, key) if step.engine_wheel is not None else None
    if kept is not None:  # the same patch applied to the same pinned wheel by the same code
        want.files += [WantFile(f"{want.site}/{rel}", sha, step.part, f"patched by {step.part}")
                       for rel, sha in kept["changed"]]
        want.files += [WantFile(path, sha, step.part, f"placed by {step.part}")
                       for path, sha in kept["placed"]]
        want.deleted += [(f"{want.site}/{rel}", step.part) for rel in kept["deleted"]]
        return
    with tempfile.TemporaryDirectory(prefix="frank-audit-patch-") as tmp:
        site = Path(tmp) / "site"
        if step.engine_wheel is None:
            from frank.assemble.base import patch_base_engine

            assert plan.base_python is not None and step.base_dist is not None
            result = patch_base_engine(
                text, step.base_dist, plan.base_python,
                root / "images" / f"{plan.base_image['name']}.toml", store, site,
                label=layer.name, log=Path(tmp) / "log", destinations=step.destinations,
                image_root=Path(tmp) / "image")
        else:
            wheel = fetcher.fetch(Pinned(step.engine_wheel.url, step.engine_wheel.sha256))
            result = apply_to_wheel(text, wheel, site, label=layer.name,
                                    log=Path(tmp) / "log", destinations=step.destinations,
                                    image_root=Path(tmp) / "image")
        changed = [(rel, sha256_file(site / rel)) for rel in result.changed]
        placed = [(path.lstrip("/"), sha256_file(Path(tmp) / "image" / path.lstrip("/")))
                  for path in result.placed]
    want.files += [WantFile(f"{want.site}/{rel}", sha, step.part, f"patched by {step.part}")
                   for rel, sha in changed]
    want.files += [WantFile(path, sha, step.part, f"placed by {step.part}")
                   for path, sha in placed]
    want.deleted += [(f"{want.site}/{rel}", step.part) for rel in result.deleted]
    if step.engine_wheel is not None:
        keep_patch(store, key, {"changed": changed, "placed": placed,
                                "deleted": list(result.deleted)})


def _step_removals(want: Expected, locked: LockedPart) -> None:
    """A step that removes a distribution's dist-info takes the distribution out: held to
    be absent, files and folders included, like a package part's ``remove``."""
    from frank.model.kinds.step import removed_distributions

    if locked.kind != "step":
        return
    for name in removed_distributions(locked.spec.get("removes") or []):
        want.removed[canonicalize_name(name)] = locked.name
        want.dists.pop(canonicalize_name(name), None)
