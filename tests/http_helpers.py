"""A folder served over HTTP on 127.0.0.1, for tests that need a package index or a URL."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def serve_folder(folder: Path, asked: list[str] | None = None) -> Iterator[str]:
    """``folder`` on a free port of 127.0.0.1 for the block: yields its base URL (no
    trailing slash); each request's path is appended to ``asked`` when given."""

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a: object, **k: object) -> None:
            super().__init__(*a, directory=str(folder), **k)  # type: ignore[arg-type]

        def log_message(self, *args: object) -> None:
            if asked is not None:
                asked.append(self.path)

    with serve_handler(Handler) as url:
        yield url


@contextmanager
def serve_handler(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """A server of ``handler`` on a free port of 127.0.0.1 for the block: yields its URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
