"""Where a local git source may live: checked when a manifest is read and again at checkout.

A manifest is untrusted input: a ``file://`` remote must name a folder inside the repo.
"""

from __future__ import annotations

from pathlib import Path

from frank.errors import FrankError


def local_path(repo: str) -> Path | None:
    """The folder a ``file://`` remote (or a plain path, as .gitmodules may hold) names."""
    if repo.startswith("file://"):
        return Path(repo.removeprefix("file://"))
    if repo.startswith(("/", "./", "../")):
        return Path(repo)
    return None


def check_inside(repo: str, root: Path, *, file: Path | None = None,
                 field: str | None = None) -> None:
    """A local git remote must be a folder inside the repo (symlinks resolved): a manifest
    from someone else must not read the host's other repositories into an image."""
    path = local_path(repo)
    if path is not None and not path.resolve().is_relative_to(root.resolve()):
        raise FrankError(f"{repo} is outside the repo; a local git source must be inside it",
                         file=file, field=field)
