"""in-toto Statements: SLSA provenance v1 for the image, and the one carrying the SBOM.

Built with ``in-toto-attestation`` (the in-toto project's own protobuf bindings), then
written as canonical JSON (sorted keys, no spaces) so the same image and lock give the same
payload bytes. The provenance says:

- ``subject``: the image manifest digest (the stack's name as the subject name);
- ``buildDefinition.buildType``: ``urn:frank:builder:<builder>@<frank version>``;
- ``externalParameters``: the stack, its **stack digest** (the lock digest) and base image;
- ``internalParameters``: the plan format, install format and fixed SOURCE_DATE_EPOCH;
- ``resolvedDependencies``: every build input the lock pins (each part's inputs, the base
  definition, its .deb lock and every .deb, the pylock and every wheel), by digest;
- ``runDetails.builder``: ``urn:frank:builder:<builder>`` with frank's version.
"""

from __future__ import annotations

import json
from typing import Any

from frank.image.oci import canonical_json
from frank.resolve.lock import Lock
from frank.ship.attest import PREDICATE_SBOM, PREDICATE_SLSA, frank_version
from frank.ship.attest.inventory import Inventory, Item


def builder_name(lock: Lock) -> str:
    """``oci`` (the embedded daemonless builder) or ``container`` (a step ran inside)."""
    return "container" if lock.impure else "oci"


def _descriptor(item: Item) -> Any:
    from in_toto_attestation.v1.resource_descriptor import ResourceDescriptor

    digest = {"sha256": item.sha256} if item.sha256 else {}
    if item.commit:
        digest["gitCommit"] = item.commit
    rd = ResourceDescriptor(name=item.ref, uri=item.url, digest=digest,
                            annotations={"part": item.part})
    return rd.pb


def statement_json(subject_name: str, image_digest: str, predicate_type: str,
                   predicate: dict[str, Any]) -> bytes:
    """An in-toto v1 Statement about the image, as canonical JSON bytes."""
    from google.protobuf import json_format
    from in_toto_attestation.v1.resource_descriptor import ResourceDescriptor
    from in_toto_attestation.v1.statement import Statement

    subject = ResourceDescriptor(name=subject_name,
                                 digest={"sha256": image_digest.split(":", 1)[1]})
    stmt = Statement([subject.pb], predicate_type, predicate)
    stmt.validate()
    doc = json_format.MessageToDict(stmt.pb)
    return canonical_json(doc)


def provenance_predicate(inv: Inventory, lock: Lock) -> dict[str, Any]:
    """The SLSA provenance v1 predicate of the image built from ``lock``."""
    from google.protobuf import json_format
    from google.protobuf.struct_pb2 import Struct
    from in_toto_attestation.predicates.provenance.v1 import provenance_pb2

    from frank.assemble.plan import INSTALL_FORMAT, PLAN_VERSION, SOURCE_DATE_EPOCH

    builder = builder_name(lock)
    ext = Struct()
    ext.update({"stack": lock.stack, "stackDigest": lock.digest,
                "baseImage": dict(lock.base_image)})
    internal = Struct()
    internal.update({"planVersion": str(PLAN_VERSION), "installFormat": INSTALL_FORMAT,
                     "sourceDateEpoch": str(SOURCE_DATE_EPOCH),
                     "impure": list(lock.impure)})
    notes = {f"frank:not-listed:{k}": v for k, v in sorted(inv.missing.items())}
    pred = provenance_pb2.Provenance(
        build_definition=provenance_pb2.BuildDefinition(
            build_type=f"urn:frank:builder:{builder}@{frank_version()}",
            external_parameters=ext, internal_parameters=internal,
            resolved_dependencies=[_descriptor(i) for i in inv.items if i.dependency]),
        run_details=provenance_pb2.RunDetails(
            builder=provenance_pb2.Builder(
                id=f"urn:frank:builder:{builder}",
                version={"frank": frank_version(), **notes})))
    doc: dict[str, Any] = json_format.MessageToDict(pred)
    return doc


def statements(inv: Inventory, lock: Lock, image_digest: str,
               epoch: int) -> dict[str, bytes]:
    """predicate type -> canonical Statement bytes: the SBOM and the provenance."""
    from frank.ship.attest.sbom import sbom_json

    return {
        PREDICATE_SBOM: statement_json(lock.stack, image_digest, PREDICATE_SBOM,
                                       sbom_json(inv, lock, image_digest, epoch)),
        PREDICATE_SLSA: statement_json(lock.stack, image_digest, PREDICATE_SLSA,
                                       provenance_predicate(inv, lock)),
    }


def dependencies(predicate: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """name -> {uri, digest, part} of a provenance predicate's resolvedDependencies."""
    deps = (predicate.get("buildDefinition") or {}).get("resolvedDependencies") or []
    return {str(d.get("name")): {"uri": d.get("uri"), "digest": d.get("digest") or {},
                                 "part": (d.get("annotations") or {}).get("part")}
            for d in deps if isinstance(d, dict)}


def expected_dependencies(inv: Inventory) -> dict[str, dict[str, Any]]:
    """The resolvedDependencies ``provenance_predicate`` writes for ``inv``, read back."""
    pred = {"buildDefinition": {"resolvedDependencies": [
        json.loads(json.dumps(_rd_dict(i))) for i in inv.items if i.dependency]}}
    return dependencies(pred)


def _rd_dict(item: Item) -> dict[str, Any]:
    from google.protobuf import json_format

    out: dict[str, Any] = json_format.MessageToDict(_descriptor(item))
    return out
