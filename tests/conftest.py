"""Shared fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.spine_helpers import copy_repo


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A private copy of the repo's parts/stacks/images/sources to change freely."""
    return copy_repo(tmp_path / "repo")


TEST_CACHE = Path(__file__).resolve().parent.parent / ".cache" / "frank-test"


@pytest.fixture(autouse=True, scope="session")
def _answer_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Kept answers of `frank lock --check` and `frank diff` (frank.store.memo) go to a folder of
    this test session, not the user's cache; every test still goes through them. The store
    (FRANK_CACHE) is the repo's own test cache unless the caller names one (CI does): kept
    between runs, so a second run builds nothing again, and never the user's ~/.cache/frank."""
    os.environ.setdefault("FRANK_CACHE_DIR", str(tmp_path_factory.mktemp("frank-cache")))
    os.environ.setdefault("FRANK_CACHE", str(TEST_CACHE))
    # Commands under test say only their own words: with a cold cache a step of theirs runs
    # long enough for a progress line (frank.image.progress, tested on its own), which tests
    # that count an error's lines would take for a second line.
    os.environ.setdefault("FRANK_PROGRESS_AFTER", "3600")
