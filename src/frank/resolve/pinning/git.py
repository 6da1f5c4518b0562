"""Resolve a git tag or branch to a full commit with ``git ls-remote`` (no clone)."""

from __future__ import annotations

import re
import subprocess

from frank.errors import FrankError

_HEX40 = re.compile(r"[0-9a-f]{40}")


def resolve_commit(repo: str, ref: str) -> str:
    """The commit ``ref`` names in ``repo``; a peeled tag wins over the tag object."""
    if _HEX40.fullmatch(ref):
        return ref
    try:
        proc = subprocess.run(["git", "ls-remote", repo, ref, f"{ref}^{{}}"],
                              capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FrankError(f"git ls-remote {repo} failed: {exc}") from None
    if proc.returncode != 0:
        reason = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed"
        raise FrankError(f"git ls-remote {repo}: {reason}")
    refs: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        sha, _, name = line.partition("\t")
        refs[name] = sha
    for name in (f"refs/tags/{ref}^{{}}", f"refs/tags/{ref}", f"refs/heads/{ref}", ref):
        if name in refs:
            return refs[name]
    raise FrankError(f"{repo} has no tag or branch {ref!r}")
