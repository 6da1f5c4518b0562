"""DSSE envelopes signed with an ECDSA P-256 key, through ``cryptography``.

The envelope is the one cosign writes and ``cosign verify-attestation --key`` reads::

    {"payloadType": "application/vnd.in-toto+json",
     "payload": "<base64 of the in-toto Statement>",
     "signatures": [{"keyid": "", "sig": "<base64>"}]}

``sig`` is an ASN.1 DER ECDSA signature, SHA-256, over the DSSE pre-authentication encoding
``PAE(type, body) = "DSSEv1" SP len(type) SP type SP len(body) SP body`` (lengths in ASCII
decimal); ``keyid`` is empty, as cosign leaves it. Signing is deterministic (RFC 6979), so
attesting the same image twice gives the same bytes. Keys are PEM: the private key PKCS#8
(optionally encrypted with a passphrase), the public key SubjectPublicKeyInfo, the form
``cosign verify --key`` takes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frank.errors import FrankError

PAYLOAD_TYPE = "application/vnd.in-toto+json"
ENVELOPE_MEDIA_TYPE = "application/vnd.dsse.envelope.v1+json"
PASSWORD_ENV = "FRANK_KEY_PASSWORD"


def config_dir() -> Path:
    """frank's config folder, where ``frank keygen`` writes keys when not told:
    ``$XDG_CONFIG_HOME/frank``, else ``~/.config/frank``."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "frank"


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding: what is signed."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def key_id(public_key: Any) -> str:
    """``sha256:<hex>`` of the public key's DER SubjectPublicKeyInfo."""
    from cryptography.hazmat.primitives import serialization

    der = public_key.public_bytes(serialization.Encoding.DER,
                                  serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(der).hexdigest()


def _check_p256(key: Any, path: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric import ec

    if not isinstance(key, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey)) \
            or not isinstance(key.curve, ec.SECP256R1):
        raise FrankError("not an ECDSA P-256 key (make one with `frank keygen`)", file=path)


def load_private_key(path: Path) -> Any:
    """A PEM private key; encrypted, its passphrase comes from $FRANK_KEY_PASSWORD."""
    from cryptography.hazmat.primitives import serialization

    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise FrankError("signing key not found", file=path, field="--key") from None
    password = os.environ.get(PASSWORD_ENV)
    try:
        key = serialization.load_pem_private_key(
            data, password=password.encode() if password else None)
    except TypeError:
        raise FrankError(f"the key is encrypted; put its passphrase in ${PASSWORD_ENV}",
                         file=path, field="--key") from None
    except ValueError as exc:
        raise FrankError(f"not a PEM private key ({' '.join(str(exc).split())[:80]})",
                         file=path, field="--key") from None
    _check_p256(key, path)
    return key


def load_public_key(path: Path) -> Any:
    """A PEM public key (SubjectPublicKeyInfo), or the public half of a private key."""
    from cryptography.hazmat.primitives import serialization

    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise FrankError("public key not found", file=path, field="--key") from None
    try:
        key = serialization.load_pem_public_key(data)
    except ValueError:
        try:
            key = load_private_key(path).public_key()
        except FrankError:
            raise FrankError("not a PEM public key", file=path, field="--key") from None
    _check_p256(key, path)
    return key


def keygen(private: Path, public: Path, *, password: str | None = None) -> str:
    """Write a new P-256 key pair (private 0600); return the public key's id."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    for p in (private, public):
        if p.exists():
            raise FrankError("refusing to overwrite an existing key", file=p)
    key = ec.generate_private_key(ec.SECP256R1())
    enc: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password.encode()) if password
        else serialization.NoEncryption())
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc)
    private.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    public.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return key_id(key.public_key())


def sign(payload: bytes, private_key: Any, payload_type: str = PAYLOAD_TYPE) -> bytes:
    """A DSSE envelope over ``payload``, as canonical JSON bytes."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    from frank.image.oci import canonical_json

    sig = private_key.sign(pae(payload_type, payload),
                           ec.ECDSA(hashes.SHA256(), deterministic_signing=True))
    return canonical_json({
        "payloadType": payload_type,
        "payload": base64.b64encode(payload).decode(),
        # keyid empty, as cosign writes it: a verifier that computes its own key id
        # (go-securesystemslib's SHA256KeyID) skips a signature whose keyid differs
        "signatures": [{"keyid": "", "sig": base64.b64encode(sig).decode()}],
    })


@dataclass(frozen=True)
class Envelope:
    """A parsed envelope: its payload bytes and signatures (keyid, DER signature)."""

    payload_type: str
    payload: bytes
    signatures: list[tuple[str, bytes]]

    def statement(self) -> dict[str, Any]:
        try:
            doc = json.loads(self.payload)
        except ValueError:
            raise FrankError("the envelope's payload is not JSON") from None
        if not isinstance(doc, dict):
            raise FrankError("the envelope's payload is not a JSON object")
        return doc


def parse(data: bytes) -> Envelope:
    """Read an envelope; anything malformed is one line."""
    try:
        doc = json.loads(data)
        payload = base64.b64decode(doc["payload"], validate=True)
        sigs = [(str(s.get("keyid") or ""), base64.b64decode(s["sig"], validate=True))
                for s in doc["signatures"]]
        ptype = str(doc["payloadType"])
    except (ValueError, KeyError, TypeError, AttributeError, binascii.Error):
        raise FrankError("not a DSSE envelope (payloadType, payload, signatures)") from None
    return Envelope(ptype, payload, sigs)


def verify(env: Envelope, public_key: Any) -> bool:
    """Whether some signature of the envelope verifies with ``public_key``."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    message = pae(env.payload_type, env.payload)
    for _, sig in env.signatures:
        try:
            public_key.verify(sig, message, ec.ECDSA(hashes.SHA256()))
            return True
        except InvalidSignature:
            continue
    return False
