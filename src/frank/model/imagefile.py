"""``images/<name>.toml``: a base pinned by digest or by pinned Debian packages, as written.

What a person writes about a base; resolving ``[debs]`` into a lock is frank.resolve.debs,
making the base's layout is frank.assemble.base.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from frank.errors import FrankError
from frank.model.pins import DIGEST_RE
from frank.model.tomlio import read_text

DEBIAN_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"


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


DEBOOTSTRAP_GONE = ("debootstrap bases are no longer made (two machines got two digests); "
                    "pin the packages instead: write [debs] and run `frank debs lock`")


_REF_RE = re.compile(
    r"^(?P<name>[a-z0-9][a-z0-9._/:-]*?)(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
    r"(?:@(?P<digest>sha256:[0-9a-f]{64}))?$"
)


class BaseImageFile(BaseModel):
    """One ``images/<name>.toml``: a base pinned by digest or by pinned .debs."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    ref: str | None = None
    debs: DebsSource | None = None

    @model_validator(mode="after")
    def _one_source(self) -> BaseImageFile:
        if (self.ref is None) == (self.debs is None):
            raise ValueError("give exactly one of 'ref' or '[debs]'")
        return self


def parse_pinned_ref(ref: str, *, file: Path | str | None = None) -> tuple[str, str]:
    """Split ``name[:tag]@sha256:...`` into (name, digest); a tag-only ref is an error."""
    if ref.startswith("oci:"):
        body, sep, digest = ref[4:].rpartition("@")
        if not sep or not DIGEST_RE.match(digest):
            raise FrankError(f"base image {ref!r} is not pinned by digest; "
                             "write oci:DIR@sha256:<64 hex>", file=file, field="ref")
        return "oci:" + body, digest
    m = _REF_RE.match(ref)
    if not m:
        raise FrankError(f"not an image reference: {ref!r}", file=file, field="ref")
    if not m.group("digest"):
        raise FrankError(f"base image {ref!r} is named by tag only; pin it by digest "
                         "(name@sha256:<64 hex>)", file=file, field="ref")
    return m.group("name"), m.group("digest")


def load_image_file(path: Path) -> BaseImageFile:
    """Parse and validate ``images/<name>.toml``; any problem is one line naming the file."""
    text = read_text(Path(path), missing="image file not found")
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise FrankError(f"invalid TOML: {exc}", file=path) from None
    if "debootstrap" in raw:
        raise FrankError(DEBOOTSTRAP_GONE, file=path, field="debootstrap")
    try:
        img = BaseImageFile.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"]) or None
        raise FrankError(err["msg"], file=path, field=loc) from None
    if img.ref is not None:
        parse_pinned_ref(img.ref, file=path)
    return img
