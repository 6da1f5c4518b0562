"""The images frank put into its own engine storages, given back by ``frank gc``.

Why: ``frank run`` imports each image it runs into the engine storage of frank's cache and
keeps it there under a name per digest (``localhost/tmp/frank-oci-<digest>/image``), so a
second run of it starts without copying gigabytes again; builds import their pinned bases
(``localhost/frank-base-<digest>``) and, under podman, a per-process view name. None of that
was ever removed: a served-cpu image is 2.2 GB there, and a clean test run filled CI's disk.

Kept: an image whose manifest digest the repo references (an ``out/`` image, a push, a
pinned base), and a run image whose run folder (``run-cache/<digest>``, touched by every run)
changed within ``keep_days``. The rest goes; what a later run or build needs is imported
again from the verified layout (bases are a few tens of MB). Names of a kept image that only
a finished process used (``frank-oci-p<pid>-...``) are dropped from it. An image a container
still uses is left (the engine refuses): ``rmi`` is never forced.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

_RUN_NAME = re.compile(r"localhost/tmp/frank-oci-([0-9a-f]{24})/image(:latest)?")
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


@dataclass(frozen=True)
class EngineImage:
    """One image of an engine storage, as its ``images`` listing shows it."""

    id: str
    names: tuple[str, ...]
    digest: str  # sha256 hex of its manifest, or "" when the listing gave none
    size: int


def _size(value: object) -> int:
    """buildah says ``"2.19 GB"``, podman a number of bytes."""
    if isinstance(value, int):
        return value
    m = re.fullmatch(r"\s*([0-9.]+)\s*([kKmMgGtT]?[bB])\s*", str(value))
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()]) if m else 0


def listed(engine_args: list[str]) -> list[EngineImage]:
    """The images of the storage ``engine_args`` names (``[]`` if the engine fails)."""
    exe = Path(engine_args[0]).name
    cmd = [*engine_args, "images", "--json"] if exe == "buildah" \
        else [*engine_args, "images", "--format", "json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    try:
        rows = json.loads(proc.stdout) if proc.returncode == 0 and proc.stdout.strip() else []
    except ValueError:
        return []
    out = []
    for row in rows if isinstance(rows, list) else []:
        low = {str(k).lower(): v for k, v in row.items()}
        digest = str(low.get("digest") or "").partition(":")[2]
        out.append(EngineImage(str(low.get("id") or ""), tuple(low.get("names") or ()),
                               digest, _size(low.get("size"))))
    return out


def run_digest(name: str) -> str | None:
    """The 24 hex digits a run image's name carries, or None for any other name."""
    m = _RUN_NAME.fullmatch(name)
    return m.group(1) if m else None


def plan(images: list[EngineImage], *, referenced: set[str],
         recent_run: Callable[[str], bool]) -> tuple[list[EngineImage], list[str]]:
    """What goes: whole images, and the names dropped from images that stay."""
    gone: list[EngineImage] = []
    untag: list[str] = []
    for img in images:
        keep_names = [n for n in img.names
                      if (d := run_digest(n)) is not None and recent_run(d)]
        if img.digest in referenced or keep_names:
            untag += [n for n in img.names if n not in keep_names
                      and "/frank-oci-p" in n]  # a finished process's own view name
            continue
        gone.append(img)
    return gone, untag


def remove(engine_args: list[str], gone: list[EngineImage],
           untag: list[str]) -> list[EngineImage]:
    """Remove ``gone`` (by name, then by id; never forced) and drop ``untag``'s names; the
    images actually removed."""
    removed = []
    for img in gone:
        refs = list(img.names) or [img.id]
        if subprocess.run([*engine_args, "rmi", *refs], capture_output=True,
                          check=False).returncode == 0:
            removed.append(img)
    for name in untag:
        subprocess.run([*engine_args, "rmi", name], capture_output=True, check=False)
    return removed
