"""The suite never falls back to the user's own frank cache (~/.cache/frank) nor reads the
user's home: the store is the repo's test cache (.cache/frank-test) or the one the caller
names with FRANK_TEST_CACHE; the session and each test have a home (and XDG folders) of their
own, which the processes tests start inherit; a test that needs another sets it with
monkeypatch, which puts the session's back."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

from frank.store.blobs import default_root
from tests import conftest

# The home the suite was started with (read at collection, before any fixture runs)
CALLER_HOME: str = getattr(conftest, "CALLER_HOME", os.environ.get("HOME", ""))


def test_the_store_is_named_for_the_whole_session() -> None:
    assert os.environ.get("FRANK_CACHE"), "conftest names a store for the session"
    assert default_root() == Path(os.environ["FRANK_CACHE"]).expanduser()


def _homes_seen() -> dict[str, str]:
    """What a process the test starts takes for its home and its config and cache folders."""
    code = ("import json, os, pathlib; print(json.dumps({'home': str(pathlib.Path.home()), "
            "'expand': os.path.expanduser('~'), **{k: os.environ.get(k, '') for k in "
            "('XDG_CONFIG_HOME', 'XDG_CACHE_HOME', 'FRANK_CACHE', 'FRANK_CACHE_DIR')}}))")
    seen: dict[str, str] = json.loads(subprocess.run([sys.executable, "-c", code],
                                                     capture_output=True, text=True,
                                                     check=True).stdout)
    return seen


def test_no_test_sees_the_callers_home() -> None:
    """Neither this process nor one it starts: HOME, ~ and the XDG folders are the test's,
    away from the home the suite was started with and the account's own."""
    real = {h for h in (CALLER_HOME, pwd.getpwuid(os.getuid()).pw_dir) if h}
    here = {"home": str(Path.home()), "expand": os.path.expanduser("~"),
            **{k: os.environ.get(k, "") for k in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME",
                                                    "FRANK_CACHE", "FRANK_CACHE_DIR")}}
    for seen in (here, _homes_seen()):
        for key, value in seen.items():
            assert value, (key, seen)
            for home in real:
                assert value != home and not value.startswith(home.rstrip("/") + "/.") \
                    and not Path(value).is_relative_to(Path(home) / ".cache"), (key, value)
        assert seen["home"] == seen["expand"] == os.environ["HOME"]


def test_each_test_has_a_home_of_its_own(tmp_path: Path) -> None:
    """A file one test leaves in its home is not in the next one's (see the next test)."""
    marker = Path.home() / ".config" / "frank" / "left-by-a-test"
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(str(tmp_path))


def test_each_test_has_a_home_of_its_own_too() -> None:
    assert not (Path.home() / ".config" / "frank" / "left-by-a-test").exists()
    assert Path(os.environ["XDG_CONFIG_HOME"]).is_relative_to(Path.home())
