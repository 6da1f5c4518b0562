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

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from frank.errors import FrankError, _display_path
from frank.fsutil import write_atomic
from frank.hashing import sha256_file

DEBIAN_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
LOCK_COMMAND = "python -m frank.image.debs lock"


class DebsSource(BaseModel):
    """``[debs]``: Debian packages wanted in the base; their closure is resolved into a lock."""

    model_config = ConfigDict(extra="forbid")

    suite: str = "bookworm"
    packages: list[str] = Field(min_length=1)
    arch: str = "amd64"
    components: list[str] = ["main"]
    updates: bool = True  # also <suite>-updates from the archive
    security: bool = True  # also <suite>-security from the security archive
    archive: str | None = None  # default: the Debian mirror apt uses here
    security_archive: str | None = None  # default: the security mirror apt uses here
    keyring: str = DEBIAN_KEYRING  # checks each suite's InRelease signature (gpgv)
    trusted: bool = False  # true: an unsigned local archive (tests), as apt's [trusted=yes]

    @field_validator("packages")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        dup = sorted({p for p in v if v.count(p) > 1})
        if dup:
            raise ValueError(f"listed twice: {', '.join(dup)}")
        return v

    def suites(self) -> list[tuple[str, str]]:
        """(which archive, suite) pairs, in the order their Packages indexes are read."""
        out = [("debian", self.suite)]
        if self.updates:
            out.append(("debian", f"{self.suite}-updates"))
        if self.security:
            out.append(("debian-security", f"{self.suite}-security"))
        return out

    def content(self) -> dict[str, Any]:
        """What decides the lock's content (not URLs or trust settings)."""
        return {"suite": self.suite, "arch": self.arch, "components": self.components,
                "packages": sorted(self.packages),
                "suites": [f"{a}:{s}" for a, s in self.suites()]}


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
