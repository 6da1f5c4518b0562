"""Base images: ``images/*.toml`` files naming a base pinned by content.

A base named in ``images/`` is one of:

- a reference pinned by digest (``oci:DIR@sha256:...`` for a local layout,
  ``host/repo[:tag]@sha256:...`` for a registry; a tag alone is refused, since a tag can
  move under a lock);
- ``[debs]``: Debian packages pinned by version and sha256 in ``<name>.debs.lock``, merged
  by frank without running a maintainer script (``frank.assemble.debs``); the same lock gives
  the same digest on any machine. The test base and the served base are made this way;

``[debootstrap]`` bases are gone: their rootfs is not byte-reproducible (package scripts
write timestamps, random machine ids, ldconfig caches), so two machines got two digests from
one definition. A file that still has one is refused with a line saying what to write.

Made bases are recorded in ``<cache>/bases/<key>.json`` (``frank.assemble.baselayout``); every
later call returns that layout and digest instantly. The file's model is frank.model.imagefile.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from frank.assemble.baselayout import BaseImage
from frank.model.imagefile import load_image_file, parse_pinned_ref
from frank.store.blobs import BlobStore

if TYPE_CHECKING:
    from frank.assemble.patching import PatchResult
    from frank.image.inventory import BaseDist, Inventory

BASE_FORMAT = "frank-base-1"


def resolve_base(path: Path, store: BlobStore, *, quiet: bool = False) -> BaseImage:
    """The local layout and pinned digest for ``images/<name>.toml``."""
    img = load_image_file(path)
    if img.debs is not None:
        from frank.assemble.debs.build import debs_base

        return debs_base(img.debs, path, store, name=img.name, quiet=quiet)
    assert img.ref is not None
    from frank.image.inventory import pinned_layout

    _, digest = parse_pinned_ref(img.ref, file=path)
    layout, image_digest = pinned_layout(path, store)
    return BaseImage(name=img.name, layout=layout, digest=image_digest,
                     pinned=None if image_digest == digest else digest)


def plan_inventory(base_python: dict[str, str], definition: Path, store: BlobStore
                   ) -> tuple[Path, str, Inventory]:
    """(layout, manifest digest, inventory) of the official engine image a plan sits on,
    the inventory held to the sha256 its lock recorded (kept one or read again)."""
    from frank.errors import FrankError
    from frank.image.inventory import base_inventory, pinned_layout

    layout, image = pinned_layout(definition, store)
    inventory = base_inventory(layout, image, store)
    if inventory.image != base_python["image"] or inventory.sha256 != base_python["inventory"]:
        raise FrankError(f"the base image's Python distributions (inventory sha256 "
                         f"{inventory.sha256[:16]}, image {inventory.image}) are not those the "
                         f"lock read (sha256 {base_python['inventory'][:16]}); run `frank lock`",
                         file=definition)
    return layout, image, inventory


def patch_base_engine(patch_text: str, dist: str, base_python: dict[str, str],
                      definition: Path, store: BlobStore, site_root: Path, *, label: str,
                      log: Path, destinations: dict[str, str] | None = None,
                      image_root: Path | None = None) -> PatchResult:
    """Apply a Python-only patch to the official engine image's own ``dist`` files, read
    from its layers; the changed files land under ``site_root``."""
    from frank.assemble.patching import apply_to_files
    from frank.errors import FrankError
    from frank.image.inventory import read_files

    layout, image, inventory = plan_inventory(base_python, definition, store)
    engine = inventory.get(dist)
    if engine is None:
        raise FrankError(f"the engine image holds no {dist} distribution to patch",
                         file=definition, field=label)
    packages = {f.split("/", 1)[0] for f in engine.files if "/" in f
                and not f.split("/", 1)[0].endswith((".dist-info", ".data"))
                and not f.startswith("..")}

    def originals(paths: list[str]) -> dict[str, bytes]:
        got = read_files(layout, image, {f"{engine.site}/{p}" for p in paths})
        return {p[len(engine.site) + 1:]: data for p, data in got.items()}

    return apply_to_files(patch_text, packages, originals, site_root, label=label, log=log,
                          what=f"the engine image's {dist} {engine.version}",
                          destinations=destinations, image_root=image_root)


def whiteouts(inventory: Inventory, names: list[str], staging: Path) -> list[str]:
    """OCI whiteouts in ``staging`` (a layer's tree) of every path the base's distributions
    ``names`` installed and of their dist-info folders, except a path the layer itself
    writes (a newer version of the same file); a folder only they installed into goes whole
    (``_own_folders``); returns the image paths whited out."""
    from frank.errors import FrankError

    out = []
    for name in names:
        dist = inventory.get(name)
        if dist is None:
            raise FrankError(f"the base image holds no {name} to take out")
        gone = {dist.info, *_own_folders(inventory, dist, set(names), staging)}
        for path in [*sorted(gone), *(p for p in dist.image_paths() if p not in gone)]:
            here = staging / path
            if here.exists() or here.is_symlink():
                continue
            if path not in gone and any(parent in gone or (staging / parent).is_file()
                                        for parent in _parents(path)):
                continue
            marker = here.parent / f".wh.{here.name}"
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_bytes(b"")
            out.append(path)
    return out


def _own_folders(inventory: Inventory, dist: BaseDist, removed: set[str],
                 staging: Path) -> set[str]:
    """The topmost folders below ``dist``'s site folder that hold its files and nothing of
    a distribution that stays, and that the layer writes nothing into: whited out whole, as
    pip uninstall removes them. Whiting out only the files left them behind empty, and an
    empty package folder still imports (a namespace package: issue 54)."""
    from packaging.utils import canonicalize_name

    keep: set[str] = set()  # every path, and folder holding one, of a distribution that stays
    drop = {str(canonicalize_name(n)) for n in removed}
    for other in inventory.dists:
        if other.name not in drop:
            for path in other.image_paths():
                keep.add(path)
                keep.update(_parents(path))
    prefix = dist.site + "/"
    folders = {parent for path in dist.image_paths() if path != dist.info
               for parent in _parents(path)
               if parent.startswith(prefix) and not parent.startswith(dist.info + "/")
               and parent != dist.info and parent not in keep
               and not (staging / parent).exists()}
    return {f for f in folders if not any(p in folders for p in _parents(f))}


def _parents(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]
