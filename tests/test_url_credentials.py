"""Issue 54 item 3: credentials never ride in a URL. A URL with user-info or a token-like
query is refused in every URL field of every kind (one line naming the file and field, the
secret not in it); ``frank pin --index`` never echoes one; a fetch takes credentials from
netrc at fetch time (the server asks, the store gets the file), and nothing writes them."""

from __future__ import annotations

import base64
import hashlib
import http.server
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import TypeAdapter, ValidationError

from frank.model.pins import GitUrl, IndexUrl, SafeHttpUrl
from tests.http_helpers import serve_handler
from tests.spine_helpers import frank

SECRET = "s3cr3tT0ken"
BAD = [
    f"https://user:{SECRET}@files.example.org/pkg-1.0-py3-none-any.whl",
    f"https://{SECRET}@files.example.org/pkg-1.0-py3-none-any.whl",  # a token as the user
    f"https://files.example.org/pkg-1.0-py3-none-any.whl?token={SECRET}",
    f"https://bucket.s3.amazonaws.com/pkg.whl?X-Amz-Signature={SECRET}&X-Amz-Date=1",
    f"https://acct.blob.core.windows.net/c/pkg.whl?sv=2024&sig={SECRET}",
]


@pytest.mark.parametrize("kind", [SafeHttpUrl, IndexUrl, GitUrl], ids=["http", "index", "git"])
@pytest.mark.parametrize("url", BAD)
def test_a_url_with_credentials_is_refused_without_echoing_them(kind: object, url: str) -> None:
    with pytest.raises(ValidationError) as info:
        TypeAdapter(kind).validate_python(url)
    said = str(info.value.errors()[0]["msg"])
    assert SECRET not in said and ("credentials" in said or "token-like" in said), said


@pytest.mark.parametrize("url", ["https://files.example.org/p/pkg-1.0-py3-none-any.whl",
                                 "https://files.example.org/p.whl?download=1"])
def test_a_plain_url_is_accepted(url: str) -> None:
    assert TypeAdapter(SafeHttpUrl).validate_python(url) == url


def test_an_ssh_user_is_not_a_credential() -> None:
    for url in ("git@github.com:org/repo.git", "ssh://git@example.org/org/repo.git"):
        assert TypeAdapter(GitUrl).validate_python(url) == url


@pytest.mark.parametrize(("manifest", "old", "field"), [
    ("parts/exl3-runtime/1.6.5.toml", "https://files.pythonhosted.org/", "wheel.url"),
    ("parts/mhc-overlap/moet-6cefd6fe.toml", "https://raw.githubusercontent.com/", "url"),
    ("parts/mhc-overlap/moet-6cefd6fe.toml", "https://github.com/", "source_repo"),
    ("parts/vllm-base/v0.24.0.toml", "https://files.pythonhosted.org/", "wheel.url"),
    ("parts/vllm-base/v0.24.0.toml", "https://github.com/", "repo"),
    ("parts/flashinfer-jit-cache/0.6.12-src.toml", "https://github.com/", "git.repo"),
])
def test_every_url_field_of_every_kind_refuses_credentials(repo: Path, manifest: str, old: str,
                                                            field: str) -> None:
    """The wheel URL (package, engine), the patch's URL and source repo, an engine's and a
    source build's git repo: each refused in one line, the secret never printed (the
    wheel URL used to be taken into the lock, plan.json and /etc/frank/frank.lock)."""
    path = repo / manifest
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, old.replace("://", f"://ci:{SECRET}@"), 1))
    result = frank("check", cwd=repo)
    assert result.code == 2, result.err
    line = result.err.strip().splitlines()[-1]
    head, _, last = field.rpartition(".")  # a union's member may stand between them
    assert manifest in line and f"{last}:" in line and head in line, line
    assert "credentials" in line and "***@" in line, line
    assert SECRET not in result.err + result.out


def test_pin_index_never_echoes_a_secret(repo: Path) -> None:
    result = frank("pin", "exl3-runtime@1.6.5", "--index",
                   f"https://ci:{SECRET}@127.0.0.1:9/simple", cwd=repo)
    assert result.code == 2, (result.out, result.err)
    assert SECRET not in result.err + result.out
    assert "--index" in result.err and "credentials" in result.err, result.err


@pytest.fixture
def guarded() -> Iterator[tuple[str, bytes]]:
    """A server on 127.0.0.1 that gives /pkg.bin only with Basic ci:SECRET."""
    body = b"guarded bytes\n"
    want = "Basic " + base64.b64encode(f"ci:{SECRET}".encode()).decode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.headers.get("Authorization") != want:
                self.send_response(401)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: object) -> None:
            pass

    with serve_handler(Handler) as url:
        yield f"{url}/pkg.bin", body


def test_a_fetch_takes_credentials_from_netrc_and_writes_them_nowhere(
        guarded: tuple[str, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from frank.errors import FrankError
    from frank.store.blobs import BlobStore
    from frank.store.fetch import Fetcher, Pinned

    url, body = guarded
    store = BlobStore(tmp_path / "store")
    item = Pinned(url, hashlib.sha256(body).hexdigest())
    monkeypatch.setenv("NETRC", str(tmp_path / "absent"))
    with pytest.raises(FrankError, match="HTTP 401"):
        Fetcher(store).fetch(item)
    netrc = tmp_path / "netrc"
    netrc.write_text(f"machine 127.0.0.1 login ci password {SECRET}\n")
    monkeypatch.setenv("NETRC", str(netrc))
    assert Fetcher(store).fetch(item).read_bytes() == body
    for path in (tmp_path / "store").rglob("*"):
        assert not path.is_file() or SECRET.encode() not in path.read_bytes(), path
