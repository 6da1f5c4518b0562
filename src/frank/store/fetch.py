"""Fetch pinned files on the host into the content-addressed store, verified before use.

Every input a build needs (a wheel, a patch, a .deb, a toolchain) is named by URL and
sha256. It is looked up in the store first, then in each mirror directory (``--mirror`` /
``FRANK_MIRROR``: files named by their sha256 hex, for air-gapped builds), and only then
downloaded, honouring the host's proxy variables and CA bundle (the pip/uv configuration
a TLS-intercepting proxy needs). The bytes enter the store only if their sha256 matches,
so a build step never sees an unverified file and never needs the network itself.
"""

from __future__ import annotations

import configparser
import http.client
import os
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from frank.errors import FrankError
from frank.store.blobs import BlobStore

_CHUNK = 1 << 20
DEFAULT_JOBS = 6
# seconds before each new try of a download that failed in a way that may pass (a CI run
# lost 26 minutes to one "Temporary failure in name resolution"); the content is checked
# against its pin whichever try brings it
RETRY_AFTER = (1.0, 3.0, 9.0)
_TRANSIENT_HTTP = frozenset({408, 425, 429, 500, 502, 503, 504})
_CA_CANDIDATES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")


@dataclass(frozen=True)
class Pinned:
    """One file to fetch: where it is published and the sha256 (hex) it must have."""

    url: str
    sha256: str
    size: int | None = None

    @property
    def digest(self) -> str:
        return "sha256:" + self.sha256


def mirror_dirs(extra: Iterable[Path] = ()) -> list[Path]:
    """Mirror folders to consult before the network: ``--mirror`` ones, then FRANK_MIRROR."""
    env = [Path(p) for p in os.environ.get("FRANK_MIRROR", "").split(os.pathsep) if p]
    return [*extra, *env]


def _pip_config_cert() -> str | None:
    home = Path.home()
    for path in ("/etc/pip.conf", "/etc/xdg/pip/pip.conf", home / ".config/pip/pip.conf",
                 home / ".pip/pip.conf"):
        parser = configparser.ConfigParser()
        try:
            parser.read(path)
        except configparser.Error:
            continue
        if parser.has_option("global", "cert"):
            return parser.get("global", "cert")
    return None


def ca_bundle() -> str | None:
    """The CA bundle the host's package tools trust (env first, then pip's config, then the OS)."""
    for var in ("FRANK_CA_BUNDLE", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT",
                "UV_NATIVE_TLS_CA"):
        if os.environ.get(var) and Path(os.environ[var]).is_file():
            return os.environ[var]
    cert = _pip_config_cert()
    if cert and Path(cert).is_file():
        return cert
    return next((c for c in _CA_CANDIDATES if Path(c).is_file()), None)


def _ssl_context() -> ssl.SSLContext:
    bundle = ca_bundle()
    return ssl.create_default_context(cafile=bundle) if bundle else ssl.create_default_context()


def netrc_auth(url: str) -> dict[str, str]:
    """An ``Authorization`` header for ``url``'s host from ``$NETRC`` or ``~/.netrc`` (what
    uv and pip read too), or none: credentials are read when fetching and never written
    anywhere (a URL that carries them is refused: ``frank.model.pins.check_no_credentials``)."""
    import base64
    import netrc

    host = urllib.parse.urlsplit(url).hostname
    path = Path(os.environ.get("NETRC") or Path.home() / ".netrc")
    if not host or not path.is_file():
        return {}
    try:
        found = netrc.netrc(str(path)).authenticators(host)
    except (netrc.NetrcParseError, OSError):
        return {}
    if not found or found[2] is None:
        return {}
    login, _, password = found
    token = base64.b64encode(f"{login}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def _reader(path: Path) -> Callable[[], IO[bytes]]:
    return lambda: path.open("rb")


def not_available(item: Pinned, why: str, mirrors: list[Path]) -> FrankError:
    """The one line a missing pinned file gives: URL, hash, and where a mirror copy may go."""
    where = (mirrors[0] if mirrors else Path("$FRANK_MIRROR")) / item.sha256
    return FrankError(f"cannot fetch {item.url} (sha256 {item.sha256}): {why}; "
                      f"put the file at {where} (--mirror DIR or FRANK_MIRROR)")


class Fetcher:
    """Brings pinned files into a store; thread-safe, one download per file."""

    def __init__(self, store: BlobStore | None = None, mirrors: Iterable[Path] = ()):
        self.store = store or BlobStore()
        self.mirrors = mirror_dirs(mirrors)
        self.downloaded = 0  # counts, for tests and the benchmark
        self.from_mirror = 0
        self.cached = 0
        self.retried = 0  # downloads tried again after a transient failure
        self._ssl: ssl.SSLContext | None = None
        self._lock = threading.Lock()

    def _context(self) -> ssl.SSLContext:
        """One TLS context for every download (loading the CA bundle costs about 10 ms of
        CPU: 200 wheels made that 2 s)."""
        with self._lock:
            if self._ssl is None:
                self._ssl = _ssl_context()
            return self._ssl

    def fetch(self, item: Pinned) -> Path:
        """The verified store path of ``item``, fetched if the store lacks it."""
        digest = item.digest
        if self.store.has(digest):
            try:
                path = self.store.verified_path(digest)
                self.cached += 1
                return path
            except FrankError:
                pass  # moved aside; fetch a good copy
        for mirror in self.mirrors:
            candidate = mirror / item.sha256
            if candidate.is_file():
                self._put(_reader(candidate), item, f"mirror file {candidate}")
                self.from_mirror += 1
                return self.store.verified_path(digest)
        self._download(item)
        self.downloaded += 1
        return self.store.verified_path(digest)

    def fetch_all(self, items: Iterable[Pinned], *, jobs: int = DEFAULT_JOBS,
                  progress: Callable[[Pinned], None] | None = None) -> dict[str, Path]:
        """Fetch many files in parallel; sha256 hex -> store path. The first failure raises."""
        unique = {i.sha256: i for i in items}

        def one(item: Pinned) -> tuple[str, Path]:
            path = self.fetch(item)
            if progress is not None:
                progress(item)
            return item.sha256, path

        pool = ThreadPoolExecutor(max_workers=max(1, jobs))
        futures = [pool.submit(one, item) for item in unique.values()]
        try:
            return dict(f.result() for f in as_completed(futures))
        finally:  # the first failure stops the queue: no 4 GB download before its one line
            pool.shutdown(wait=True, cancel_futures=True)

    def _put(self, opener: Callable[[], IO[bytes]], item: Pinned, what: str) -> None:
        """Stream into the store; content that is not the pinned hash never enters it.

        One buffer per file, read into (``readinto``): an HTTP response's ``read(n)`` makes
        a new n-byte buffer and a copy of it for every chunk."""
        buf = memoryview(bytearray(_CHUNK))
        try:
            with self.store.writer(expected=item.digest) as w, opener() as src:
                while n := src.readinto(buf):  # type: ignore[attr-defined]
                    w.write(buf[:n])
                left = getattr(src, "length", None)  # an HTTP body's bytes still owed
                if left:  # the connection ended early: readinto just stops (tried again)
                    raise http.client.IncompleteRead(b"", left)
        except FrankError as exc:
            raise FrankError(f"{what}: {exc.message}") from None

    def _download(self, item: Pinned) -> None:
        parsed = urllib.parse.urlparse(item.url)
        if parsed.scheme == "file":
            path = Path(urllib.parse.unquote(parsed.path))
            if not path.is_file():
                raise not_available(item, f"{path} does not exist", self.mirrors)
            self._put(_reader(path), item, str(path))
            return
        if parsed.scheme not in ("https", "http"):
            # plain http is fine for a pinned file (Debian's archive): the sha256 is the check
            raise not_available(item, "only https://, http:// and file:// URLs are fetched",
                                self.mirrors)
        request = urllib.request.Request(item.url, headers={"User-Agent": "frank",
                                                            **netrc_auth(item.url)})
        context = self._context()
        for attempt in range(1 + len(RETRY_AFTER)):
            try:
                self._put(lambda: urllib.request.urlopen(
                    request, timeout=60, context=context), item, item.url)
                return
            except urllib.error.HTTPError as exc:
                why, again = f"HTTP {exc.code}", exc.code in _TRANSIENT_HTTP
            except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
                # a name that did not resolve this once, a reset, a timeout, a body cut short
                why, again = str(getattr(exc, "reason", None) or exc) or type(exc).__name__, True
            if not again or attempt == len(RETRY_AFTER):
                break
            self.retried += 1
            time.sleep(RETRY_AFTER[attempt])
        more = f" (tried {attempt + 1} times)" if attempt else ""
        raise not_available(item, why + more, self.mirrors) from None
