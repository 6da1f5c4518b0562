"""Warm caches in a registry: pushed as referrers of the pushed image, pulled by digest.

Why referrers: a registry then lists an image's warm caches with the image (``GET
/v2/<name>/referrers/<digest>``, or the referrers tag ``sha256-<hex>`` where the registry
has no such API, as ``frank.ship.attest.remote`` keeps it), and a deployment pulls the one
for its device by digest. The pushed image may be the layout's compressed form (another
manifest digest), so the artifact pushed names that form as its ``subject``; its
annotations still name the layout's digest, which is what ``frank run`` matches.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any

from frank.errors import FrankError
from frank.fsutil import write_atomic
from frank.image.oci import OCI_INDEX, OCI_MANIFEST, canonical_json
from frank.run import warmcache
from frank.run.device import Device
from frank.ship import warmsign
from frank.ship.attest.remote import Registry, fallback_tag, split_ref
from frank.store.blobs import BlobStore, sha256_bytes


@dataclass(frozen=True)
class PushedWarm:
    """One warm artifact as pushed: its digest there, its device, how it is listed."""

    digest: str
    device: str
    made_on: str
    scheme: str
    layer: str = ""
    identity: str = ""  # the device identity, canonical JSON


def about(artifact: warmcache.Artifact, subject: dict[str, Any],
          envelope: bytes | None = None) -> tuple[str, bytes]:
    """The artifact's manifest with ``subject`` as its subject (and its signature's
    envelope as an annotation, ``frank.ship.warmsign``): (digest, bytes)."""
    doc = artifact.doc
    if envelope is not None:
        doc["annotations"][warmsign.ANNOTATION] = warmsign.annotation(envelope)
    doc["subject"] = {"mediaType": subject["mediaType"], "digest": subject["digest"],
                      "size": subject["size"]}
    raw = canonical_json(doc)
    return sha256_bytes(raw), raw


def descriptor(digest: str, raw: bytes, artifact: warmcache.Artifact) -> dict[str, Any]:
    """How a referrers list names it (annotations copied, so a reader filters by device)."""
    ann = json.loads(raw)["annotations"]
    return {"mediaType": OCI_MANIFEST, "digest": digest, "size": len(raw),
            "artifactType": warmcache.ARTIFACT_TYPE,
            "annotations": {k: ann[k] for k in (warmcache.IMAGE_ANNOTATION,
                                                warmcache.DEVICE_KEY_ANNOTATION,
                                                warmcache.MADE_ON_ANNOTATION) if k in ann}}


def push(store: BlobStore, repository: str, image: str, subject: dict[str, Any]
         ) -> list[PushedWarm]:
    """Push every warm artifact of layout digest ``image`` in the store to ``repository``
    as referrers of ``subject`` (the pushed manifest's descriptor)."""
    artifacts = []
    for digest in warmcache.listed(store.root, image).values():
        artifact = warmcache.read(store, digest)
        warmcache.check(artifact, image, artifact.device)
        artifacts.append(artifact)
    if not artifacts:
        return []
    host, name, _ = split_ref(repository)
    reg = Registry(host)
    pushed: list[tuple[str, bytes, warmcache.Artifact]] = []
    api = True
    for artifact in artifacts:
        digest, raw = about(artifact, subject, warmsign.envelope_of(store.root, artifact))
        reg.put_blob(name, warmcache.EMPTY_BLOB)
        reg.put_blob(name, store.verified_path(artifact.layer).read_bytes())
        headers = reg.put_manifest(name, digest, raw, OCI_MANIFEST)
        api = api and headers.get("oci-subject") == subject["digest"]
        pushed.append((digest, raw, artifact))
    scheme = "api"
    if not api:
        scheme = "tag"
        tag = fallback_tag(subject["digest"])
        index: dict[str, Any] = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []}
        old = reg.get_manifest(name, tag)
        if old is not None:
            with contextlib.suppress(ValueError):
                index = json.loads(old)
        keys = {a.device.key for _, _, a in pushed}
        kept = [d for d in index.get("manifests") or [] if isinstance(d, dict) and not (
            d.get("artifactType") == warmcache.ARTIFACT_TYPE and (d.get("annotations") or {})
            .get(warmcache.DEVICE_KEY_ANNOTATION) in keys)]
        index["manifests"] = kept + [descriptor(d, r, a) for d, r, a in pushed]
        reg.put_manifest(name, tag, canonical_json(index), OCI_INDEX)
    return [PushedWarm(d, a.device.key, a.made_on, scheme, a.layer, a.device.canonical())
            for d, _, a in pushed]


def listed(repository: str, subject: str) -> list[dict[str, Any]]:
    """The warm artifacts listed as referrers of ``subject`` in ``repository``."""
    host, name, _ = split_ref(repository)
    reg = Registry(host)
    found = reg.referrers_api(name, subject)
    if found is None:
        raw = reg.get_manifest(name, fallback_tag(subject))
        found = []
        if raw is not None:
            with contextlib.suppress(ValueError, AttributeError):
                found = [d for d in json.loads(raw).get("manifests") or []
                         if isinstance(d, dict)]
    return [d for d in found if d.get("artifactType") == warmcache.ARTIFACT_TYPE]


def pull(store: BlobStore, repository: str, subject: str, image: str, device: Device
         ) -> warmcache.Artifact | None:
    """The warm artifact for ``image`` on ``device`` among the referrers of ``subject``,
    fetched into the store by digest and named in its warm index (None: the registry has
    none for this device). Every byte is checked against its digest; a mismatch is a
    FrankError (one line) and nothing is recorded."""
    host, name, _ = split_ref(repository)
    reg = Registry(host)
    for desc in listed(repository, subject):
        if (desc.get("annotations") or {}).get(warmcache.DEVICE_KEY_ANNOTATION) != device.key:
            continue
        digest = str(desc.get("digest"))
        raw = reg.get_manifest(name, digest)
        if raw is None:
            continue
        artifact = warmcache.parse(digest, raw)
        warmcache.check(artifact, image, device)
        data = reg.get_blob(name, artifact.layer)
        store.put_bytes(data)
        store.put_bytes(warmcache.EMPTY_BLOB)
        store.put_bytes(raw)
        envelope = _envelope(raw)
        if envelope is not None:  # checked where it is used (`frank run`), not here
            write_atomic(warmsign.signature_path(store.root, artifact), envelope)
        warmcache.record(store.root, artifact)
        return artifact
    return None


def pulled(store: BlobStore, pushes: list[tuple[str, str]], image: str, device: Device
           ) -> tuple[warmcache.Artifact | None, str]:
    """Try each (repository, pushed digest) the image went to; (artifact, where or why)."""
    why = ""
    for repository, digest in pushes:
        try:
            found = pull(store, repository, digest, image, device)
        except FrankError as exc:
            why = f"{repository}: {exc.message}"
            continue
        if found is not None:
            return found, f"pulled from {repository}"
    return None, why


@dataclass(frozen=True)
class CheckedWarm:
    """A pushed warm cache ``frank verify`` checked."""

    digest: str
    made_on: str
    layer: str
    layer_size: int


def _envelope(raw: bytes) -> bytes | None:
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        text = (json.loads(raw).get("annotations") or {}).get(warmsign.ANNOTATION)
        return warmsign.from_annotation(text) if isinstance(text, str) else None
    return None


def verify(repository: str, subject: str, image: str, public_key: Any = None,
           key_name: str = "") -> list[CheckedWarm]:
    """Every warm cache listed as a referrer of ``subject``: its manifest and layer read by
    digest and hashed, its layer a zstd tar that unpacks inside its folder, its annotations
    naming layout digest ``image``, and, given the image's ``public_key``, its signature
    (``frank.ship.warmsign``) holding for it. The first that does not hold is a
    ``VerifyFailed`` (one line, exit 1)."""
    import tempfile
    from pathlib import Path

    from frank.ship.attest import VerifyFailed

    host, name, _ = split_ref(repository)
    reg = Registry(host)
    out = []
    for desc in listed(repository, subject):
        digest = str(desc.get("digest"))
        try:
            raw = reg.get_manifest(name, digest)
            if raw is None:
                raise FrankError(f"warm cache {digest} is listed but not in the registry")
            artifact = warmcache.parse(digest, raw)
            if artifact.image != image:
                raise FrankError(f"warm cache {digest} is for image {artifact.image}, not "
                                 f"{image}")
            with tempfile.TemporaryDirectory(prefix="frank-verify-warm-") as tmp:
                store = BlobStore(Path(tmp) / "store")
                store.put_bytes(reg.get_blob(name, artifact.layer))
                warmcache.unpack(store, artifact, Path(tmp) / "tree")
            if public_key is not None:
                warmsign.check_envelope(_envelope(raw), artifact, public_key, key_name)
        except FrankError as exc:
            raise VerifyFailed(exc.message) from None
        out.append(CheckedWarm(digest, artifact.made_on, artifact.layer, artifact.layer_size))
    return out
