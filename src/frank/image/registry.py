"""Push OCI layouts to a registry and read them back, through skopeo.

skopeo (Debian package ``skopeo``) speaks the registry protocol without a daemon. A push
goes to ``HOST/REPO@<manifest digest>`` first, so the registry holds exactly the bytes the
layout holds, and only then are tags added (each a copy that finds every blob present).
``--preserve-digests`` makes skopeo refuse rather than silently convert manifests, and
every digest skopeo reports is compared with the layout's. TLS verification is off only
for loopback hosts (the test registry); anything else is verified.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from frank.errors import FrankError
from frank.image.oci import ImageInfo, image_info, resolve_manifest
from frank.image.store import DIGEST_RE, sha256_bytes

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


def _skopeo() -> str:
    exe = shutil.which("skopeo")
    if exe is None:
        raise FrankError("skopeo is not installed; apt-get install skopeo (needed to push "
                         "and pull images)")
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
        raise FrankError(f"{what} failed: {_skopeo_error(proc.stderr or proc.stdout)}")
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
                tags: list[str] | tuple[str, ...] = ()) -> PushResult:
    """Push the image in ``layout`` to ``repository`` by digest, then add ``tags``."""
    layout = Path(layout).absolute()
    check_repository(repository)
    for t in tags:
        if not _TAG_RE.match(t):
            raise FrankError(f"not a valid tag: {t!r}", field="tag")
    digest, _, _ = resolve_manifest(layout)
    exe = _skopeo()
    src = f"oci:{layout}"
    with tempfile.TemporaryDirectory(prefix="frank-push-") as tmp:
        for dest in [f"{repository}@{digest}", *(f"{repository}:{t}" for t in tags)]:
            dfile = Path(tmp) / "digest"
            _run([exe, "copy", "--quiet", "--preserve-digests", "--digestfile", str(dfile),
                  *_tls_flags(repository, ("--dest-tls-verify",)), src, f"docker://{dest}"],
                 f"push to {dest}")
            got = dfile.read_text().strip()
            if got != digest:
                raise FrankError(f"registry stored {got} for {dest}, expected {digest}")
    return PushResult(repository=repository, digest=digest, tags=list(tags))


def pull_pinned(name: str, digest: str, out_layout: Path) -> Path:
    """Copy ``name@digest`` from a registry into an OCI layout (cached: a second call is free)."""
    if not DIGEST_RE.match(digest):
        raise FrankError(f"not a sha256 digest: {digest!r}")
    out_layout = Path(out_layout).absolute()
    try:
        if resolve_manifest(out_layout)[0] == digest:
            return out_layout
    except FrankError:
        pass
    exe = _skopeo()
    out_layout.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_layout.name}.tmp-", dir=out_layout.parent))
    try:
        _run([exe, "copy", "--quiet", "--preserve-digests",
              *_tls_flags(name, ("--src-tls-verify",)),
              f"docker://{name}@{digest}", f"oci:{tmp}"], f"pull of {name}@{digest}")
        got, _, _ = resolve_manifest(tmp)
        if got != digest:
            raise FrankError(f"pulled {name}@{digest} but the layout holds {got}")
        if out_layout.exists():
            shutil.rmtree(out_layout)
        tmp.replace(out_layout)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_layout


def _inspect_raw(ref: str, *, config: bool = False) -> bytes:
    exe = _skopeo()
    args = [exe, "inspect", "--raw", *_tls_flags(ref, ("--tls-verify",))]
    if config:
        args.append("--config")
    proc = subprocess.run([*args, f"docker://{ref}"], capture_output=True)
    if proc.returncode != 0:
        why = _skopeo_error(proc.stderr.decode(errors="replace"))
        raise FrankError(f"cannot read {ref}: {why}")
    return proc.stdout


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
    if "layers" not in manifest:
        raise FrankError(f"{ref} is an image index, not an image; name a platform image by "
                         "digest")
    craw = _inspect_raw(f"{repository_of(ref)}@{digest}", config=True)
    if sha256_bytes(craw) != manifest["config"]["digest"]:
        raise FrankError(f"config of {ref} does not match the manifest's config digest")
    return image_info(ref, digest, manifest, _json(craw, f"config of {ref}"))


def pull_layout(repository: str, digest: str, out_layout: Path) -> str:
    """Pull ``repository@digest`` into a fresh OCI layout; return the digest it holds."""
    if out_layout.exists():
        shutil.rmtree(out_layout)
    pull_pinned(repository, digest, out_layout)
    return resolve_manifest(out_layout)[0]
