"""Shared fixtures."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import disk
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


class _SessionDirs:
    """Notes the folders a session (or package) fixture makes: kept for the whole run. A
    plugin of its own, not a conftest hook: pytest asks a session fixture's hooks of the
    plugins at the root only, where this folder's conftest does not apply."""

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef: pytest.FixtureDef[Any],
                             request: pytest.FixtureRequest) -> Iterator[Any]:
        if fixturedef.scope not in ("session", "package"):
            return (yield)
        base = request.config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
        before = {p.name for p in base.iterdir()}
        try:
            return (yield)
        finally:
            disk.keep_for_session(p.name for p in base.iterdir() if p.name not in before)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_SessionDirs(), "frank-session-dirs")


@pytest.fixture(autouse=True, scope="module")
def _give_disk_back(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """What a module made goes when it ends (``tests.disk``): its fixtures' folders, and,
    when it took more than ``GC_AFTER_BYTES`` of disk, what of the test store nothing in the
    repo references. Set up before the module's other fixtures, so it ends after them (their
    servers are stopped by then)."""
    base = tmp_path_factory.getbasetemp()
    before = {p.name for p in base.iterdir()}
    free = shutil.disk_usage(base).free
    yield
    for path in disk.module_dirs(base, before):
        disk.remove(path)
    if free - shutil.disk_usage(base).free > disk.GC_AFTER_BYTES:
        disk.gc_test_store(Path(os.environ.get("FRANK_CACHE", str(TEST_CACHE))))
