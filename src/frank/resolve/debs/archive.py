"""A suite's Packages index, trusted through the archive's signed InRelease.

The InRelease file is checked with ``gpgv`` against the Debian archive keyring; it names
the sha256 of each Packages index, which is then fetched by that hash (``by-hash`` where
the archive offers it, so an archive update mid-read cannot mix versions) through the
Fetcher, hence cached in the store. The Packages index in turn carries each .deb's
sha256, which the lock keeps: every byte a base is built from hangs off a signature.
Only resolution reads indexes; a build from the lock never does.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import re
import shutil
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from debian.deb822 import Packages, Release

from frank.errors import FrankError
from frank.model.imagefile import DebsSource
from frank.resolve.debs.lock import IndexRecord
from frank.store.fetch import Fetcher, Pinned, ca_bundle

# Only what resolution and the lock read (a full parse of bookworm main takes ~3x longer).
FIELDS = ["Package", "Version", "Architecture", "Depends", "Pre-Depends", "Provides",
          "Priority", "Filename", "Size", "SHA256"]
_DECOMPRESS: dict[str, Callable[[bytes], bytes]] = {
    ".xz": lzma.decompress, ".gz": gzip.decompress, ".bz2": bz2.decompress, "": lambda b: b}


@dataclass(frozen=True)
class Index:
    """One suite's parsed Packages index and where it came from."""

    archive: str  # "debian" | "debian-security"
    suite: str
    record: IndexRecord
    packages: list[Packages]


def _read_url(url: str, *, file: Path) -> bytes:
    bundle = ca_bundle()
    context = ssl.create_default_context(cafile=bundle) if bundle else None
    req = urllib.request.Request(url, headers={"User-Agent": "frank"})
    try:
        with urllib.request.urlopen(req, timeout=60, context=context) as resp:
            data: bytes = resp.read()
            return data
    except urllib.error.HTTPError as exc:
        raise FrankError(f"cannot read {url}: HTTP {exc.code}", file=file,
                         field="debs") from None
    except (urllib.error.URLError, OSError) as exc:
        raise FrankError(f"cannot read {url}: {getattr(exc, 'reason', exc)}", file=file,
                         field="debs") from None


def _verified_release(root: str, suite: str, src: DebsSource, *, file: Path) -> Release:
    """The suite's Release fields; signature-checked unless the recipe says trusted."""
    base = f"{root.rstrip('/')}/dists/{suite}"
    if src.trusted:
        try:
            text = _read_url(f"{base}/InRelease", file=file)
        except FrankError:
            text = _read_url(f"{base}/Release", file=file)
        return Release(text)  # a clear-signed text's armour is stripped by the parser
    signed = _read_url(f"{base}/InRelease", file=file)
    keyring = Path(src.keyring)
    if not keyring.is_file():
        raise FrankError(f"keyring {keyring} not found (apt-get install "
                         "debian-archive-keyring)", file=file, field="debs.keyring")
    if shutil.which("gpgv") is None:
        raise FrankError("gpgv is not installed (apt-get install gpgv); it checks the "
                         "archive's signature", file=file, field="debs")
    proc = subprocess.run(["gpgv", "--keyring", str(keyring), "--output", "-", "-"],
                          input=signed, capture_output=True)
    if proc.returncode != 0:
        why = proc.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["?"]
        raise FrankError(f"{base}/InRelease: bad or unknown signature ({why[0]})",
                         file=file, field="debs.keyring")
    return Release(proc.stdout)


def read_index(root: str, archive: str, suite: str, component: str, src: DebsSource,
               fetcher: Fetcher, *, file: Path) -> Index:
    """Fetch, verify and parse ``dists/<suite>/<component>/binary-<arch>/Packages``."""
    release = _verified_release(root, suite, src, file=file)
    rel = f"{component}/binary-{src.arch}/Packages"
    entries = {e["name"]: e for e in release.get("SHA256", [])}
    ext = next((x for x in (".xz", ".gz", ".bz2", "") if rel + x in entries), None)
    if ext is None:
        raise FrankError(f"{root}/dists/{suite}/Release lists no {rel} index", file=file,
                         field="debs")
    entry = entries[rel + ext]
    sha, size = entry["sha256"], int(entry["size"])
    dists = f"{root.rstrip('/')}/dists/{suite}"
    by_hash = release.get("Acquire-By-Hash", "no") == "yes"
    url = (f"{dists}/{component}/binary-{src.arch}/by-hash/SHA256/{sha}" if by_hash
           else f"{dists}/{rel}{ext}")
    path = fetcher.fetch(Pinned(url, sha, size))
    try:
        text = _DECOMPRESS[ext](path.read_bytes()).decode()
    except (OSError, EOFError, lzma.LZMAError, UnicodeDecodeError) as exc:
        raise FrankError(f"{url}: cannot decompress: {exc}", file=file, field="debs") from None
    paras = list(Packages.iter_paragraphs(text.splitlines(keepends=True), fields=FIELDS,
                                          use_apt_pkg=False))
    record = IndexRecord(archive=archive, suite=suite, component=component,
                         date=release.get("Date", ""), packages_sha256=sha)
    return Index(archive=archive, suite=suite, record=record, packages=paras)


def apt_mirror(*, security: bool = False, suite: str = "bookworm") -> str:
    """The Debian mirror apt is configured with here (deb822 or one-line sources).

    ``security``: the mirror of ``<suite>-security`` (Debian keeps it apart) instead.
    """
    default = "http://deb.debian.org/debian" + ("-security" if security else "")
    for f in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        for stanza in f.read_text().split("\n\n"):
            is_security = "debian-security" in stanza or bool(
                re.search(r"^Suites:.*-security\b", stanza, re.M))
            if is_security != security:
                continue
            if re.search(rf"^Suites:.*\b{re.escape(suite)}\b", stanza, re.M):
                m = re.search(r"^URIs:\s*(\S+)", stanza, re.M)
                if m:
                    return m.group(1)
    lst = Path("/etc/apt/sources.list")
    if lst.is_file():
        for line in lst.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[0] == "deb" and parts[2].startswith(suite) and \
                    ("security" in parts[2]) == security:
                return parts[1]
    return default
