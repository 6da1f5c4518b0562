"""Which files in a repo's stacks/ folder are stacks (and locks), and frank's temp names.

frank resolves an edited stack from a temp file beside the original (its ``extends`` is
relative), and writes files there through temp names; a kill can leave either behind.
Neither is ever a stack: a dot-name (``.X.lock.<random>.tmp``) or a name holding
``TEMP_MARK`` (``X.frank-tmp-revert-<random>.toml``, still a valid stack name so it can be
resolved) is skipped here and removed under the repo lock (``repolock.clean_stale``); so
is a Python closure's ``pylock.X.toml`` (PEP 751), which is a lock, not a stack.
"""

from __future__ import annotations

from pathlib import Path

TEMP_MARK = ".frank-tmp-"


def is_stack_name(name: str) -> bool:
    """Whether a ``*.toml`` in stacks/ is a stack: not a temp, not a ``pylock.*.toml``."""
    return not is_temp(name) and not name.startswith("pylock.")


def is_temp(name: str) -> bool:
    """Whether a name in stacks/ is one of frank's temp files."""
    return name.startswith(".") or TEMP_MARK in name


def stack_files(root: Path, suffix: str = ".toml") -> list[Path]:
    """The repo's stack files (or, with ``suffix=".lock"``, lock files), sorted."""
    folder = root / "stacks"
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob(f"*{suffix}") if is_stack_name(p.name) and p.is_file())
