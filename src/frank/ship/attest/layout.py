"""Attestations attached to an OCI layout as referrers (OCI image-spec 1.1 ``subject``).

Each signed Statement becomes one artifact manifest::

    {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
     "artifactType": "application/vnd.dsse.envelope.v1+json",
     "config": <the empty descriptor, application/vnd.oci.empty.v1+json, "{}">,
     "layers": [<the DSSE envelope, application/vnd.dsse.envelope.v1+json>],
     "subject": <the image manifest's descriptor>,
     "annotations": {"in-toto.io/predicate-type": "https://slsa.dev/provenance/v1", ...}}

listed in the layout's ``index.json`` after the image (with its ``artifactType`` and
annotations, as a registry's referrers list shows it). The image manifest, its config and
its layers are not touched: its digest is the same before and after.
"""

from __future__ import annotations

import base64
import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frank.errors import FrankError
from frank.fsutil import write_atomic
from frank.image.oci import (
    OCI_INDEX,
    OCI_MANIFEST,
    canonical_json,
    layout_blob_path,
    layout_manifests,
    read_layout_blob,
    resolve_manifest,
)
from frank.ship.attest.dsse import ENVELOPE_MEDIA_TYPE
from frank.store.blobs import sha256_bytes

ARTIFACT_TYPE = ENVELOPE_MEDIA_TYPE
EMPTY_MEDIA_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY_BLOB = b"{}"
EMPTY_DESCRIPTOR = {"mediaType": EMPTY_MEDIA_TYPE, "digest": sha256_bytes(EMPTY_BLOB),
                    "size": len(EMPTY_BLOB), "data": base64.b64encode(EMPTY_BLOB).decode()}
PREDICATE_ANNOTATION = "in-toto.io/predicate-type"
CREATED_ANNOTATION = "org.opencontainers.image.created"
# Which key signed (``sha256:<hex of its DER>``): not signed itself, only used to say
# "signed by another key" rather than "changed after signing" once a signature failed.
KEY_ANNOTATION = "dev.frank.attest.key"


@dataclass(frozen=True)
class Referrer:
    """One attestation artifact: its manifest (digest, bytes) and the envelope it carries."""

    digest: str
    manifest: bytes
    predicate_type: str
    envelope: bytes
    envelope_digest: str
    key: str = ""

    def descriptor(self) -> dict[str, Any]:
        """As a referrers list (or the layout's index.json) names it."""
        return {"mediaType": OCI_MANIFEST, "digest": self.digest, "size": len(self.manifest),
                "artifactType": ARTIFACT_TYPE,
                "annotations": {PREDICATE_ANNOTATION: self.predicate_type}}


def artifact(subject: dict[str, Any], predicate_type: str, envelope: bytes,
             created: str, key: str = "") -> Referrer:
    """The artifact manifest carrying ``envelope`` that refers to ``subject``."""
    env_digest = sha256_bytes(envelope)
    manifest = canonical_json({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": ARTIFACT_TYPE,
        "config": EMPTY_DESCRIPTOR,
        "layers": [{"mediaType": ENVELOPE_MEDIA_TYPE, "digest": env_digest,
                    "size": len(envelope)}],
        "subject": {"mediaType": subject["mediaType"], "digest": subject["digest"],
                    "size": subject["size"]},
        "annotations": {PREDICATE_ANNOTATION: predicate_type, CREATED_ANNOTATION: created,
                        **({KEY_ANNOTATION: key} if key else {})},
    })
    return Referrer(sha256_bytes(manifest), manifest, predicate_type, envelope, env_digest,
                    key)


def about(ref: Referrer, subject: dict[str, Any]) -> Referrer:
    """The same attestation (same signed envelope) as an artifact referring to ``subject``:
    how the attestations of a layout follow its compressed form to a registry."""
    doc = json.loads(ref.manifest)
    doc["subject"] = {"mediaType": subject["mediaType"], "digest": subject["digest"],
                      "size": subject["size"]}
    manifest = canonical_json(doc)
    return Referrer(sha256_bytes(manifest), manifest, ref.predicate_type, ref.envelope,
                    ref.envelope_digest, ref.key)


def parse_artifact(digest: str, manifest: bytes, fetch: Any) -> Referrer | None:
    """A referrer from its manifest bytes (``fetch(digest)`` reads its envelope), or None
    when the manifest is not one of these attestations."""
    try:
        doc = json.loads(manifest)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("artifactType") != ARTIFACT_TYPE:
        return None
    layers = [x for x in doc.get("layers") or [] if isinstance(x, dict)
              and x.get("mediaType") == ENVELOPE_MEDIA_TYPE]
    if len(layers) != 1:
        return None
    env_digest = str(layers[0].get("digest"))
    envelope: bytes = fetch(env_digest)
    if sha256_bytes(envelope) != env_digest:
        raise FrankError(f"referrer {digest}: its envelope does not match its digest "
                         f"{env_digest}")
    notes = doc.get("annotations") or {}
    return Referrer(digest, manifest, str(notes.get(PREDICATE_ANNOTATION, "")), envelope,
                    env_digest, str(notes.get(KEY_ANNOTATION, "")))


def subject_of(manifest: bytes) -> str | None:
    """The ``subject`` digest an artifact manifest names."""
    try:
        doc = json.loads(manifest)
        return str(doc["subject"]["digest"])
    except (ValueError, KeyError, TypeError):
        return None


def image_descriptor(layout: Path) -> dict[str, Any]:
    """The image's descriptor in index.json (the first entry, as compose writes it)."""
    digest, raw, _ = resolve_manifest(layout)
    for d in layout_manifests(layout):
        if isinstance(d, dict) and d.get("digest") == digest:
            return dict(d)
    return {"mediaType": OCI_MANIFEST, "digest": digest, "size": len(raw)}


def _write_blob(layout: Path, data: bytes) -> None:
    path = layout_blob_path(layout, sha256_bytes(data))
    if path.is_file() and sha256_bytes(path.read_bytes()) == sha256_bytes(data):
        return
    write_atomic(path, data)


def attach(layout: Path, referrers: list[Referrer]) -> None:
    """Add ``referrers`` to the layout; earlier ones of the same predicate types about the
    same subject are replaced (their blobs removed). The image itself is not touched."""
    layout = Path(layout)
    image = image_descriptor(layout)
    old = read_referrers(layout, image["digest"])
    replaced = {r.predicate_type for r in referrers}
    drop = {r.digest for r in old if r.predicate_type in replaced}
    keep_blobs = {b for r in old if r.digest not in drop for b in (r.digest, r.envelope_digest)}
    for r in referrers:
        _write_blob(layout, r.envelope)
        _write_blob(layout, EMPTY_BLOB)
        _write_blob(layout, r.manifest)
        keep_blobs |= {r.digest, r.envelope_digest}
    index_path = layout / "index.json"
    index = json.loads(index_path.read_bytes())
    manifests = [d for d in index.get("manifests", [])
                 if not (isinstance(d, dict) and d.get("digest") in drop)]
    have = {d.get("digest") for d in manifests if isinstance(d, dict)}
    manifests += [r.descriptor() for r in referrers if r.digest not in have]
    index["manifests"] = manifests
    index.setdefault("mediaType", OCI_INDEX)
    write_atomic(index_path, canonical_json(index))
    for r in old:
        if r.digest in drop:
            for b in (r.digest, r.envelope_digest):
                if b not in keep_blobs:
                    with contextlib.suppress(FileNotFoundError):
                        layout_blob_path(layout, b).unlink()


def read_referrers(layout: Path, subject: str) -> list[Referrer]:
    """The attestations index.json lists about ``subject``, blobs verified."""
    layout = Path(layout)
    out = []
    for d in layout_manifests(layout):
        if not isinstance(d, dict) or d.get("artifactType") != ARTIFACT_TYPE:
            continue
        digest = str(d.get("digest"))
        raw = read_layout_blob(layout, digest, "referrer manifest")
        if subject_of(raw) != subject:
            continue
        ref = parse_artifact(digest, raw,
                             lambda dg: read_layout_blob(layout, dg, "attestation envelope"))
        if ref is not None:
            out.append(ref)
    return out
