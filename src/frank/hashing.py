"""Content hashes of files, trees and canonical JSON: what keys locks, layers and digests."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Any, Protocol

from frank.errors import FrankError

# Never part of a source tree's identity: caches a build or an editor leaves behind.
IGNORED_NAMES = frozenset({"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", "build"})
IGNORED_SUFFIXES = (".pyc", ".pyo", ".egg-info")


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of bytes."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _git_listed(root: Path) -> list[Path] | None:
    """Files git would commit under ``root`` (tracked or untracked, not ignored), or None
    when ``root`` is not in a git work tree."""
    try:
        proc = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", "."],
            cwd=root, capture_output=True, timeout=30, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    names = [n for n in proc.stdout.decode().split("\0") if n]
    return [root / n for n in names]


def tree_files(root: Path) -> list[Path]:
    """Files and symlinks under ``root`` that belong to its content, sorted by relative
    POSIX path.

    In a git work tree that is what git would commit (build outputs that .gitignore or
    .git/info/exclude hide are not content); elsewhere every file, less caches. A symlink is
    content as a link (git stores it so, and so does a layer), never as what it points at,
    and one that leads outside ``root`` is refused: its target would not be in the tree.
    """
    listed = _git_listed(root)
    candidates = listed if listed is not None else _walk(root)
    files = []
    for path in candidates:
        rel = path.relative_to(root)
        if any(p in IGNORED_NAMES or p.endswith(IGNORED_SUFFIXES) for p in rel.parts):
            continue
        if path.is_symlink():
            check_link_inside(path, root)
            files.append(path)
        elif path.is_file():
            files.append(path)
    return sorted(set(files), key=lambda p: p.relative_to(root).as_posix())


def left_out(root: Path) -> list[str]:
    """Files on disk under ``root`` that ``tree_files`` does not count as content (what git
    ignores, caches), relative POSIX paths: for a folder whose every file is content (a
    binary part's cubins), each of these would silently be missing from the image."""
    with ExitStack() as listing:  # git's listing, as sha256_tree reads it
        for observer in _OBSERVERS:
            listing.enter_context(observer.listing())
        kept = {p.relative_to(root).as_posix() for p in tree_files(root)}
    return sorted(rel for p in _walk(root)
                  if (rel := p.relative_to(root).as_posix()) not in kept
                  and (p.is_file() or p.is_symlink()))


def _walk(root: Path) -> list[Path]:
    """Every file and symlink under ``root``; symlinked folders are listed, not entered."""
    out = []
    for folder, dirs, names in os.walk(root):
        base = Path(folder)
        out += [base / d for d in dirs if (base / d).is_symlink()]
        out += [base / n for n in names]
    return out


def check_link_inside(link: Path, root: Path) -> None:
    """Refuse a symlink whose target, followed all the way, is not inside ``root`` (an
    absolute target is refused too: it names a place on this machine, not in the tree)."""
    text = os.readlink(link)
    if os.path.isabs(text) or not (link.parent / text).resolve().is_relative_to(root.resolve()):
        raise FrankError(f"symlink {link.relative_to(root).as_posix()} -> {text} points "
                         "outside its tree", file=link)


class TreeObserver(Protocol):
    """Told of every tree hashed: how frank.store.memo learns what an answer depended on,
    without this leaf module knowing the memo (it registers itself with ``observe_trees``)."""

    def listing(self) -> AbstractContextManager[object]:
        """Entered while the tree's file list is read (git runs then)."""
        ...

    def hashed(self, root: Path, digest: str) -> None:
        """The tree at ``root`` hashed to ``digest``."""
        ...


_OBSERVERS: list[TreeObserver] = []


def observe_trees(observer: TreeObserver) -> None:
    """Register ``observer`` for every later ``sha256_tree``."""
    _OBSERVERS.append(observer)


def sha256_tree(root: Path) -> str:
    """Hash of a directory: relative paths, executable bits and file hashes, in sorted order.

    File names and modes are hashed with the bytes so that a rename or a lost +x changes it;
    mtimes and owners are not, so two clones hash alike. A symlink is hashed as its target
    text (mode ``l``), as a layer stores it.
    """
    lines = []
    with ExitStack() as listing:  # git's listing is the tree's, not an unknown program's
        for observer in _OBSERVERS:
            listing.enter_context(observer.listing())
        files = tree_files(root)
    for path in files:
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            lines.append(f"{sha256_bytes(os.readlink(path).encode())} l {rel}\n")
            continue
        mode = "x" if path.stat().st_mode & 0o111 else "-"
        lines.append(f"{sha256_file(path)} {mode} {rel}\n")
    digest = sha256_bytes("".join(lines).encode())
    for observer in _OBSERVERS:
        observer.hashed(root, digest)
    return digest


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and fixed separators: the same value gives the same bytes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_json(value: Any) -> str:
    """Hex sha256 of a value's canonical JSON."""
    return sha256_bytes(canonical_json(value).encode())
