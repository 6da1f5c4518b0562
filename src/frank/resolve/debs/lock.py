"""The ``[debs]`` recipe and its lock file; reading and checking them needs no network.

The lock records the recipe fields that decide its content (suite, arch, components,
packages, which suites), so a lock that no longer matches its recipe is found offline.
Archive URLs are not in either digest: a .deb is named by its archive-relative path and
sha256, so any mirror (or a mirror folder) gives the same bytes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from frank.errors import NESTED_TOO_DEEP, FrankError, _display_path
from frank.fsutil import write_atomic
from frank.hashing import sha256_file
from frank.model.imagefile import DebsSource

LOCK_COMMAND = "python -m frank.cli.debs lock"


class LockedDeb(BaseModel):
    """One package of the closure, pinned by the .deb's sha256."""

    model_config = ConfigDict(extra="forbid")

    name: str
    version: str
    arch: str
    archive: Literal["debian", "debian-security"]
    suite: str
    filename: str  # archive-relative, e.g. pool/main/d/dash/dash_0.5.12-2_amd64.deb
    size: int
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class IndexRecord(BaseModel):
    """Which Packages index a suite's packages were read from (for the reader, not the build)."""

    model_config = ConfigDict(extra="forbid")

    archive: str
    suite: str
    component: str
    date: str  # the Release file's Date
    packages_sha256: str


class DebsLock(BaseModel):
    """``images/<name>.debs.lock``: the closure, sorted by name (the order it is unpacked in)."""

    model_config = ConfigDict(extra="forbid")

    format: Literal["frank-debs-lock-1"] = "frank-debs-lock-1"
    recipe: dict[str, Any]
    indexes: list[IndexRecord]
    packages: list[LockedDeb]


def lock_path(image_file: Path) -> Path:
    """``images/test-base.toml`` -> ``images/test-base.debs.lock``."""
    return image_file.with_suffix(".debs.lock")


def render_lock(lock: DebsLock) -> str:
    """Canonical text: sorted keys, two-space indent, one trailing newline."""
    return json.dumps(lock.model_dump(mode="json"), indent=2, sort_keys=True,
                      ensure_ascii=False) + "\n"


def write_lock(lock: DebsLock, path: Path) -> bool:
    """Write atomically; whether the file changed."""
    text = render_lock(lock)
    if path.is_file() and path.read_bytes() == text.encode():
        return False
    write_atomic(path, text)
    return True


def read_lock(path: Path) -> DebsLock:
    """Parse a lock file; any problem is one line naming it."""
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        recipe = _display_path(path.with_suffix("").with_suffix(".toml"))
        raise FrankError(f"the base's package lock is missing; write it with "
                         f"`{LOCK_COMMAND} {recipe}`", file=path) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FrankError(f"not JSON: {exc}", file=path) from None
    except RecursionError:
        raise FrankError(NESTED_TOO_DEEP, file=path) from None
    try:
        return DebsLock.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise FrankError(err["msg"], file=path,
                         field=".".join(str(x) for x in err["loc"]) or None) from None


def current_lock(src: DebsSource, image_file: Path) -> tuple[DebsLock, str]:
    """The lock beside ``image_file`` and its sha256, refused if missing or stale (offline)."""
    path = lock_path(image_file)
    lock = read_lock(path)
    if lock.recipe != src.content():
        raise FrankError(f"stale against {image_file.name} [debs]; re-resolve it with "
                         f"`{LOCK_COMMAND} {_display_path(image_file)}`", file=path)
    return lock, sha256_file(path)
