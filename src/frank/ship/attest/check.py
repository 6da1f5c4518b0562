"""Attest an image, and verify an image's attestations against the image's own lock.

``attest_layout`` reads the image (every blob hashed) and the lock it carries, lists its
components, writes the SBOM and provenance Statements, signs each and attaches them to the
layout as referrers. ``verify_image`` reads an image (a layout, or a registry by digest:
only its manifest, config and lock layer are fetched), finds its referrers, checks each
signature with the public key, each subject against the image digest, and compares the SBOM
and the provenance with what the image's lock gives; the first difference is one line.
"""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from frank.errors import FrankError
from frank.image.oci import epoch_to_rfc3339
from frank.resolve.lock import Lock
from frank.ship.attest import PREDICATE_SBOM, PREDICATE_SLSA, STATEMENT_TYPE, VerifyFailed
from frank.ship.attest.dsse import PAYLOAD_TYPE, key_id, parse, sign, verify
from frank.ship.attest.inventory import Inventory, inventory
from frank.ship.attest.layout import Referrer, artifact, attach, image_descriptor, read_referrers

WHAT = {PREDICATE_SBOM: "SBOM", PREDICATE_SLSA: "provenance"}


@dataclass(frozen=True)
class ImageFacts:
    """What verify and attest need of an image: digest, config and the lock it carries."""

    digest: str
    descriptor: dict[str, Any]
    config: dict[str, Any]
    lock: Lock
    # for a compressed form `frank push` sent: the digest of the uncompressed form (the
    # layout's), which the attestations name; rebuilt from the pushed manifest and config
    signed_as: str = ""

    @property
    def attested(self) -> str:
        """The digest the image's attestations must name."""
        return self.signed_as or self.digest


def _lock_from(data: bytes, where: str) -> Lock:
    try:
        return Lock.model_validate(json.loads(data))
    except (ValueError, ValidationError):
        raise FrankError(f"the lock in {where} is not a frank lock") from None


def facts_from_layout(layout: Path) -> ImageFacts:
    """The image in an OCI layout, every blob hashed, and the lock inside it."""
    from frank.assemble.plan import LOCK_IN_IMAGE
    from frank.image.verify import LayerChanged, image_lock, verify_layout

    try:
        image = verify_layout(layout)
    except LayerChanged as exc:  # a verification that fails, not bad input
        raise VerifyFailed(exc.message.removeprefix("refusing to run: "),
                           file=exc.file) from None
    raw = image_lock(image)
    return ImageFacts(image.digest, image_descriptor(layout), image.config,
                      _lock_from(json.dumps(raw).encode(), f"{layout}:{LOCK_IN_IMAGE}"))


def _lock_in_tar(data: bytes, where: str) -> bytes | None:
    from frank.assemble.plan import LOCK_IN_IMAGE

    names = {LOCK_IN_IMAGE.lstrip("/"), "." + LOCK_IN_IMAGE, LOCK_IN_IMAGE}
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
            member = next((m for m in tar if m.name in names and m.isfile()), None)
            handle = tar.extractfile(member) if member is not None else None
            return handle.read() if handle is not None else None
    except tarfile.TarError as exc:
        raise FrankError(f"{where} is not a readable tar ({exc})") from None


def facts_from_registry(ref: str) -> tuple[str, ImageFacts]:
    """(repository, facts) of a registry image: manifest, config and the lock's layer only
    (each checked against its digest), never the whole image."""
    from frank.image.compress import decompress_bytes, uncompressed_form_digest
    from frank.image.oci import OCI_MANIFEST
    from frank.ship.attest.inventory import LOCK_HISTORY
    from frank.ship.attest.remote import image_manifest, registry_blob
    from frank.store.blobs import sha256_bytes

    repository, digest, raw = image_manifest(ref)
    manifest = json.loads(raw)
    if "layers" not in manifest:
        raise FrankError(f"{ref} is an image index; give the image's own digest")
    config = json.loads(registry_blob(repository, manifest["config"]["digest"]))
    hist = [str(h.get("created_by", "")) for h in config.get("history") or []
            if isinstance(h, dict) and not h.get("empty_layer")]
    layers = manifest["layers"]
    order = [i for i, h in enumerate(hist) if h == LOCK_HISTORY] or \
        list(reversed(range(len(layers))))
    plain = uncompressed_form_digest(manifest, config) or ""
    for i in order:
        blob = registry_blob(repository, layers[i]["digest"])
        try:
            tar = decompress_bytes(str(layers[i].get("mediaType", "")), blob)
        except Exception as exc:  # zlib.error, zstandard.ZstdError
            raise FrankError(f"layer {i} of {ref} does not decompress ({exc})") from None
        if plain and sha256_bytes(tar) != config["rootfs"]["diff_ids"][i]:
            raise FrankError(f"layer {i} of {ref} does not decompress to its diff_id")
        found = _lock_in_tar(tar, f"layer {i} of {ref}")
        if found is not None:
            desc = {"mediaType": manifest.get("mediaType", OCI_MANIFEST), "digest": digest,
                    "size": len(raw)}
            return repository, ImageFacts(digest, desc, config,
                                          _lock_from(found, f"{repository}@{digest}"), plain)
    raise FrankError(f"not an image frank built: no layer of {ref} holds the lock")


def make_referrers(facts: ImageFacts, inv: Inventory, private_key: Any,
                   lock: Lock | None = None) -> list[Referrer]:
    """The signed SBOM and provenance artifacts for the image (``lock``: the lock they
    describe, the image's own unless given)."""
    from frank.assemble.plan import SOURCE_DATE_EPOCH
    from frank.ship.attest.provenance import statements

    stmts = statements(inv, lock or facts.lock, facts.digest, SOURCE_DATE_EPOCH)
    created = epoch_to_rfc3339(SOURCE_DATE_EPOCH)
    kid = key_id(private_key.public_key())
    return [artifact(facts.descriptor, ptype, sign(payload, private_key), created, kid)
            for ptype, payload in stmts.items()]


EXPORT_NAMES = {PREDICATE_SBOM: "sbom", PREDICATE_SLSA: "provenance"}


def export(layout: Path, digest: str, refs: list[Referrer], out: Path) -> None:
    """Write the image manifest and each attestation as files, for tools other than frank:
    ``manifest.json`` (the bytes the digest names), ``sbom.dsse.json`` and
    ``provenance.dsse.json`` (the envelopes), ``sbom.cdx.json`` (the CycloneDX document) and
    ``provenance.json`` (the in-toto Statement)."""
    from frank.fsutil import write_atomic
    from frank.image.oci import read_layout_blob

    write_atomic(out / "manifest.json", read_layout_blob(layout, digest, "manifest"))
    for r in refs:
        name = EXPORT_NAMES[r.predicate_type]
        write_atomic(out / f"{name}.dsse.json", r.envelope)
        stmt = parse(r.envelope).statement()
        doc = stmt["predicate"] if r.predicate_type == PREDICATE_SBOM else stmt
        write_atomic(out / ("sbom.cdx.json" if name == "sbom" else "provenance.json"),
                     json.dumps(doc, indent=2, sort_keys=True) + "\n")


def attest_layout(layout: Path, private_key: Any, root: Path | None,
                  out: Path | None = None, *, stack: str | None = None,
                  stack_digest: str | None = None) -> dict[str, Any]:
    """Attach the signed SBOM and provenance to ``layout`` (and write them as files into
    ``out``); a summary of what was written. Given ``stack_digest`` (the stack's current
    lock), an image built from another lock is refused."""
    facts = facts_from_layout(layout)
    if stack_digest is not None and facts.lock.digest != stack_digest:
        raise FrankError(f"the image was built from lock {facts.lock.digest}, the stack's "
                         f"lock is now {stack_digest} (run `frank compose {stack}`)",
                         file=layout)
    inv = inventory(facts.lock, facts.config, root)
    refs = make_referrers(facts, inv, private_key)
    attach(layout, refs)
    if out is not None:
        export(layout, facts.digest, refs, out)
    return {"layout": str(layout), "image": facts.digest, "lock": facts.lock.digest,
            "key": key_id(private_key.public_key()), "components": len(inv.items),
            "not_listed": dict(inv.missing),
            "referrers": {WHAT[r.predicate_type]: r.digest for r in refs}}


# ------------------------------------------------------------------------------------------
# verify


@dataclass
class Verified:
    """What verify checked."""

    image: str
    lock: str
    key: str
    found: str
    referrers: dict[str, str] = field(default_factory=dict)
    components: int = 0
    dependencies: int = 0
    not_checked: dict[str, str] = field(default_factory=dict)
    signed_as: str = ""  # a compressed form's uncompressed digest, which the statements name


def _statement(ref: Referrer, public_key: Any, key_name: str, image: str) -> dict[str, Any]:
    what = WHAT.get(ref.predicate_type, f"attestation {ref.predicate_type!r}")
    env = parse(ref.envelope)
    if not verify(env, public_key):
        given = key_id(public_key)
        if ref.key and ref.key != given:
            raise VerifyFailed(f"{what} (referrer {ref.digest}) is signed by key "
                               f"{ref.key}, not by {key_name} ({given})")
        raise VerifyFailed(f"{what} (referrer {ref.digest}): its signature does not verify "
                           f"with {key_name} ({given}): the {what} was changed after signing")
    if env.payload_type != PAYLOAD_TYPE:
        raise VerifyFailed(f"{what} (referrer {ref.digest}): payloadType is "
                           f"{env.payload_type!r}, not {PAYLOAD_TYPE}")
    stmt = env.statement()
    if stmt.get("_type") != STATEMENT_TYPE:
        raise VerifyFailed(f"{what} (referrer {ref.digest}): not an in-toto v1 Statement")
    if stmt.get("predicateType") != ref.predicate_type:
        raise VerifyFailed(f"{what} (referrer {ref.digest}): the signed predicate type is "
                           f"{stmt.get('predicateType')!r}, the manifest says "
                           f"{ref.predicate_type!r}")
    subjects = [f"sha256:{(s.get('digest') or {}).get('sha256')}"
                for s in stmt.get("subject") or [] if isinstance(s, dict)]
    if image not in subjects:
        raise VerifyFailed(f"{what} (referrer {ref.digest}): its subject is "
                           f"{', '.join(subjects) or 'missing'}, the image is {image}")
    pred = stmt.get("predicate")
    if not isinstance(pred, dict):
        raise VerifyFailed(f"{what} (referrer {ref.digest}): no predicate")
    return pred


def _skipped(ref: str, missing: dict[str, str]) -> bool:
    return any(ref.startswith(prefix) for prefix in missing)


def _compare(what: str, got: dict[str, dict[str, Any]], want: dict[str, dict[str, Any]],
             missing: dict[str, str]) -> None:
    for ref in sorted(want):
        if ref not in got:
            raise VerifyFailed(f"{what} lacks {ref}, which the image's lock pins")
        for key in sorted(want[ref]):
            if got[ref].get(key) != want[ref][key]:
                raise VerifyFailed(f"{what}: {ref}: {key} is {got[ref].get(key)!r}, the "
                                   f"image's lock gives {want[ref][key]!r}")
    for ref in sorted(got):
        if ref not in want and not _skipped(ref, missing):
            raise VerifyFailed(f"{what} lists {ref}, which the image's lock does not pin")


def _check_sbom(pred: dict[str, Any], facts: ImageFacts, inv: Inventory) -> int:
    from frank.ship.attest.sbom import sbom_items, sbom_properties

    props = sbom_properties(pred)
    if props.get("frank:lock-digest") != facts.lock.digest:
        raise VerifyFailed(f"SBOM: it describes lock {props.get('frank:lock-digest')}, the "
                           f"image's lock is {facts.lock.digest}")
    meta = (pred.get("metadata") or {}).get("component") or {}
    if meta.get("version") != facts.attested:
        raise VerifyFailed(f"SBOM: it describes image {meta.get('version')}, the image is "
                           f"{facts.attested}")
    got = sbom_items(pred)
    _compare("SBOM", got, {i.ref: i.fields() for i in inv.items}, inv.missing)
    return len(got)


def _check_provenance(pred: dict[str, Any], facts: ImageFacts, inv: Inventory) -> int:
    from frank.ship.attest.provenance import builder_name, dependencies, expected_dependencies

    build = pred.get("buildDefinition") or {}
    ext = build.get("externalParameters") or {}
    if ext.get("stackDigest") != facts.lock.digest:
        raise VerifyFailed(f"provenance: stack digest {ext.get('stackDigest')}, the image's "
                           f"lock is {facts.lock.digest}")
    builder = builder_name(facts.lock)
    if not str(build.get("buildType", "")).startswith(f"urn:frank:builder:{builder}@"):
        raise VerifyFailed(f"provenance: buildType {build.get('buildType')!r} is not frank's "
                           f"{builder} builder")
    if ext.get("baseImage") != dict(facts.lock.base_image):
        raise VerifyFailed(f"provenance: base image {ext.get('baseImage')}, the image's lock "
                           f"gives {dict(facts.lock.base_image)}")
    got = dependencies(pred)
    _compare("provenance resolvedDependencies", got, expected_dependencies(inv), inv.missing)
    return len(got)


def verify_image(ref: str, public_key: Any, key_name: str, root: Path | None) -> Verified:
    """Verify the attestations of ``ref`` (a layout, or HOST/NAME[:TAG|@DIGEST])."""
    path = Path(ref)
    if path.is_dir():
        facts = facts_from_layout(path)
        refs, how = read_referrers(path, facts.digest), f"layout {path}"
    else:
        from frank.ship.attest.remote import pull_referrers

        repository, facts = facts_from_registry(ref)
        refs, how = pull_referrers(repository, facts.digest)
    inv = inventory(facts.lock, facts.config, root)
    result = Verified(image=facts.digest, lock=facts.lock.digest, key=key_id(public_key),
                      found=how, not_checked=dict(inv.missing), signed_as=facts.signed_as)
    by_type: dict[str, dict[str, Any]] = {}
    for r in refs:
        if r.predicate_type not in WHAT:
            continue
        if r.predicate_type in by_type:
            raise VerifyFailed(f"two {WHAT[r.predicate_type]} attestations for {facts.digest} "
                               f"({result.referrers[WHAT[r.predicate_type]]}, {r.digest})")
        by_type[r.predicate_type] = _statement(r, public_key, key_name, facts.attested)
        result.referrers[WHAT[r.predicate_type]] = r.digest
    for ptype, what in WHAT.items():
        if ptype not in by_type:
            raise VerifyFailed(f"no {what} attestation for {facts.digest} ({how}; run "
                               "`frank attest` and push again)")
    result.dependencies = _check_provenance(by_type[PREDICATE_SLSA], facts, inv)
    result.components = _check_sbom(by_type[PREDICATE_SBOM], facts, inv)
    return result
