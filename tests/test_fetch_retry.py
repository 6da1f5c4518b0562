"""A download that fails in a way that may pass is tried again; one that cannot pass is not
(a CI run was lost to one "Temporary failure in name resolution")."""

from __future__ import annotations

import hashlib
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from frank.errors import FrankError
from frank.store import fetch
from frank.store.blobs import BlobStore
from frank.store.fetch import Fetcher, Pinned

BODY = b"wheel bytes " * 1000


@pytest.fixture
def server() -> Iterator[tuple[str, list[str]]]:
    """/cut: the first request's body is cut short, the second answers 503, then the file;
    /gone: always 404. Every request's path is recorded."""
    asked: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            tries = asked.count(self.path)
            if self.path == "/gone":
                self.send_error(404)
                return
            if tries == 2:
                self.send_error(503)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(BODY)))
            self.end_headers()
            self.wfile.write(BODY if tries > 2 else BODY[:100])  # the first: cut short
            self.close_connection = True

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", asked
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_cut_body_and_a_503_are_tried_again_and_the_pinned_file_arrives(
        server: tuple[str, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetch, "RETRY_AFTER", (0.0, 0.0, 0.0))
    url, asked = server
    fetcher = Fetcher(BlobStore(tmp_path / "cache"))
    path = fetcher.fetch(Pinned(f"{url}/cut", hashlib.sha256(BODY).hexdigest()))
    assert path.read_bytes() == BODY
    assert asked == ["/cut"] * 3 and fetcher.retried == 2
    assert not any((tmp_path / "cache" / "tmp").iterdir())  # the cut tries left nothing


def test_a_404_is_not_tried_again_and_is_one_line(
        server: tuple[str, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetch, "RETRY_AFTER", (0.0, 0.0, 0.0))
    url, asked = server
    fetcher = Fetcher(BlobStore(tmp_path / "cache"))
    with pytest.raises(FrankError) as err:
        fetcher.fetch(Pinned(f"{url}/gone", "0" * 64))
    assert asked == ["/gone"] and fetcher.retried == 0
    assert "HTTP 404" in err.value.message and "\n" not in err.value.message


def test_a_failure_that_lasts_is_reported_with_its_tries(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing listens on the port: every try fails, and the one line says how many."""
    import socket

    monkeypatch.setattr(fetch, "RETRY_AFTER", (0.0, 0.0))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: a refused connection
    fetcher = Fetcher(BlobStore(tmp_path / "cache"))
    with pytest.raises(FrankError, match=r"tried 3 times"):
        fetcher.fetch(Pinned(f"http://127.0.0.1:{port}/x", "0" * 64))
    assert fetcher.retried == 2
