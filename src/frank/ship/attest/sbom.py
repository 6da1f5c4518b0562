"""The inventory as a CycloneDX 1.6 JSON SBOM, through ``cyclonedx-python-lib``.

Deterministic: the serial number is derived from the image digest and the timestamp is the
build's fixed epoch, so the same image and lock give the same SBOM bytes. Each component
carries its SHA-256 (a git commit is a property), its source URL (a ``distribution`` or
``vcs`` external reference), its purl where one exists (``pkg:pypi``, ``pkg:deb``,
``pkg:oci``) and frank's properties: ``frank:part`` (the part it came from), ``frank:layer``
(the image layer holding it) and ``frank:in-image`` (weights are served beside the image).
"""

from __future__ import annotations

import json
import uuid
import warnings
from datetime import UTC, datetime
from typing import Any

from frank.resolve.lock import Lock
from frank.ship.attest.inventory import Inventory, Item

NAMESPACE = uuid.UUID("6f1b8f0e-33a1-4c5e-9a0b-6672616e6b21")


def _component(item: Item) -> Any:
    from cyclonedx.model import (
        ExternalReference,
        ExternalReferenceType,
        HashAlgorithm,
        HashType,
        Property,
        XsUri,
    )
    from cyclonedx.model.component import Component, ComponentType
    from packageurl import PackageURL

    props = [Property(name="frank:part", value=item.part),
             Property(name="frank:in-image", value="true" if item.in_image else "false")]
    if item.layer:
        props.append(Property(name="frank:layer", value=item.layer))
    if item.commit:
        props.append(Property(name="frank:commit", value=item.commit))
    ref_type = ExternalReferenceType.VCS if item.commit else ExternalReferenceType.DISTRIBUTION
    return Component(
        name=item.name, version=item.version or None, type=ComponentType(item.type),
        bom_ref=item.ref, purl=PackageURL.from_string(item.purl) if item.purl else None,
        hashes=[HashType(alg=HashAlgorithm.SHA_256, content=item.sha256)] if item.sha256
        else [],
        external_references=[ExternalReference(type=ref_type, url=XsUri(item.url))],
        properties=props)


def sbom_json(inv: Inventory, lock: Lock, image_digest: str, epoch: int) -> dict[str, Any]:
    """The SBOM document (a dict; the statement that carries it is canonical JSON)."""
    from cyclonedx.model import Property
    from cyclonedx.model.bom import Bom, BomMetaData
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.output.json import JsonV1Dot6
    from packageurl import PackageURL

    from frank.ship.attest import frank_version

    root = Component(name=lock.stack, version=image_digest, type=ComponentType.CONTAINER,
                     bom_ref="image",
                     purl=PackageURL(type="oci", name=lock.stack, version=image_digest))
    tool = Component(name="frank", version=frank_version(), type=ComponentType.APPLICATION,
                     bom_ref="tool:frank")
    props = [Property(name="frank:stack", value=lock.stack),
             Property(name="frank:lock-digest", value=lock.digest)]
    for prefix, why in sorted(inv.missing.items()):
        props.append(Property(name=f"frank:not-listed:{prefix}", value=why))
    metadata = BomMetaData(timestamp=datetime.fromtimestamp(epoch, UTC), component=root,
                           properties=props)
    metadata.tools.components.add(tool)
    components = [_component(i) for i in inv.items]
    bom = Bom(components=components, metadata=metadata,
              serial_number=uuid.uuid5(NAMESPACE, f"{image_digest} {lock.digest}"))
    bom.register_dependency(root, components)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        text = JsonV1Dot6(bom).output_as_string(indent=None)
    doc: dict[str, Any] = json.loads(text)
    return doc


def sbom_items(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """bom-ref -> the fields ``Item.fields`` gives, read back from an SBOM document."""
    out: dict[str, dict[str, Any]] = {}
    for c in doc.get("components") or []:
        if not isinstance(c, dict):
            continue
        props = {p.get("name"): p.get("value") for p in c.get("properties") or []
                 if isinstance(p, dict)}
        sha = next((h.get("content") for h in c.get("hashes") or []
                    if isinstance(h, dict) and h.get("alg") == "SHA-256"), None)
        refs = [r.get("url") for r in c.get("externalReferences") or [] if isinstance(r, dict)]
        out[str(c.get("bom-ref"))] = {
            "name": c.get("name"), "version": c.get("version") or "", "sha256": sha,
            "commit": props.get("frank:commit"), "url": refs[0] if refs else None,
            "part": props.get("frank:part"), "layer": props.get("frank:layer"),
            "in_image": props.get("frank:in-image") == "true", "purl": c.get("purl")}
    return out


def sbom_properties(doc: dict[str, Any]) -> dict[str, str]:
    """The SBOM's metadata properties (``frank:lock-digest``, ``frank:stack``, ...)."""
    meta = doc.get("metadata") or {}
    return {str(p.get("name")): str(p.get("value")) for p in meta.get("properties") or []
            if isinstance(p, dict)}
