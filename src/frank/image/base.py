"""Base images: ``images/*.toml`` files naming a base pinned by content.

A base named in ``images/`` is one of:

- a reference pinned by digest (``oci:DIR@sha256:...`` for a local layout,
  ``host/repo[:tag]@sha256:...`` for a registry; a tag alone is refused, since a tag can
  move under a lock);
- ``[debs]``: Debian packages pinned by version and sha256 in ``<name>.debs.lock``, merged
  by frank without running a maintainer script (``frank.image.debs``); the same lock gives
  the same digest on any machine. The test base and the served base are made this way;

``[debootstrap]`` bases are gone: their rootfs is not byte-reproducible (package scripts
write timestamps, random machine ids, ldconfig caches), so two machines got two digests from
one definition. A file that still has one is refused with a line saying what to write.

Made bases are recorded in ``<cache>/bases/<key>.json`` (``cached_base``); every later
call returns that layout and digest instantly.
"""

from __future__ import annotations

import contextlib
import fcntl
import re
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from frank.errors import FrankError
from frank.fsutil import write_atomic
from frank.image.debs.lock import DebsSource
from frank.image.store import DIGEST_RE, BlobStore
from frank.tomlio import read_text

BASE_FORMAT = "frank-base-1"
DEBOOTSTRAP_GONE = ("debootstrap bases are no longer made (two machines got two digests); "
                    "pin the packages instead: write [debs] and run `frank debs lock`")
_REF_RE = re.compile(
    r"^(?P<name>[a-z0-9][a-z0-9._/:-]*?)(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
    r"(?:@(?P<digest>sha256:[0-9a-f]{64}))?$"
)
# Left out of the test base: caches and docs a container never needs (as Debian's slim images).
ROOTFS_PRUNE = (
    "var/cache/apt", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/info",
    "usr/share/locale", "var/log",
)
ROOTFS_SKIP = ("dev", "proc", "sys", "run", "tmp", *ROOTFS_PRUNE)


class BaseImageFile(BaseModel):
    """One ``images/<name>.toml``: a base pinned by digest or by pinned .debs."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    ref: str | None = None
    debs: DebsSource | None = None

    @model_validator(mode="after")
    def _one_source(self) -> BaseImageFile:
        if (self.ref is None) == (self.debs is None):
            raise ValueError("give exactly one of 'ref' or '[debs]'")
        return self


class BaseImage(BaseModel):
    """A resolved base: a local OCI layout and the manifest digest it is pinned to."""

    model_config = ConfigDict(extra="forbid")

    name: str
    layout: Path
    digest: str  # the image manifest's digest (what ImageSpec.base_digest takes)
    pinned: str | None = None  # the image index's digest when the pin names an index


def parse_pinned_ref(ref: str, *, file: Path | str | None = None) -> tuple[str, str]:
    """Split ``name[:tag]@sha256:...`` into (name, digest); a tag-only ref is an error."""
    if ref.startswith("oci:"):
        body, sep, digest = ref[4:].rpartition("@")
        if not sep or not DIGEST_RE.match(digest):
            raise FrankError(f"base image {ref!r} is not pinned by digest; "
                             "write oci:DIR@sha256:<64 hex>", file=file, field="ref")
        return "oci:" + body, digest
    m = _REF_RE.match(ref)
    if not m:
        raise FrankError(f"not an image reference: {ref!r}", file=file, field="ref")
    if not m.group("digest"):
        raise FrankError(f"base image {ref!r} is named by tag only; pin it by digest "
                         "(name@sha256:<64 hex>)", file=file, field="ref")
    return m.group("name"), m.group("digest")


def load_image_file(path: Path) -> BaseImageFile:
    """Parse and validate ``images/<name>.toml``; any problem is one line naming the file."""
    text = read_text(Path(path), missing="image file not found")
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise FrankError(f"invalid TOML: {exc}", file=path) from None
    if "debootstrap" in raw:
        raise FrankError(DEBOOTSTRAP_GONE, file=path, field="debootstrap")
    try:
        img = BaseImageFile.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"]) or None
        raise FrankError(err["msg"], file=path, field=loc) from None
    if img.ref is not None:
        parse_pinned_ref(img.ref, file=path)
    return img


def apt_mirror(*, security: bool = False, suite: str = "bookworm") -> str:
    """The Debian mirror apt is configured with here (deb822 or one-line sources).

    ``security``: the mirror of ``<suite>-security`` (Debian keeps it apart) instead.
    """
    default = "http://deb.debian.org/debian" + ("-security" if security else "")
    for f in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        for stanza in f.read_text().split("\n\n"):
            is_security = "debian-security" in stanza or bool(
                re.search(r"^Suites:.*-security\b", stanza, re.M))
            if is_security != security:
                continue
            if re.search(rf"^Suites:.*\b{re.escape(suite)}\b", stanza, re.M):
                m = re.search(r"^URIs:\s*(\S+)", stanza, re.M)
                if m:
                    return m.group(1)
    lst = Path("/etc/apt/sources.list")
    if lst.is_file():
        for line in lst.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[0] == "deb" and parts[2].startswith(suite) and \
                    ("security" in parts[2]) == security:
                return parts[1]
    return default


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    """One builder per base at a time (parallel test workers would build it twice)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# frank.image.layer and frank.image.oci are imported where a base is made: reading an
# images/*.toml (every read command on a stack does) needs neither.


def layout_from_rootfs(rootfs: Path, store: BlobStore, out: Path, *, epoch: int,
                       created_by: str) -> str:
    """Import a root filesystem as a one-layer OCI layout (owners and setuid kept)."""
    from frank.image.layer import collect, write_tar

    members = collect([(rootfs, "/")], preserve_owner=True, skip=ROOTFS_SKIP)
    with store.writer() as w:
        write_tar(members, epoch, w)  # type: ignore[arg-type]
    return layout_from_layer(store, out, w.digest, w.size, epoch=epoch, created_by=created_by)


def layout_from_layer(store: BlobStore, out: Path, layer: str, size: int, *, epoch: int,
                      created_by: str, architecture: str | None = None,
                      cmd: tuple[str, ...] = ("/bin/bash",)) -> str:
    """A one-layer OCI layout around an uncompressed layer blob already in the store."""
    from frank.image.layer import LAYER_MEDIA_TYPE
    from frank.image.oci import (
        OCI_CONFIG,
        OCI_INDEX,
        OCI_MANIFEST,
        _go_arch,
        canonical_json,
        epoch_to_rfc3339,
        write_layout,
    )

    created = epoch_to_rfc3339(epoch)
    config = {
        "architecture": architecture or _go_arch(), "os": "linux", "created": created,
        "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                   **({"Cmd": list(cmd)} if cmd else {})},
        "rootfs": {"type": "layers", "diff_ids": [layer]},
        "history": [{"created": created, "created_by": created_by}],
    }
    config_raw = canonical_json(config)
    config_digest = store.put_bytes(config_raw)
    manifest = {
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": config_digest, "size": len(config_raw)},
        "layers": [{"mediaType": LAYER_MEDIA_TYPE, "digest": layer, "size": size}],
    }
    manifest_raw = canonical_json(manifest)
    digest = store.put_bytes(manifest_raw)
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
        {"mediaType": OCI_MANIFEST, "digest": digest, "size": len(manifest_raw)}]}
    write_layout(store, out, canonical_json(index), [config_digest, digest, layer],
                 epoch=epoch)
    return digest


def cached_base(store: BlobStore, key: str, name: str,
                make: Callable[[Path], str]) -> BaseImage:
    """The base recorded under ``<cache>/bases/<key>.json``, else ``make(layout)``'s, recorded.

    One maker per key at a time (parallel test workers would otherwise build it twice).
    """
    from frank.image.oci import layout_manifests

    bases = store.root / "bases"
    record = bases / f"{key}.json"
    layout = bases / key
    with _lock(bases / f"{key}.lock"):
        if record.is_file():
            with contextlib.suppress(ValueError, ValidationError, FrankError, KeyError, OSError):
                base = BaseImage.model_validate_json(record.read_text())
                if layout_manifests(base.layout)[0]["digest"] == base.digest:
                    return base
        base = BaseImage(name=name, layout=layout, digest=make(layout))
        write_atomic(record, base.model_dump_json())
        return base


def resolve_base(path: Path, store: BlobStore, *, quiet: bool = False) -> BaseImage:
    """The local layout and pinned digest for ``images/<name>.toml``."""
    img = load_image_file(path)
    if img.debs is not None:
        from frank.image.debs.build import debs_base

        return debs_base(img.debs, path, store, name=img.name, quiet=quiet)
    assert img.ref is not None
    name, digest = parse_pinned_ref(img.ref, file=path)
    if name.startswith("oci:"):
        layout = Path(name[4:])
        if not layout.is_absolute():
            layout = (Path(path).parent / layout).resolve()
        return BaseImage(name=img.name, layout=layout, digest=digest)
    from frank.image.registry import pull_pinned

    layout, image_digest = pull_pinned(name, digest, store.root / "bases" / digest.split(":")[1])
    return BaseImage(name=img.name, layout=layout, digest=image_digest,
                     pinned=None if image_digest == digest else digest)
