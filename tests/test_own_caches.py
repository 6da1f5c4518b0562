"""The suite never falls back to the user's own frank cache (~/.cache/frank): the store is the
one the caller names (CI: its own) or the repo's test cache (.cache/frank-test); a test that
needs another sets it with monkeypatch, which puts the session's back."""

from __future__ import annotations

import os
from pathlib import Path

from frank.store.blobs import default_root


def test_the_store_is_named_for_the_whole_session() -> None:
    assert os.environ.get("FRANK_CACHE"), "conftest names a store for the session"
    assert default_root() == Path(os.environ["FRANK_CACHE"]).expanduser()

