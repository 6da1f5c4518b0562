"""Base images: ``images/*.toml`` files naming a base pinned by content.

A base named in ``images/`` is one of:

- a reference pinned by digest (``oci:DIR@sha256:...`` for a local layout,
  ``host/repo[:tag]@sha256:...`` for a registry; a tag alone is refused, since a tag can
  move under a lock);
- ``[debs]``: Debian packages pinned by version and sha256 in ``<name>.debs.lock``, merged
  by frank without running a maintainer script (``frank.build.debs``); the same lock gives
  the same digest on any machine. The test base and the served base are made this way;

``[debootstrap]`` bases are gone: their rootfs is not byte-reproducible (package scripts
write timestamps, random machine ids, ldconfig caches), so two machines got two digests from
one definition. A file that still has one is refused with a line saying what to write.

Made bases are recorded in ``<cache>/bases/<key>.json`` (``frank.build.baselayout``); every
later call returns that layout and digest instantly. The file's model is frank.model.imagefile.
"""

from __future__ import annotations

from pathlib import Path

from frank.build.baselayout import BaseImage
from frank.model.imagefile import load_image_file, parse_pinned_ref
from frank.store.blobs import BlobStore

BASE_FORMAT = "frank-base-1"


def resolve_base(path: Path, store: BlobStore, *, quiet: bool = False) -> BaseImage:
    """The local layout and pinned digest for ``images/<name>.toml``."""
    img = load_image_file(path)
    if img.debs is not None:
        from frank.build.debs.build import debs_base

        return debs_base(img.debs, path, store, name=img.name, quiet=quiet)
    assert img.ref is not None
    name, digest = parse_pinned_ref(img.ref, file=path)
    if name.startswith("oci:"):
        layout = Path(name[4:])
        if not layout.is_absolute():
            layout = (Path(path).parent / layout).resolve()
        return BaseImage(name=img.name, layout=layout, digest=digest)
    from frank.image.remote import pull_pinned

    layout, image_digest = pull_pinned(name, digest, store.root / "bases" / digest.split(":")[1])
    return BaseImage(name=img.name, layout=layout, digest=image_digest,
                     pinned=None if image_digest == digest else digest)
