"""Content pins: the only kind of external reference a manifest may carry.

A tag, a branch, a short hash or an image tag can move under us; a full commit, a sha256,
an image digest or a hub revision hash cannot. Each pin is an annotated ``str`` whose
validator refuses anything mutable with a message that says what to do instead.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

_HEX40 = re.compile(r"[0-9a-f]{40}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def check_commit(value: str) -> str:
    """A full 40-hex git commit; short hashes, tags and branches are refused."""
    if not _HEX40.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a full 40-hex commit (a tag, branch or short hash can move or "
            "be ambiguous; `frank pin` resolves one into a commit)"
        )
    return value


def check_sha256(value: str) -> str:
    """A 64-hex sha256 of a file's bytes."""
    if not _HEX64.fullmatch(value):
        raise ValueError(f"{value!r} is not a 64-hex sha256")
    return value


def check_hub_revision(value: str) -> str:
    """A hub revision must be the 40-hex commit hash, never a branch like ``main``."""
    if not _HEX40.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a 40-hex hub revision hash (a branch or tag such as 'main' "
            "is mutable; `frank pin` resolves it)"
        )
    return value


def check_image_ref(value: str) -> str:
    """An image reference pinned by digest: ``name@sha256:<64hex>``; a tag alone is refused."""
    name, sep, digest = value.partition("@")
    if not sep or not _DIGEST.fullmatch(digest) or not name:
        raise ValueError(
            f"{value!r} is not pinned by digest (write NAME@sha256:<64 hex>; a tag can move)"
        )
    return value


def check_digest(value: str) -> str:
    """A bare ``sha256:<64hex>`` digest."""
    if not _DIGEST.fullmatch(value):
        raise ValueError(f"{value!r} is not a digest of the form sha256:<64 hex>")
    return value


Commit = Annotated[str, AfterValidator(check_commit)]
Sha256 = Annotated[str, AfterValidator(check_sha256)]
HubRevision = Annotated[str, AfterValidator(check_hub_revision)]
ImageRef = Annotated[str, AfterValidator(check_image_ref)]
Digest = Annotated[str, AfterValidator(check_digest)]


def check_git_url(value: str) -> str:
    """A git remote: https, http, ssh, git@host:path or file:// (a local mirror)."""
    if not re.fullmatch(r"(https?|ssh|git|file)://\S+|[\w.-]+@[\w.-]+:\S+", value):
        raise ValueError(f"{value!r} is not a git remote URL")
    return value


GitUrl = Annotated[str, AfterValidator(check_git_url)]
