"""Content hashes of files, trees and canonical JSON: what keys locks, layers and digests."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

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
    """Files under ``root`` that belong to its content, sorted by relative POSIX path.

    In a git work tree that is what git would commit (build outputs that .gitignore or
    .git/info/exclude hide are not content); elsewhere every file, less caches.
    """
    listed = _git_listed(root)
    candidates = listed if listed is not None else list(root.rglob("*"))
    files = []
    for path in candidates:
        rel = path.relative_to(root)
        if any(p in IGNORED_NAMES or p.endswith(IGNORED_SUFFIXES) for p in rel.parts):
            continue
        if path.is_file():
            files.append(path)
    return sorted(set(files), key=lambda p: p.relative_to(root).as_posix())


def sha256_tree(root: Path) -> str:
    """Hash of a directory: relative paths, executable bits and file hashes, in sorted order.

    File names and modes are hashed with the bytes so that a rename or a lost +x changes it;
    mtimes and owners are not, so two clones hash alike.
    """
    lines = []
    for path in tree_files(root):
        mode = "x" if path.stat().st_mode & 0o111 else "-"
        lines.append(f"{sha256_file(path)} {mode} {path.relative_to(root).as_posix()}\n")
    return sha256_bytes("".join(lines).encode())


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and fixed separators: the same value gives the same bytes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_json(value: Any) -> str:
    """Hex sha256 of a value's canonical JSON."""
    return sha256_bytes(canonical_json(value).encode())
