"""Shared fixtures."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import disk
from tests.smoke_served import (  # noqa: F401
    smoke_engines,
    smoke_plain,
    smoke_repo,
    smoke_with,
)
from tests.spine_helpers import copy_repo
from tests.vllm_server import SESSION_VLLM_CACHE


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A private copy of the repo's parts/stacks/images/sources to change freely."""
    return copy_repo(tmp_path / "repo")


TEST_CACHE = Path(__file__).resolve().parent.parent / ".cache" / "frank-test"
# uv's cache for `frank lock` and the like: the repo's too, kept between runs (a session home
# would start it cold in every session and every xdist worker)
TEST_UV_CACHE = TEST_CACHE.parent / "uv-test"
# The home the suite was started with: no test may see it (tests/test_own_caches.py).
CALLER_HOME = os.environ.get("HOME", "")


def _home(folder: Path) -> dict[str, str]:
    return {"HOME": str(folder), "XDG_CONFIG_HOME": str(folder / ".config"),
            "XDG_CACHE_HOME": str(folder / ".cache"), "XDG_DATA_HOME": str(folder / ".local/share"),
            "XDG_STATE_HOME": str(folder / ".local/state")}


@pytest.fixture(autouse=True, scope="session")
def _answer_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Nothing of the user's home: the session (its session and module fixtures, which build
    shared images) gets a home of its own, with its XDG folders (a key `frank keygen` wrote,
    ~/.cache, ~/.config are never seen). Kept answers of `frank lock --check` and `frank diff`
    (frank.store.memo) go to a folder of this session. The store (FRANK_CACHE) is the repo's
    own test cache, or FRANK_TEST_CACHE where the caller names one, never the caller's
    FRANK_CACHE: kept between runs (and shared by xdist workers, whose session homes differ),
    so a second run builds nothing again. uv's cache likewise (UV_CACHE_DIR wins)."""
    os.environ.update(_home(tmp_path_factory.mktemp("home")))
    os.environ["FRANK_CACHE_DIR"] = str(tmp_path_factory.mktemp("frank-cache"))
    os.environ["FRANK_CACHE"] = os.environ.get("FRANK_TEST_CACHE") or str(TEST_CACHE)
    os.environ.setdefault("UV_CACHE_DIR", str(TEST_UV_CACHE))
    # vLLM's cache for the engines tests start on the host (tests.vllm_server.vllm_env):
    # one per session, so only the first start inspects the model
    os.environ[SESSION_VLLM_CACHE] = str(tmp_path_factory.mktemp("vllm-cache"))
    for var in ("FRANK_SIGNING_KEY", "FRANK_VERIFY_KEY"):  # the caller's keys, by name
        os.environ.pop(var, None)
    # Commands under test say only their own words: with a cold cache a step of theirs runs
    # long enough for a progress line (frank.image.progress, tested on its own), which tests
    # that count an error's lines would take for a second line.
    os.environ.setdefault("FRANK_PROGRESS_AFTER", "3600")


@pytest.fixture(autouse=True)
def _own_home(tmp_path_factory: pytest.TempPathFactory,
              monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test its own home and XDG config folder (and so do the processes it starts,
    which inherit them): what one test writes there (a key) no other test reads. Caches
    (XDG_CACHE_HOME) stay the session's."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))


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


# The session's shared engines (tests.smoke_served) and, per name, the last test using it.
SHARED_ENGINES = ("smoke_engines",)
_LAST_USER = pytest.StashKey[dict[str, str]]()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session: pytest.Session, items: list[pytest.Item]) -> None:
    last: dict[str, str] = {}
    for item in items:
        for name in SHARED_ENGINES:
            if name in getattr(item, "fixturenames", ()):
                last[name] = item.nodeid
    session.stash[_LAST_USER] = last


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    """A shared engine stops after the last test that uses it, not when the session ends:
    the slow tests after it have its cores and 1.2 GB back. Its stop's checks
    (tests.smoke_served) fail that test's teardown."""
    result = yield
    if isinstance(item, pytest.Function):
        for name, nodeid in item.session.stash.get(_LAST_USER, {}).items():
            if nodeid == item.nodeid:
                for fixturedef in item._fixtureinfo.name2fixturedefs.get(name, ()):
                    # finish() reads only the request's node (for its error message)
                    fixturedef.finish(item._request)  # type: ignore[arg-type]
    return result
