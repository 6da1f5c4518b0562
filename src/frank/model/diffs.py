"""A unified diff split per file: what a patch part declares it touches.

Read when a patch manifest is checked (which files, created or deleted) and when the builder
applies it, so it sits with the model, below both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_HEADER = re.compile(r"^(?:\+\+\+|---) (?:[ab]/)?(\S+)")


@dataclass(frozen=True)
class FileDiff:
    """One file's part of a unified diff."""

    path: str  # the path it changes (the new path; the old one for a deletion)
    text: str
    deleted: bool
    created: bool


def split_diff(text: str) -> list[FileDiff]:
    """Split a unified diff (git-style or plain) into one part per file."""
    chunks: list[list[str]] = []
    lines = text.splitlines(keepends=True)
    git = any(line.startswith("diff --git ") for line in lines)
    for i, line in enumerate(lines):
        if git:
            start = line.startswith("diff --git ")
        else:
            start = (line.startswith("--- ") and i + 1 < len(lines)
                     and lines[i + 1].startswith("+++ "))
        if start:
            chunks.append([line])
        elif chunks:
            chunks[-1].append(line)
    out = []
    for chunk in chunks:
        old = new = None
        for line in chunk:
            m = _HEADER.match(line)
            if m and line.startswith("---") and old is None:
                old = m.group(1)
            elif m and line.startswith("+++") and new is None:
                new = m.group(1)
                break
        if old is None and new is None:
            m = re.match(r"diff --git a/(\S+) b/(\S+)", chunk[0])
            if not m:
                continue
            old, new = m.group(1), m.group(2)
        deleted = new == "/dev/null"
        created = old == "/dev/null"
        path = old if deleted else new
        assert path is not None
        out.append(FileDiff(path=path, text="".join(chunk), deleted=deleted, created=created))
    return out
