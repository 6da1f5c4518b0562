"""Resolve a release on a package index to one wheel's URL and sha256 (PEP 503 / PEP 691)."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from html.parser import HTMLParser

from frank.errors import FrankError
from frank.model.pins import wheel_filename


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href")
        if tag == "a" and href:
            self.links.append(href)


def _files(index: str, project: str) -> list[tuple[str, str, str]]:
    """(filename, absolute url, sha256) of every file the index lists for a project."""
    page = f"{index.rstrip('/')}/{_normalize(project)}/"
    from frank.model.pins import check_no_credentials, redact_url
    from frank.store.fetch import netrc_auth

    try:
        check_no_credentials(index)
    except ValueError as exc:
        raise FrankError(str(exc), field="--index") from None
    request = urllib.request.Request(page, headers={
        "Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1", **netrc_auth(page)})
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            body = resp.read().decode()
            ctype = resp.headers.get("Content-Type", "")
    except (urllib.error.URLError, OSError) as exc:
        raise FrankError(f"index {redact_url(page)}: "
                         f"{redact_url(str(getattr(exc, 'reason', exc)))}") from None
    out = []
    if "json" in ctype:
        for f in json.loads(body).get("files", []):
            if "sha256" in f.get("hashes", {}):
                out.append((f["filename"], urllib.parse.urljoin(page, f["url"]),
                            f["hashes"]["sha256"]))
        return out
    parser = _Links()
    parser.feed(body)
    for href in parser.links:
        url, _, frag = urllib.parse.urljoin(page, href).partition("#")
        if frag.startswith("sha256="):
            out.append((wheel_filename(url), url, frag[len("sha256="):]))
    return out


def resolve_wheel(index: str, project: str, version: str,
                  tag_hint: str | None = None) -> tuple[str, str]:
    """(url, sha256) of the release's wheel; several wheels need ``tag_hint`` to choose.
    A file is the release's when its name parses as a wheel of the project at an equal
    version (PEP 440: ``1.0+CU128`` is ``1.0+cu128``)."""
    from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
    from packaging.version import InvalidVersion, Version

    try:
        want = Version(version)
    except InvalidVersion:
        raise FrankError(f"{version!r} is not a version (PEP 440)") from None

    def release(filename: str) -> bool:
        try:
            name, ver, _, _ = parse_wheel_filename(filename)
        except InvalidWheelFilename:
            return False
        return name == canonicalize_name(project) and ver == want

    wheels = [(n, u, h) for n, u, h in _files(index, project) if release(n)]
    if tag_hint:
        wheels = [w for w in wheels if tag_hint in w[0]]
    if not wheels:
        raise FrankError(f"index {index} has no wheel of {project} {version}"
                         + (f" matching {tag_hint!r}" if tag_hint else ""))
    if len(wheels) > 1:
        names = ", ".join(w[0] for w in wheels[:4])
        raise FrankError(f"{len(wheels)} wheels of {project} {version} ({names}); "
                         "choose one with --wheel-tag")
    _, url, sha = wheels[0]
    return url, sha
