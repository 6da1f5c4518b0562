"""Push OCI layouts to a registry and read them back, through skopeo.

skopeo (Debian package ``skopeo``) speaks the registry protocol without a daemon. A push
goes to ``HOST/REPO@<manifest digest>`` first, so the registry holds exactly the bytes the
layout holds, and only then are tags added (each a copy that finds every blob present).
``--preserve-digests`` makes skopeo refuse rather than silently convert manifests, and
every digest skopeo reports is compared with the layout's. TLS verification is off only
for loopback hosts (the test registry); anything else is verified.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from frank.errors import FrankError
from frank.image.compress import Form
from frank.image.oci import (
    OCI_INDEX,
    OCI_MANIFEST,
    ImageInfo,
    _go_arch,
    canonical_json,
    image_info,
    image_view,
    layout_manifests,
    read_layout,
    resolve_manifest,
)
from frank.store.blobs import DIGEST_RE, sha256_bytes

_LOOPBACK = ("127.0.0.1", "localhost", "[::1]")
_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_REPO_RE = re.compile(r"^[A-Za-z0-9.-]+(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)+$")


class PushResult(BaseModel):
    """What a push did: the repository, the digest the registry holds, the tags added."""

    model_config = ConfigDict(extra="forbid")

    repository: str
    digest: str
    tags: list[str]

    @property
    def reference(self) -> str:
        """``host/repo@sha256:...``, the reference to deploy."""
        return f"{self.repository}@{self.digest}"


def skopeo(purpose: str = "to push and pull images") -> str:
    """skopeo's path; missing, it is a one-line error saying what it was needed for."""
    exe = shutil.which("skopeo")
    if exe is None:
        raise FrankError(f"skopeo is not installed; apt-get install skopeo (needed {purpose})")
    return exe


def _is_loopback(ref: str) -> bool:
    host = ref.split("/", 1)[0]
    return host.rsplit(":", 1)[0] in _LOOPBACK or host in _LOOPBACK


def _tls_flags(ref: str, flags: tuple[str, ...]) -> list[str]:
    value = "false" if _is_loopback(ref) else "true"
    return [f"{f}={value}" for f in flags]


def _run(args: list[str], what: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(args, capture_output=True, text=True)
    if proc.returncode != 0:
        why = _skopeo_error(proc.stderr or proc.stdout)
        if "400 (Bad Request)" in why:  # distribution says why in its log only
            why += (" (the registry's log says why; Debian's packaged docker-registry config "
                    "asks for htpasswd logins it cannot check: docs/concepts/image.md, "
                    "a local registry)")
        raise FrankError(f"{what} failed: {why}")
    return proc


def _skopeo_error(text: str) -> str:
    """The one useful sentence from skopeo's logrus output."""
    msgs = re.findall(r'msg="((?:[^"\\]|\\.)*)"', text)
    msg = msgs[-1].replace('\\"', '"') if msgs else (text.strip().splitlines() or ["?"])[-1]
    return " ".join(msg.split())


def check_repository(repo: str) -> str:
    """``HOST[:PORT]/PATH`` with no tag or digest; anything else is a one-line error."""
    if "@" in repo or not _REPO_RE.match(repo):
        raise FrankError(f"not a repository: {repo!r}; write HOST[:PORT]/NAME (no tag or digest)",
                         field="--to")
    return repo


def push_layout(layout: Path, repository: str,
                tags: list[str] | tuple[str, ...] = (), form: Form | None = None) -> PushResult:
    """Push the image in ``layout`` to ``repository`` by digest, then add ``tags``.

    ``form``: a compressed form of the same image (``image.compress.image_form``) to send
    instead of the layout's own manifest and layers."""
    layout = Path(layout).absolute()
    check_repository(repository)
    for t in tags:
        if not _TAG_RE.match(t):
            raise FrankError(f"not a valid tag: {t!r}", field="tag")
    digest, _, _ = resolve_manifest(layout)
    exe = skopeo()
    with tempfile.TemporaryDirectory(prefix="frank-push-") as tmp:
        if form is not None and form.compression != "none":
            digest = form.digest
            src = f"oci:{form.write_view(Path(tmp) / 'form')}"
        else:
            src = f"oci:{_image_only(layout, digest, Path(tmp))}"
        for dest in [f"{repository}@{digest}", *(f"{repository}:{t}" for t in tags)]:
            dfile = Path(tmp) / "digest"
            _run([exe, "copy", "--quiet", "--preserve-digests", "--digestfile", str(dfile),
                  *_tls_flags(repository, ("--dest-tls-verify",)), src, f"docker://{dest}"],
                 f"push to {dest}")
            got = dfile.read_text().strip()
            if got != digest:
                raise FrankError(f"registry stored {got} for {dest}, expected {digest}")
            read_back(dest, digest)
    return PushResult(repository=repository, digest=digest, tags=list(tags))


def read_back(ref: str, digest: str) -> None:
    """What the registry now answers for ``ref`` must be the manifest pushed: skopeo's
    "success" says what it sent, not what a registry (or its retry) kept."""
    raw = _inspect_raw(ref)
    if sha256_bytes(raw) != digest:
        raise FrankError(f"the registry answers {sha256_bytes(raw)} for {ref}, not the "
                         f"{digest} pushed")


def _image_only(layout: Path, digest: str, tmp: Path) -> Path:
    """The layout itself when index.json lists only the image; else a view of it listing the
    image alone (``image_view``). Attestations sit in index.json beside the image (``frank
    attest``), and skopeo refuses a layout that lists more than one manifest; they are
    pushed as referrers after the image."""
    try:
        if len(layout_manifests(layout)) <= 1:
            return layout
    except FrankError:
        return layout
    return image_view(layout, digest, tmp / "image-only")


def _platform_instance(name: str, digest: str) -> str:
    """The pinned manifest's digest, or for an image index this machine's platform entry.

    The pinned bytes are checked first: the index (or manifest) the registry returns must
    hash to the pinned digest, so the entry chosen from it is covered by the pin.
    """
    raw = _inspect_raw(f"{name}@{digest}")
    if sha256_bytes(raw) != digest:
        raise FrankError(f"registry returned content with digest {sha256_bytes(raw)} for "
                         f"{name}@{digest}")
    doc = _json(raw, f"manifest of {name}@{digest}")
    if "manifests" not in doc or "layers" in doc:
        return digest
    arch = _go_arch()
    for d in doc["manifests"]:
        plat = d.get("platform") or {}
        if plat.get("os") == "linux" and plat.get("architecture") == arch:
            return str(d["digest"])
    raise FrankError(f"{name}@{digest} is an image index without a linux/{arch} image")


def pull_pinned(name: str, digest: str, out_layout: Path) -> tuple[Path, str]:
    """Copy ``name@digest`` into an OCI layout; return (layout, image manifest digest).

    An index is followed to this machine's platform. skopeo writes the ``dir:`` format,
    which keeps manifests byte for byte (the ``oci:`` writer would convert Docker manifests
    and change the digest); frank then files the blobs as a layout, verified. A layout that
    already holds the image is returned as is, without asking the registry.
    """
    if not DIGEST_RE.match(digest):
        raise FrankError(f"not a sha256 digest: {digest!r}")
    out_layout = Path(out_layout).absolute()
    with contextlib.suppress(FrankError):
        have, _, _ = resolve_manifest(out_layout)
        record = out_layout.parent / f"{out_layout.name}.pinned"
        if record.is_file() and record.read_text().split() == [digest, have]:
            return out_layout, have
    target = _platform_instance(name, digest)
    exe = skopeo()
    out_layout.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_layout.name}.tmp-", dir=out_layout.parent))
    try:
        _run([exe, "copy", "--quiet", "--preserve-digests",
              *_tls_flags(name, ("--src-tls-verify",)),
              f"docker://{name}@{target}", f"dir:{tmp / 'dir'}"], f"pull of {name}@{target}")
        _dir_to_layout(tmp / "dir", tmp / "layout", target)
        file_pinned(tmp / "layout", out_layout, digest, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_layout, target


def file_pinned(layout: Path, out_layout: Path, digest: str, target: str) -> None:
    """Put a layout made beside ``out_layout`` in its place, every blob hashed on the way
    in, with the record a later pull (or import) of ``digest`` finds it by."""
    read_layout(layout)
    if out_layout.exists():
        shutil.rmtree(out_layout)
    layout.replace(out_layout)
    record = out_layout.parent / f"{out_layout.name}.pinned"
    record.write_text(f"{digest} {target}\n")


def _dir_to_layout(src: Path, dst: Path, digest: str) -> None:
    """File a skopeo ``dir:`` copy (manifest.json + blobs by hex) as an OCI layout."""
    raw = (src / "manifest.json").read_bytes()
    if sha256_bytes(raw) != digest:
        raise FrankError(f"pulled manifest has digest {sha256_bytes(raw)}, expected {digest}")
    media_type = _json(raw, "pulled manifest").get("mediaType", OCI_MANIFEST)
    blobs = dst / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    for p in src.iterdir():
        if re.fullmatch(r"[0-9a-f]{64}", p.name):
            p.replace(blobs / p.name)
    (blobs / digest.split(":", 1)[1]).write_bytes(raw)
    (dst / "oci-layout").write_bytes(canonical_json({"imageLayoutVersion": "1.0.0"}))
    (dst / "index.json").write_bytes(canonical_json({
        "schemaVersion": 2, "mediaType": OCI_INDEX,
        "manifests": [{"mediaType": media_type, "digest": digest, "size": len(raw)}]}))


def _inspect_raw(ref: str, *, config: bool = False) -> bytes:
    exe = skopeo()
    args = [exe, "inspect", "--raw", *_tls_flags(ref, ("--tls-verify",))]
    if config:
        args.append("--config")
    proc = subprocess.run([*args, f"docker://{ref}"], capture_output=True)
    if proc.returncode != 0:
        why = _skopeo_error(proc.stderr.decode(errors="replace"))
        raise unreachable(ref, why) or FrankError(f"cannot read {ref}: {why}")
    return proc.stdout


_NO_ROUTE = re.compile(r"pinging container registry|dial tcp|no such host|connection refused|"
                       r"i/o timeout|network is unreachable|TLS handshake timeout|"
                       r"server misbehaving|Temporary failure in name resolution")


def unreachable(ref: str, why: str) -> FrankError | None:
    """One line for a registry that cannot be reached (skopeo says "Error parsing image
    name" first, which misleads): the host, what was needed, what to do instead; None for
    any other failure."""
    if not _NO_ROUTE.search(why):
        return None
    host = ref.split("/", 1)[0]
    reason = next((m for m in ("connection refused", "no such host", "i/o timeout",
                               "network is unreachable", "TLS handshake timeout")
                   if m in why), "no answer")
    return FrankError(f"the registry {host} cannot be reached ({reason}): it was asked for "
                      f"{ref}, whose contents are needed once and then kept by digest; "
                      "where it cannot be reached, save the image on a machine that can "
                      f"(skopeo copy --preserve-digests docker://{ref} oci-archive:FILE) and run "
                      "`frank image import FILE` here")


def _json(data: bytes, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except ValueError:
        raise FrankError(f"{what} is not valid JSON") from None
    if not isinstance(doc, dict):
        raise FrankError(f"{what} is not a JSON object")
    return doc


def repository_of(ref: str) -> str:
    """``host/repo`` from ``host/repo[:tag][@digest]`` (a port is not a tag)."""
    name = ref.split("@", 1)[0]
    head, _, last = name.rpartition("/")
    if ":" in last:
        last = last.split(":", 1)[0]
    return f"{head}/{last}" if head else last


def inspect_remote(ref: str) -> ImageInfo:
    """Manifest and config of a registry image, digests checked."""
    raw = _inspect_raw(ref)
    digest = sha256_bytes(raw)
    if "@" in ref and ref.rsplit("@", 1)[1] != digest:
        raise FrankError(f"registry returned a manifest with digest {digest} for {ref}")
    manifest = _json(raw, f"manifest of {ref}")
    if "layers" not in manifest:  # an index: show this platform's image
        digest = _platform_instance(repository_of(ref), digest)
        raw = _inspect_raw(f"{repository_of(ref)}@{digest}")
        if sha256_bytes(raw) != digest:
            raise FrankError(f"registry returned other content for {digest}")
        manifest = _json(raw, f"manifest of {ref}")
    craw = _inspect_raw(f"{repository_of(ref)}@{digest}", config=True)
    if sha256_bytes(craw) != manifest["config"]["digest"]:
        raise FrankError(f"config of {ref} does not match the manifest's config digest")
    return image_info(ref, digest, manifest, _json(craw, f"config of {ref}"))


LOCK_DIGEST_KEY = "dev.frank.lock.digest"


def tag_for_stack(stack: str) -> str:
    """A stack name (or stack file path) made into a valid tag."""
    tag = re.sub(r"[^A-Za-z0-9_.-]", "-", Path(stack).stem or stack).lstrip(".-") or "stack"
    return tag[:128]


def default_tags(layout: Path, stack: str) -> list[str]:
    """The tags a push adds: the stack name, and ``lock-<hex>`` when the image names its lock.

    The lock digest comes from the manifest annotation (or config label)
    ``dev.frank.lock.digest`` that compose writes.
    """
    info = read_layout(Path(layout), verify_layers=False)
    tags = [tag_for_stack(stack)]
    lock = info.annotations.get(LOCK_DIGEST_KEY) or info.labels.get(LOCK_DIGEST_KEY)
    if lock and DIGEST_RE.match(lock):
        tags.append("lock-" + lock.split(":", 1)[1])
    return tags


def pull_layout(repository: str, digest: str, out_layout: Path) -> str:
    """Pull ``repository@digest`` into a fresh OCI layout; return the digest it holds."""
    if out_layout.exists():
        shutil.rmtree(out_layout)
    return pull_pinned(repository, digest, out_layout)[1]


def read_image(ref: str | Path) -> ImageInfo:
    """An OCI layout directory or a registry reference (``host/repo[:tag|@digest]``)."""
    p = Path(ref)
    if p.is_dir():
        return read_layout(p)
    return inspect_remote(str(ref))
