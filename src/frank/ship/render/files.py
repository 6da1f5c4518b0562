"""Rendered objects into a directory, one file per object, as GitOps tools read them.

Every file frank writes starts with the same header line; a file with that header that the
new render no longer has (a Deployment that became a LeaderWorkerSet) is removed, and a
file without it is never touched, so a directory may also hold the user's own objects.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from frank.errors import FrankError
from frank.fsutil import write_atomic
from frank.resolve.lock import Lock
from frank.ship.render.k8s import dump_yaml, file_name, header

MARK = "# rendered by frank render k8s"


def render_files(lock: Lock, objects: list[dict[str, Any]]) -> dict[str, str]:
    """File name -> text for each object."""
    out: dict[str, str] = {}
    for obj in objects:
        name = file_name(obj)
        if name in out:
            raise FrankError(f"two rendered objects would both be {name}")
        out[name] = header(lock) + dump_yaml(obj)
    return out


def write_dir(out_dir: Path, files: dict[str, str]) -> tuple[list[str], list[str]]:
    """Write ``files`` into ``out_dir``; returns (written or changed, removed) names."""
    if out_dir.exists() and not out_dir.is_dir():
        raise FrankError("not a directory", file=out_dir, field="--out")
    out_dir.mkdir(parents=True, exist_ok=True)
    removed = []
    for path in sorted(out_dir.glob("*.yaml")):
        if path.name in files or not path.is_file():
            continue
        with path.open("rb") as handle:
            first = handle.readline().decode("utf-8", "replace")
        if first.startswith(MARK):
            path.unlink()
            removed.append(path.name)
    changed = []
    for name, text in sorted(files.items()):
        path = out_dir / name
        if path.is_file() and path.read_bytes() == text.encode():
            continue
        write_atomic(path, text)
        changed.append(name)
    return changed, removed


def report(out_dir: Path, changed: list[str], removed: list[str]) -> list[str]:
    """What ``write_dir`` did, one line per file."""
    return [*(f"wrote {out_dir / n}" for n in changed),
            *(f"removed {out_dir / n} (no longer rendered)" for n in removed)]
