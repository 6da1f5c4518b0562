"""Finding the repo, its stacks and their locks from what a user typed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from frank.catalog import Catalog
from frank.errors import FrankError
from frank.fsutil import find_repo_root
from frank.lock import Lock, build_lock, lock_path, read_lock
from frank.resolve import Resolved, resolve


@dataclass
class Locked:
    """A stack resolved and locked in memory (nothing written)."""

    resolved: Resolved
    lock: Lock
    lock_file: Path


def stack_path(arg: str, root: Path) -> Path:
    """A stack given by path (``stacks/served.toml``) or by name (``served``)."""
    direct = Path(arg)
    if direct.suffix == ".toml" or "/" in arg:
        if not direct.is_file():
            raise FrankError("stack file not found", file=arg)
        return direct.resolve()
    named = root / "stacks" / f"{arg}.toml"
    if not named.is_file():
        raise FrankError(f"no stack named {arg!r} (looked for stacks/{arg}.toml)")
    return named


def repo_root_for(path: Path | None = None) -> Path:
    """The repo holding ``path`` (a stack file) or the current directory."""
    return find_repo_root(path.parent if path is not None else Path.cwd())


def lock_stack(arg: str, catalog: Catalog | None = None) -> Locked:
    """Resolve and lock a stack named or given by path."""
    root = repo_root_for(Path(arg) if arg.endswith(".toml") else None)
    path = stack_path(arg, root)
    root = repo_root_for(path)
    resolved = resolve(path, root, catalog)
    return Locked(resolved=resolved, lock=build_lock(resolved), lock_file=lock_path(path))


def load_lock_any(arg: str) -> Lock:
    """A lock from a ``.lock`` file, or by locking a stack (name or path) in memory."""
    if arg.endswith(".lock"):
        return read_lock(Path(arg))
    return lock_stack(arg).lock
