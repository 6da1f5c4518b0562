"""Referrers in a registry: the OCI distribution API where it has it, the tag scheme where not.

skopeo pushes the image itself (``frank.image.remote``), but it does not speak the
referrers protocol, so the artifacts go through this small client of the distribution v2
HTTP API (standard library only):

- push: each blob (monolithic upload), then the artifact manifest by its digest. A registry
  with the referrers API answers that PUT with an ``OCI-Subject`` header and indexes it
  itself; without the header (Debian's docker-registry, distribution 2.8, has no referrers
  API) the client keeps the **referrers tag** ``sha256-<hex of the subject>``: an image
  index listing the artifacts, read, extended and written back (OCI distribution-spec 1.1,
  "Referrers Tag Schema");
- read: ``GET /v2/<name>/referrers/<digest>``; a 404 there means the tag scheme;
- for cosign, the same envelopes are also listed under its own tag ``sha256-<hex>.att``
  (an image whose layers are the envelopes), where ``cosign verify-attestation --key``
  looks when it does not use OCI 1.1.

Loopback registries are spoken to over plain HTTP (the test registry); anything else over
verified HTTPS, with a bearer token or basic credentials from the same auth files skopeo and
docker read (``REGISTRY_AUTH_FILE``, containers' ``auth.json``, ``~/.docker/config.json``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from frank.errors import FrankError
from frank.image.oci import OCI_INDEX, OCI_MANIFEST, canonical_json
from frank.ship.attest.layout import Referrer, parse_artifact, subject_of
from frank.store.blobs import sha256_bytes

_LOOPBACK = ("127.0.0.1", "localhost", "[::1]", "::1")
MANIFEST_ACCEPT = ", ".join([OCI_MANIFEST, OCI_INDEX,
                             "application/vnd.docker.distribution.manifest.v2+json",
                             "application/vnd.docker.distribution.manifest.list.v2+json"])


def split_ref(ref: str) -> tuple[str, str, str]:
    """``host[:port]/name[:tag|@digest]`` -> (host, name, tag or digest or "")."""
    host, slash, rest = ref.partition("/")
    if not slash or not rest:
        raise FrankError(f"not an image reference: {ref!r}; write HOST[:PORT]/NAME[:TAG|@DIGEST]",
                         field="IMAGE_REF")
    if "@" in rest:
        name, _, what = rest.partition("@")
    else:
        head, _, last = rest.rpartition("/")
        name, _, what = last.partition(":")
        name = f"{head}/{name}" if head else name
    return host, name, what


def _auth_files() -> list[Path]:
    out = []
    if os.environ.get("REGISTRY_AUTH_FILE"):
        out.append(Path(os.environ["REGISTRY_AUTH_FILE"]))
    if os.environ.get("XDG_RUNTIME_DIR"):
        out.append(Path(os.environ["XDG_RUNTIME_DIR"]) / "containers" / "auth.json")
    home = Path.home()
    out += [home / ".config" / "containers" / "auth.json", home / ".docker" / "config.json"]
    return out


def _basic_for(host: str) -> str | None:
    """``user:password`` (base64) for ``host`` from the first auth file that has it."""
    for path in _auth_files():
        try:
            auths = json.loads(path.read_bytes()).get("auths") or {}
        except (OSError, ValueError, AttributeError):
            continue
        for key in (host, f"https://{host}", f"http://{host}"):
            entry = auths.get(key)
            if isinstance(entry, dict) and entry.get("auth"):
                return str(entry["auth"])
    return None


@dataclass
class Registry:
    """One registry host; ``token`` is the bearer token of the last challenge answered."""

    host: str
    token: str | None = None
    scheme: str = field(init=False)

    def __post_init__(self) -> None:
        bare = self.host.rsplit(":", 1)[0] if not self.host.startswith("[") else \
            self.host.split("]")[0] + "]"
        self.scheme = "http" if bare in _LOOPBACK or self.host in _LOOPBACK else "https"

    def url(self, path: str) -> str:
        return f"{self.scheme}://{self.host}{path}"

    def _open(self, req: urllib.request.Request) -> tuple[int, dict[str, str], bytes]:
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()
        except (urllib.error.URLError, OSError) as exc:
            why = getattr(exc, "reason", exc)
            raise FrankError(f"cannot reach the registry {self.host}: {why}") from None

    def request(self, method: str, url: str, *, data: bytes | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        """One HTTP request, answering one auth challenge if the registry sends it."""
        hdrs = dict(headers or {})
        for attempt in range(2):
            if self.token:
                hdrs["Authorization"] = self.token
            req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
            status, rh, body = self._open(req)
            if status != 401 or attempt == 1:
                return status, rh, body
            self.token = self._answer(rh.get("www-authenticate", ""))
            if self.token is None:
                return status, rh, body
        raise AssertionError("unreachable")

    def _answer(self, challenge: str) -> str | None:
        basic = _basic_for(self.host)
        if challenge.lower().startswith("basic"):
            return f"Basic {basic}" if basic else None
        if not challenge.lower().startswith("bearer"):
            return None
        params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
        realm = params.pop("realm", None)
        if realm is None:
            return None
        query = urllib.parse.urlencode({k: v for k, v in params.items()
                                        if k in ("service", "scope")})
        headers = {"Authorization": f"Basic {basic}"} if basic else {}
        status, _, body = self._open(urllib.request.Request(
            f"{realm}?{query}", headers=headers))
        if status != 200:
            raise FrankError(f"the registry {self.host} refused a token ({status})")
        doc = json.loads(body)
        token = doc.get("token") or doc.get("access_token")
        return f"Bearer {token}" if token else None

    # ---------------------------------------------------------------------------------------

    def _fail(self, what: str, status: int, body: bytes) -> FrankError:
        try:
            errors = json.loads(body).get("errors") or []
            why = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors)
        except (ValueError, AttributeError):
            why = " ".join(body.decode(errors="replace").split())[:200]
        return FrankError(f"{what} on {self.host} failed ({status}{': ' + why if why else ''})")

    def put_blob(self, name: str, data: bytes) -> None:
        digest = sha256_bytes(data)
        status, _, _ = self.request("HEAD", self.url(f"/v2/{name}/blobs/{digest}"))
        if status == 200:
            return
        status, rh, body = self.request("POST", self.url(f"/v2/{name}/blobs/uploads/"),
                                        data=b"")
        if status != 202 or "location" not in rh:
            raise self._fail(f"upload of {digest}", status, body)
        loc = urllib.parse.urljoin(self.url("/"), rh["location"])
        sep = "&" if "?" in loc else "?"
        status, _, body = self.request(
            "PUT", f"{loc}{sep}digest={urllib.parse.quote(digest)}", data=data,
            headers={"Content-Type": "application/octet-stream"})
        if status != 201:
            raise self._fail(f"upload of {digest}", status, body)

    def put_manifest(self, name: str, ref: str, data: bytes, media_type: str
                     ) -> dict[str, str]:
        status, rh, body = self.request("PUT", self.url(f"/v2/{name}/manifests/{ref}"),
                                        data=data, headers={"Content-Type": media_type})
        if status != 201:
            raise self._fail(f"push of manifest {name}:{ref}", status, body)
        return rh

    def get_manifest(self, name: str, ref: str) -> bytes | None:
        status, _, body = self.request("GET", self.url(f"/v2/{name}/manifests/{ref}"),
                                       headers={"Accept": MANIFEST_ACCEPT})
        if status == 404:
            return None
        if status != 200:
            raise self._fail(f"read of {name}:{ref}", status, body)
        if ref.startswith("sha256:") and sha256_bytes(body) != ref:
            raise FrankError(f"the registry {self.host} returned other content for "
                             f"{name}@{ref}")
        return body

    def get_blob(self, name: str, digest: str) -> bytes:
        status, _, body = self.request("GET", self.url(f"/v2/{name}/blobs/{digest}"))
        if status != 200:
            raise self._fail(f"read of blob {digest}", status, body)
        if sha256_bytes(body) != digest:
            raise FrankError(f"the registry {self.host} returned a blob that does not match "
                             f"its digest {digest}")
        return body

    def referrers_api(self, name: str, digest: str) -> list[dict[str, Any]] | None:
        """The referrers API's list, or None where the registry has no such API."""
        status, _, body = self.request("GET", self.url(f"/v2/{name}/referrers/{digest}"),
                                       headers={"Accept": OCI_INDEX})
        if status in (404, 405, 400):
            return None
        if status != 200:
            raise self._fail(f"referrers of {digest}", status, body)
        try:
            doc = json.loads(body)
        except ValueError:
            return None
        if not isinstance(doc, dict) or not isinstance(doc.get("manifests"), list):
            return None
        return [d for d in doc["manifests"] if isinstance(d, dict)]


def fallback_tag(digest: str) -> str:
    """The referrers tag of ``digest``: ``sha256-<hex>``."""
    return digest.replace(":", "-", 1)


@dataclass(frozen=True)
class PushedReferrers:
    """Where the artifacts went: ``api`` or ``tag`` (and which tag)."""

    scheme: str
    digests: list[str]
    tag: str | None = None


def push_referrers(repository: str, subject: str, referrers: list[Referrer]) -> PushedReferrers:
    """Push the artifacts about ``subject`` to ``repository`` (``host/name``)."""
    from frank.ship.attest.layout import EMPTY_BLOB

    host, name, _ = split_ref(repository)
    reg = Registry(host)
    api = True
    for r in referrers:
        reg.put_blob(name, EMPTY_BLOB)
        reg.put_blob(name, r.envelope)
        headers = reg.put_manifest(name, r.digest, r.manifest, OCI_MANIFEST)
        if headers.get("oci-subject") != subject:
            api = False
    digests = [r.digest for r in referrers]
    if api and referrers:
        return PushedReferrers("api", digests)
    tag = fallback_tag(subject)
    raw = reg.get_manifest(name, tag)
    index: dict[str, Any] = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []}
    if raw is not None:
        with contextlib.suppress(ValueError):  # a corrupt list is written anew
            index = json.loads(raw)
    ours = {r.digest for r in referrers}
    kept = [d for d in index.get("manifests") or [] if isinstance(d, dict)
            and d.get("digest") not in ours]
    # one attestation per predicate type: a newer one replaces the older in the list
    types = {r.predicate_type for r in referrers}
    kept = [d for d in kept if (d.get("annotations") or {}).get(
        "in-toto.io/predicate-type") not in types]
    index["manifests"] = kept + [r.descriptor() for r in referrers]
    reg.put_manifest(name, tag, canonical_json(index), OCI_INDEX)
    return PushedReferrers("tag", digests, tag)


COSIGN_SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
COSIGN_PREDICATE_ANNOTATION = "predicateType"
_COSIGN_CREATED = "0001-01-01T00:00:00Z"


def cosign_tag(digest: str) -> str:
    """cosign's own attestation tag of ``digest``: ``sha256-<hex>.att``."""
    return fallback_tag(digest) + ".att"


def push_cosign_tag(repository: str, subject: str, referrers: list[Referrer]) -> str:
    """Also list the envelopes where cosign looks without OCI 1.1 (``cosign
    verify-attestation --key``): an image under ``sha256-<hex>.att`` whose layers are the
    DSSE envelopes, each annotated ``predicateType`` and an empty
    ``dev.cosignproject.cosign/signature``, as cosign's own ``attest`` writes it. Layers of
    other predicate types already there (another tool's attestations) are kept."""
    from frank.image.oci import OCI_CONFIG
    from frank.ship.attest.dsse import ENVELOPE_MEDIA_TYPE

    host, name, _ = split_ref(repository)
    reg = Registry(host)
    tag = cosign_tag(subject)
    ours = [{"mediaType": ENVELOPE_MEDIA_TYPE, "digest": r.envelope_digest,
             "size": len(r.envelope),
             "annotations": {COSIGN_SIGNATURE_ANNOTATION: "",
                             COSIGN_PREDICATE_ANNOTATION: r.predicate_type}}
            for r in referrers]
    types = {r.predicate_type for r in referrers}
    kept: list[dict[str, Any]] = []
    raw = reg.get_manifest(name, tag)
    if raw is not None:
        with contextlib.suppress(ValueError, AttributeError):
            kept = [x for x in json.loads(raw).get("layers") or [] if isinstance(x, dict)
                    and (x.get("annotations") or {}).get(COSIGN_PREDICATE_ANNOTATION)
                    not in types and x.get("digest") not in {o["digest"] for o in ours}]
    layers = kept + ours
    for r in referrers:
        reg.put_blob(name, r.envelope)
    config = canonical_json({
        "architecture": "", "config": {}, "created": _COSIGN_CREATED,
        "history": [{"created": _COSIGN_CREATED} for _ in layers], "os": "",
        "rootfs": {"type": "layers", "diff_ids": [x["digest"] for x in layers]}})
    reg.put_blob(name, config)
    manifest = canonical_json({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": sha256_bytes(config),
                   "size": len(config)},
        "layers": layers})
    reg.put_manifest(name, tag, manifest, OCI_MANIFEST)
    return tag


def pull_referrers(repository: str, subject: str) -> tuple[list[Referrer], str]:
    """The attestations about ``subject`` in ``repository``, and how they were found."""
    from frank.ship.attest.layout import ARTIFACT_TYPE

    host, name, _ = split_ref(repository)
    reg = Registry(host)
    listed = reg.referrers_api(name, subject)
    how = "referrers API"
    if listed is None:
        how = f"referrers tag {fallback_tag(subject)}"
        raw = reg.get_manifest(name, fallback_tag(subject))
        listed = []
        if raw is not None:
            try:
                listed = [d for d in json.loads(raw).get("manifests") or []
                          if isinstance(d, dict)]
            except (ValueError, AttributeError):
                raise FrankError(f"{repository}:{fallback_tag(subject)} is not an image "
                                 "index") from None
    out = []
    for d in listed:
        if d.get("artifactType") != ARTIFACT_TYPE:
            continue
        digest = str(d.get("digest"))
        raw = reg.get_manifest(name, digest)
        if raw is None:
            raise FrankError(f"{how} lists {digest}, which {repository} does not hold")
        if subject_of(raw) != subject:
            from frank.ship.attest import VerifyFailed

            raise VerifyFailed(f"{how} lists {digest}, whose subject is {subject_of(raw)}, "
                               f"not the image {subject}")
        ref = parse_artifact(digest, raw, lambda dg: reg.get_blob(name, dg))
        if ref is not None:
            out.append(ref)
    return out, how


def image_manifest(ref: str) -> tuple[str, str, bytes]:
    """(repository, digest, manifest bytes) of ``host/name[:tag|@digest]``."""
    host, name, what = split_ref(ref)
    reg = Registry(host)
    raw = reg.get_manifest(name, what or "latest")
    if raw is None:
        raise FrankError(f"no image {ref} in the registry")
    digest = sha256_bytes(raw)
    if what.startswith("sha256:") and digest != what:
        raise FrankError(f"the registry returned other content for {ref}")
    return f"{host}/{name}", digest, raw


def registry_blob(repository: str, digest: str) -> bytes:
    """One blob of ``repository``, verified against its digest."""
    host, name, _ = split_ref(repository)
    return Registry(host).get_blob(name, digest)
