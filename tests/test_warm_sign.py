"""Signed warm caches (frank.ship.warmsign): where the image is attested, `frank run` uses a
warm cache only when its signature, by the key that signed the image, holds for exactly this
layer, image and device; otherwise the engine starts cold and the ready note says why in one
line. An image that is not attested is unchanged. No engine; the registry round trip keeps
the signature (pushed as an annotation, written beside the index entry on pull).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from frank.image.oci import canonical_json, layout_blob_path
from frank.run import warmcache, warmuse
from frank.run.device import cpu_identity
from frank.ship import warmsign
from frank.ship.attest import PREDICATE_SBOM
from frank.ship.attest.dsse import key_id, keygen, load_private_key, sign
from frank.ship.attest.layout import artifact
from frank.store.blobs import BlobStore, sha256_bytes
from tests.test_warm_cache import IMAGE, OTHER_IMAGE, SUBJECT, cache_folder


def keys(where: Path, name: str) -> tuple[object, Path]:
    keygen(where / f"{name}.key", where / f"{name}.pub")
    return load_private_key(where / f"{name}.key"), where / f"{name}.pub"


def layout_with(where: Path, private: object | None) -> Path:
    """An OCI layout whose index lists the image's SBOM attestation signed by ``private``
    (none: not attested). Only what reading referrers needs."""
    where.mkdir(parents=True)
    (where / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    manifests: list[dict[str, object]] = [dict(SUBJECT)]
    if private is not None:
        kid = key_id(private.public_key())  # type: ignore[attr-defined]
        ref = artifact(SUBJECT, PREDICATE_SBOM, sign(b"{}", private), "1970-01-01T00:00:00Z",
                       kid)
        for blob in (ref.manifest, ref.envelope):
            path = layout_blob_path(where, sha256_bytes(blob))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(blob)
        manifests.append(ref.descriptor())
    (where / "index.json").write_bytes(canonical_json({"schemaVersion": 2,
                                                       "manifests": manifests}))
    return where


def note(store: BlobStore, layout: Path, pub: Path | None) -> tuple[str, bool]:
    check = warmsign.run_check(store.root, layout, IMAGE, pub)
    with warmuse.attached(store, IMAGE, 0, cold=False, check=check) as use:
        return use.note, use.host is not None


@pytest.fixture
def made(tmp_path: Path) -> tuple[BlobStore, warmcache.Artifact]:
    store = BlobStore(tmp_path / "store")
    art = warmcache.make(store, cache_folder(tmp_path / "cache"), subject=SUBJECT, image=IMAGE,
                         device=cpu_identity())
    return store, art


def test_an_attested_image_uses_only_a_warm_cache_its_signer_signed(
        tmp_path: Path, made: tuple[BlobStore, warmcache.Artifact]) -> None:
    store, art = made
    signer, pub = keys(tmp_path, "signer")
    stranger, stranger_pub = keys(tmp_path, "stranger")
    plain = layout_with(tmp_path / "plain", None)
    attested = layout_with(tmp_path / "attested", signer)
    refused = f"no warm cache: warm cache {art.digest}"

    # not attested: used as before, no key needed
    assert warmsign.run_check(store.root, plain, IMAGE, None) is None
    assert note(store, plain, None)[1]
    # attested, unsigned: cold, and the line says why
    text, used = note(store, attested, pub)
    assert not used and text.startswith(f"{refused} is not signed, and the image is attested")
    # signed by the image's key: used
    warmsign.sign_into(store.root, art, signer)
    text, used = note(store, attested, pub)
    assert used and text.startswith(f"warm cache {art.digest} (made on ")
    # no public key, or one that did not sign the image: cold
    text, used = note(store, attested, None)
    assert not used and "no public key to check its warm cache's signature" in text
    text, used = note(store, attested, stranger_pub)
    assert not used and "the image is attested by sha256:" in text
    # signed by another key (a forger who can write the store): cold
    warmsign.sign_into(store.root, art, stranger)
    text, used = note(store, attested, pub)
    assert not used and text.startswith(f"{refused}: its signature does not verify with")
    # a valid signature of another cache (another image's) moved beside this one: cold
    other = warmcache.Artifact(**{**art.__dict__, "image": OTHER_IMAGE})
    path = warmsign.signature_path(store.root, art)
    path.write_bytes(sign(warmsign.statement(other), signer))
    text, used = note(store, attested, pub)
    assert not used and text.startswith(f"{refused}: its signature is for another cache")
    path.write_bytes(b"not an envelope")
    text, used = note(store, attested, pub)
    assert not used and text.startswith(f"{refused}: its signature is unreadable")
    assert "\n" not in text


def test_the_signature_travels_through_a_registry(
        tmp_path: Path, made: tuple[BlobStore, warmcache.Artifact]) -> None:
    from frank.ship import warmremote
    from frank.ship.attest import VerifyFailed
    from frank.ship.attest.dsse import load_public_key
    from tests.image.conftest import start_registry, stop

    store, art = made
    signer, pub = keys(tmp_path, "signer")
    _, stranger_pub = keys(tmp_path, "stranger")
    warmsign.sign_into(store.root, art, signer)
    proc, where = start_registry(tmp_path / "registry")
    try:
        repo = f"{where}/warm/signed"
        warmremote.push(store, repo, IMAGE, SUBJECT)
        second = BlobStore(tmp_path / "b")
        got = warmremote.pull(second, repo, IMAGE, IMAGE, art.device)
        assert got is not None
        assert warmsign.envelope_of(second.root, got) == warmsign.envelope_of(store.root, art)
        attested = layout_with(tmp_path / "attested", signer)
        assert note(second, attested, pub)[1]
        checked = warmremote.verify(repo, IMAGE, IMAGE, load_public_key(pub), str(pub))
        assert [c.layer for c in checked] == [art.layer]
        with pytest.raises(VerifyFailed, match="its signature does not verify with"):
            warmremote.verify(repo, IMAGE, IMAGE, load_public_key(stranger_pub), "stranger")
    finally:
        stop(proc)
    assert json.loads(warmsign.statement(art))["predicate"]["image"] == IMAGE


def test_frank_run_checks_the_signature_with_frank_verify_key(
        tmp_path: Path, made: tuple[BlobStore, warmcache.Artifact],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The wiring `frank run` uses (cli.warm.warm_for_run): the key from $FRANK_VERIFY_KEY,
    the note on the ready line."""
    from types import SimpleNamespace

    from frank.cli.warm import warm_for_run

    store, art = made
    signer, pub = keys(tmp_path, "signer")
    image = SimpleNamespace(digest=IMAGE, layout=layout_with(tmp_path / "attested", signer))
    monkeypatch.setenv("FRANK_CACHE", str(store.root))
    monkeypatch.setenv("FRANK_VERIFY_KEY", str(pub))
    with warm_for_run(image, {"target": {"gpus": 0}}, cold=False) as use:  # type: ignore[arg-type]
        assert use.host is None and "is not signed, and the image is attested" in use.note
    warmsign.sign_into(store.root, art, signer)
    with warm_for_run(image, {"target": {"gpus": 0}}, cold=False) as use:  # type: ignore[arg-type]
        assert use.host is not None and use.note.endswith("; its signature holds"), use.note
