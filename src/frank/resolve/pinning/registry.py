"""Resolve an image tag to its manifest digest through a registry's v2 API (HEAD request)."""

from __future__ import annotations

import re
import urllib.error
import urllib.request

from frank.errors import FrankError

ACCEPT = ", ".join([
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
])
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def split_ref(ref: str) -> tuple[str, str, str]:
    """``host[:port]/repo:tag`` -> (host, repo, tag); Docker Hub names get docker.io."""
    name, _, tag = ref.rpartition(":")
    if not name or "/" in tag:
        name, tag = ref, "latest"
    host, _, repo = name.partition("/")
    if "." not in host and ":" not in host and host != "localhost":
        host, repo = "registry-1.docker.io", name if "/" in name else f"library/{name}"
    elif host == "docker.io":
        host = "registry-1.docker.io"
    return host, repo, tag


def resolve_digest(ref: str) -> str:
    """``NAME@sha256:...`` for an image reference given by tag."""
    if "@" in ref:
        return ref
    host, repo, tag = split_ref(ref)
    scheme = "http" if host.startswith(("127.", "localhost")) else "https"
    url = f"{scheme}://{host}/v2/{repo}/manifests/{tag}"
    request = urllib.request.Request(url, method="HEAD", headers={"Accept": ACCEPT})
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            digest = resp.headers.get("Docker-Content-Digest", "")
    except urllib.error.HTTPError as exc:
        raise FrankError(f"registry {host} refused {repo}:{tag}: HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise FrankError(f"registry {host} is unreachable: {getattr(exc, 'reason', exc)}"
                         ) from None
    if not _DIGEST.fullmatch(digest):
        raise FrankError(f"registry {host} gave no digest for {repo}:{tag}")
    name = ref.rpartition(":")[0] if ":" in ref.rsplit("/", 1)[-1] else ref
    return f"{name}@{digest}"
