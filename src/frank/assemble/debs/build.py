"""A ``[debs]`` base from its lock: fetch the pinned .debs, merge them, cache the layout.

The cache key is the locked packages (name, version, sha256 ...) and the format of the
merge, not the lock file's bytes: re-resolving to the same closure reuses the base. Nothing
here reads an index or a host path that could differ between machines, so two builds from
scratch in separate caches give the same manifest digest.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from frank.assemble.baselayout import BaseImage, cached_base, layout_from_layer
from frank.image.layer import LAYER_FORMAT
from frank.image.oci import canonical_json
from frank.image.progress import status
from frank.model.imagefile import DebsSource
from frank.resolve.debs.lock import DebsLock, current_lock
from frank.resolve.debs.resolver import archive_roots
from frank.store.blobs import BlobStore
from frank.store.fetch import Fetcher, Pinned

# Bump when the same lock would give different layer bytes.
DEBS_BASE_FORMAT = "frank-debs-base-1"
EPOCH = 0
# Debian architecture -> OCI (Go) architecture, for the image config.
OCI_ARCH = {"amd64": "amd64", "arm64": "arm64", "armhf": "arm", "i386": "386",
            "ppc64el": "ppc64le", "s390x": "s390x", "riscv64": "riscv64"}


def base_key(lock: DebsLock) -> str:
    """What decides the base's bytes: the pinned packages, the arch and the merge format."""
    doc = {"format": DEBS_BASE_FORMAT, "layer_format": LAYER_FORMAT, "epoch": EPOCH,
           "arch": lock.recipe["arch"],
           "packages": [p.model_dump(mode="json") for p in lock.packages]}
    return hashlib.sha256(canonical_json(doc)).hexdigest()


def pinned_debs(lock: DebsLock, roots: dict[str, str]) -> list[Pinned]:
    """Each locked .deb at this machine's archive URL (any mirror: the sha256 is the check)."""
    return [Pinned(f"{roots[p.archive]}/{p.filename}", p.sha256, p.size) for p in lock.packages]


def build_from_lock(lock: DebsLock, roots: dict[str, str], store: BlobStore, layout: Path, *,
                    mirrors: Iterable[Path] = (), quiet: bool = True) -> str:
    """Fetch, verify and merge the locked .debs into a one-layer layout; its digest."""
    from rich.console import Console

    console = Console(stderr=True, quiet=quiet)
    from frank.assemble.debs.rootfs import write_root

    # every .deb re-hashed, not trusted by its stat stamp: a base is made rarely, and a
    # corrupt one would fail deep in the unpacking (or worse, not fail); moved aside, fetched
    fetcher = Fetcher(BlobStore(store.root, full_verify=True), mirrors)
    with status(console, f"fetching {len(lock.packages)} pinned .debs"):
        paths = fetcher.fetch_all(pinned_debs(lock, roots))
    with status(console, "unpacking them into the base layer"), store.writer() as w:
        write_root([(p, paths[p.sha256]) for p in lock.packages], w,  # type: ignore[arg-type]
                   epoch=EPOCH, tmp_dir=store.tmp_dir)
    return layout_from_layer(store, layout, w.digest, w.size, epoch=EPOCH,
                             **base_meta(lock))


def base_meta(lock: DebsLock) -> dict[str, Any]:
    """The base's config fields besides its layer (``baselayout.base_documents``)."""
    arch = lock.recipe["arch"]
    shell = ("/bin/sh",) if any(p.name == "dash" for p in lock.packages) else ()
    return {"architecture": OCI_ARCH.get(arch, arch), "cmd": shell,
            "created_by": f"frank: {len(lock.packages)} pinned Debian packages "
                          f"({lock.recipe['suite']}, {arch})"}


def debs_base(src: DebsSource, image_file: Path, store: BlobStore, *, name: str,
              mirrors: Iterable[Path] = (), quiet: bool = False) -> BaseImage:
    """The base of ``images/<name>.toml``'s ``[debs]``: built once per cache from its lock."""
    lock, _ = current_lock(src, image_file)
    return cached_base(store, base_key(lock), name, lambda layout: build_from_lock(
        lock, archive_roots(src), store, layout, mirrors=mirrors, quiet=quiet),
        check=lambda layout: holds_packages(layout, lock))


def holds_packages(layout: Path, lock: DebsLock) -> bool:
    """Whether the base's layer lists exactly the locked packages in dpkg's status: a
    cached base is checked against what its key stands for, not only its own record."""
    import tarfile

    from frank.image.oci import layout_blob_path, resolve_manifest

    _, _, manifest = resolve_manifest(layout)
    want = {(p.name, p.version, p.arch) for p in lock.packages}
    for desc in manifest["layers"]:
        with tarfile.open(layout_blob_path(layout, desc["digest"])) as tar:
            for member in tar:
                if member.name.removeprefix("./") == "var/lib/dpkg/status" and member.isfile():
                    handle = tar.extractfile(member)
                    text = handle.read().decode("utf-8", "replace") if handle else ""
                    return _status_packages(text) == want
    return False


def _status_packages(text: str) -> set[tuple[str, str, str]]:
    found = set()
    for stanza in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines()
                      if ": " in line and not line.startswith(" "))
        if "Package" in fields:
            found.add((fields["Package"], fields.get("Version", ""),
                       fields.get("Architecture", "")))
    return found
