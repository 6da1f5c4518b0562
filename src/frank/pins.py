"""Content pins: the only kind of external reference a manifest may carry.

A tag, a branch, a short hash or an image tag can move under us; a full commit, a sha256,
an image digest or a hub revision hash cannot. Each pin is an annotated ``str`` whose
validator refuses anything mutable with a message that says what to do instead.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated

from pydantic import AfterValidator


def matching(pattern: str, what: str) -> Callable[[str], str]:
    """A validator accepting only a full match of ``pattern``; ``what`` ends the message
    "VALUE is not WHAT". Every string type with a shape (pins, names, archs) uses it."""
    regex = re.compile(pattern)

    def check(value: str) -> str:
        if not regex.fullmatch(value):
            raise ValueError(f"{value!r} is not {what}")
        return value

    return check


check_commit = matching(
    r"[0-9a-f]{40}", "a full 40-hex commit (a tag, branch or short hash can move or be "
    "ambiguous; `frank pin` resolves one into a commit)")
check_sha256 = matching(r"[0-9a-f]{64}", "a 64-hex sha256")
check_hub_revision = matching(
    r"[0-9a-f]{40}", "a 40-hex hub revision hash (a branch or tag such as 'main' is mutable; "
    "`frank pin` resolves it)")
check_image_ref = matching(
    r"[^@\s]+@sha256:[0-9a-f]{64}",
    "pinned by digest (write NAME@sha256:<64 hex>; a tag can move)")
check_digest = matching(r"sha256:[0-9a-f]{64}", "a digest of the form sha256:<64 hex>")
check_git_url = matching(r"(https?|ssh|git|file)://\S+|[\w.-]+@[\w.-]+:\S+",
                         "a git remote URL")

Commit = Annotated[str, AfterValidator(check_commit)]
Sha256 = Annotated[str, AfterValidator(check_sha256)]
HubRevision = Annotated[str, AfterValidator(check_hub_revision)]
ImageRef = Annotated[str, AfterValidator(check_image_ref)]
Digest = Annotated[str, AfterValidator(check_digest)]
GitUrl = Annotated[str, AfterValidator(check_git_url)]
