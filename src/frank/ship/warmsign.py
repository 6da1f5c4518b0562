"""Signed warm caches: where an image is attested, its warm caches are signed by the same key
and ``frank run`` uses only one whose signature holds.

Why: an attested image says who built it; a warm cache holds compiled code the engine loads
and runs (Inductor's ``.so`` files, Triton kernels), so on such an image it must come from the
same signer, not from whoever could write the store or the registry.

The signature is a DSSE envelope (``ship.attest.dsse``, the key ``frank attest`` uses) over
an in-toto Statement whose subject is the artifact's layer digest and whose predicate names
the image digest and the device identity. It names no manifest digest: ``frank push``
rewrites the manifest's ``subject`` (a compressed form), and the layer and annotations are
what the engine trusts. In the store it is the file ``<device key>.dsse`` beside the warm
index entry (gone with the image's folder in ``frank gc``); in a registry it travels as the
pushed manifest's annotation ``dev.frank.warm.signature`` (base64 of the envelope).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from frank.errors import FrankError
from frank.fsutil import write_atomic
from frank.image.oci import canonical_json
from frank.run import warmcache
from frank.ship.attest import STATEMENT_TYPE
from frank.ship.attest.dsse import PAYLOAD_TYPE, key_id, parse, sign, verify

PREDICATE = "https://frank.dev/warm-cache/v1"
ANNOTATION = "dev.frank.warm.signature"
VERIFY_KEY_ENV = "FRANK_VERIFY_KEY"


def signature_path(store_root: Path, artifact: warmcache.Artifact) -> Path:
    """``<store>/warm/<image hex>/<device key>.dsse``."""
    entry = warmcache.index_dir(store_root) / artifact.image.split(":", 1)[1]
    return entry / f"{artifact.device.key}.dsse"


def statement(artifact: warmcache.Artifact) -> bytes:
    """What is signed: the layer by digest, for this image and this device."""
    return canonical_json({
        "_type": STATEMENT_TYPE,
        "subject": [{"name": "warm-cache", "digest": {"sha256": artifact.layer.split(":")[1]}}],
        "predicateType": PREDICATE,
        "predicate": {"image": artifact.image, "device": json.loads(artifact.device.canonical()),
                      "deviceKey": artifact.device.key},
    })


def sign_into(store_root: Path, artifact: warmcache.Artifact, private_key: Any) -> Path:
    """Sign ``artifact`` and write its envelope beside its index entry (atomic)."""
    path = signature_path(store_root, artifact)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, sign(statement(artifact), private_key))
    return path


def envelope_of(store_root: Path, artifact: warmcache.Artifact) -> bytes | None:
    try:
        return signature_path(store_root, artifact).read_bytes()
    except OSError:
        return None


def check_envelope(envelope: bytes | None, artifact: warmcache.Artifact, public_key: Any,
                   key_name: str) -> None:
    """The envelope verifies with ``public_key`` and names exactly this artifact's layer,
    image and device; ``warmcache.WarmRefused`` (one line) otherwise."""
    what = f"warm cache {artifact.digest}"
    if envelope is None:
        raise warmcache.WarmRefused(f"{what} is not signed, and the image is attested (sign it: "
                                    "`frank warm --key` or `frank attest` again)")
    try:
        env = parse(envelope)
        stmt = env.statement()
    except FrankError as exc:
        raise warmcache.WarmRefused(f"{what}: its signature is unreadable ({exc.message})"
                                    ) from None
    if not verify(env, public_key):
        raise warmcache.WarmRefused(f"{what}: its signature does not verify with {key_name} "
                                    f"({key_id(public_key)})")
    if env.payload_type != PAYLOAD_TYPE or stmt != json.loads(statement(artifact)):
        raise warmcache.WarmRefused(f"{what}: its signature is for another cache (the signed "
                                    "layer, image or device differs)")


def image_signers(layout: Path, image: str) -> set[str] | None:
    """The key ids that signed the image's attestations in its layout (empty strings for
    none recorded); None when the image is not attested. Attestations that cannot be read
    count as attested by an unknown key (checked, never skipped)."""
    from frank.ship.attest.check import WHAT
    from frank.ship.attest.layout import read_referrers

    try:
        refs = [r for r in read_referrers(layout, image) if r.predicate_type in WHAT]
    except (FrankError, OSError, ValueError):
        return {""}
    return {r.key for r in refs} if refs else None


def public_key_path() -> Path | None:
    """The key `frank run` checks with: ``$FRANK_VERIFY_KEY``, else ``frank keygen``'s
    ``frank.pub`` if there is one."""
    from frank.ship.attest.dsse import config_dir

    if os.environ.get(VERIFY_KEY_ENV):
        return Path(os.environ[VERIFY_KEY_ENV])
    default = config_dir() / "frank.pub"
    return default if default.is_file() else None


def run_check(store_root: Path, layout: Path, image: str, path: Path | None
              ) -> Callable[[warmcache.Artifact], None] | None:
    """For ``frank run``: the check each warm artifact must pass where the image is attested
    (None where it is not). ``path``: the public key (``$FRANK_VERIFY_KEY`` or frank
    keygen's); none, or one that did not sign the image, refuses every artifact."""
    from frank.ship.attest.dsse import load_public_key

    signers = image_signers(layout, image)
    if signers is None:
        return None

    def refuse(why: str) -> Callable[[warmcache.Artifact], None]:
        def check(artifact: warmcache.Artifact) -> None:
            raise warmcache.WarmRefused(why)
        return check

    if path is None:
        return refuse(f"the image is attested and there is no public key to check its warm "
                      f"cache's signature (set ${VERIFY_KEY_ENV})")
    try:
        public = load_public_key(path)
    except FrankError as exc:
        return refuse(f"the image is attested and {path} is no usable public key "
                      f"({exc.message})")
    kid = key_id(public)
    known = {k for k in signers if k}
    if known and kid not in known:
        return refuse(f"the image is attested by {', '.join(sorted(known))}, not by {path} "
                      f"({kid})")

    def check(artifact: warmcache.Artifact) -> None:
        check_envelope(envelope_of(store_root, artifact), artifact, public, str(path))

    return check


def annotation(envelope: bytes) -> str:
    return base64.b64encode(envelope).decode()


def from_annotation(text: str) -> bytes | None:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
