"""The test suite gives disk back as it goes: CI's machine has a small disk, and a clean run
filled it (the served-cpu image is 2.2 GB as layer blobs, again in the engine storage that
runs it, again in Docker's; about 35 GB over a whole run when nothing was freed).

The folders session fixtures make are kept for the whole run (``conftest`` notes them as each
one is set up); every other folder a module's fixtures make goes when the module ends
(``conftest._give_disk_back``), and so does whatever of the test store nothing in the repo
references (``frank gc``).
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_SESSION: set[str] = set()
# A module that took less than this from the disk leaves the store as it is: gc walks the
# store and asks the engine for its images, which costs a second or two.
GC_AFTER_BYTES = 500 * 10**6


def keep_for_session(names: Iterable[str]) -> None:
    """Folders of the base temp a session fixture made: never removed by a module."""
    _SESSION.update(names)


def module_dirs(base: Path, before: set[str]) -> list[Path]:
    """The folders made under ``base`` since ``before`` by module fixtures: not a session
    fixture's, and not a test's own (``test_...``: pytest removes a passed test's at its
    end and keeps a failed one's to read)."""
    return sorted(p for p in base.iterdir() if p.name not in before
                  and p.name not in _SESSION and not p.name.startswith("test_"))


def remove(path: Path) -> None:
    """Remove ``path``, unmounting first what an engine left mounted below it."""
    from frank.store.tmpdirs import unmount_under

    if path.is_symlink():  # pytest's ``<name>current`` link to the newest of a name
        path.unlink(missing_ok=True)
        return
    with contextlib.suppress(OSError):
        unmount_under(path)
    shutil.rmtree(path, ignore_errors=True)


def gc_test_store(store: Path) -> None:
    """``frank gc --keep-days 0`` on the test store, from the repo (its locks keep the
    wheels): only a store inside this repo's own ``.cache``, never one a caller named."""
    from frank.ship.gc import collect
    from frank.store.blobs import leave_users

    if not store.resolve().is_relative_to(REPO / ".cache"):
        return
    leave_users(store)  # a test that used the store in this process holds it shared
    collect(store, REPO, keep_days=0, wait=30)
