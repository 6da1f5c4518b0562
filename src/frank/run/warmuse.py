"""Giving a run its warm cache: the folder mounted at ``/frank/warm`` and the line that says so.

Three ways a run starts (``frank run``):

- an artifact for this image and this device is in the store: it is checked and unpacked
  into a fresh folder (the lower), and the engine gets an overlay of it with a writable
  upper, so it reads the cache and can still add to it while the unpacked copy stays as the
  artifact made it. Where the kernel refuses an overlay mount (no CAP_SYS_ADMIN, as in an
  unprivileged CI container) the engine gets a copy of the lower instead; the ready line
  says which;
- ``--no-warm-cache``: an empty folder, so every cache starts cold;
- none usable: the run starts as it did before warm caches (the run cache per image), and
  the ready line says why no warm cache was used.

The folders live in one per-process folder of ``/tmp`` (``store.tmpdirs``), unmounted and
removed when the run ends; what a killed run left is reaped by the next run.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from frank.errors import FrankError
from frank.run import warmcache
from frank.run.device import Device, this_device
from frank.store.blobs import BlobStore
from frank.store.tmpdirs import owned, unmount_under


@dataclass
class WarmUse:
    """What a run gets: a host folder for ``/frank/warm`` (or none) and its note."""

    host: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    note: str = ""  # for the ready line: "warm cache sha256:... (made on ...)" or why not
    artifact: warmcache.Artifact | None = None
    mode: str = ""  # "overlay", "copy" or "" (no artifact)
    seconds: float = 0.0  # checking, unpacking and mounting


def overlay(lower: Path, work: Path) -> tuple[Path, str]:
    """A writable view of ``lower``: an overlay mount where the kernel allows one, else a
    copy; (the folder, "overlay" or "copy")."""
    upper, scratch, merged = work / "upper", work / "work", work / "merged"
    for d in (upper, scratch, merged):
        d.mkdir(parents=True, exist_ok=True)
    opts = f"lowerdir={lower},upperdir={upper},workdir={scratch}"
    proc = subprocess.run(["mount", "-t", "overlay", "overlay", "-o", opts, str(merged)],
                          capture_output=True, check=False) if shutil.which("mount") else None
    if proc is not None and proc.returncode == 0:
        return merged, "overlay"
    merged.rmdir()
    shutil.copytree(lower, merged, symlinks=True)
    return merged, "copy"


def _device(gpus: int) -> Device:
    found = this_device(gpus)
    if found is None:
        raise warmcache.WarmRefused(f"the stack wants {gpus} GPUs and nvidia-smi lists fewer")
    return found


@contextlib.contextmanager
def attached(store: BlobStore, image: str, gpus: int, *, cold: bool,
             check: Callable[[warmcache.Artifact], None] | None = None) -> Iterator[WarmUse]:
    """The warm cache a run of ``image`` gets (see the module docstring); the folders are
    unmounted and removed after the block. ``check``: one more check the artifact must pass
    before it is unpacked (its signature, where the image is attested); it raises
    ``warmcache.WarmRefused``."""
    if cold:
        with owned("warm") as work:
            yield WarmUse(warmcache.prepare(work / "empty"), warmcache.engine_env(),
                          "no warm cache (--no-warm-cache: every engine cache starts empty)")
        return
    start = time.monotonic()
    try:
        device = _device(gpus)
        artifact = warmcache.choose(store, image, device)
        if check is not None:
            check(artifact)
    except FrankError as exc:
        yield WarmUse(note=f"no warm cache: {exc.message}")
        return
    with owned("warm") as work:
        try:
            try:
                warmcache.unpack(store, artifact, work / "lower")
            except FrankError as exc:
                yield WarmUse(note=f"no warm cache: {exc.message}")
                return
            folder, mode = overlay(work / "lower", work)
            note = (f"warm cache {artifact.digest} (made on {artifact.made_on}, "
                    f"{artifact.created}; {mode})")
            yield WarmUse(folder, warmcache.engine_env(), note, artifact, mode,
                          time.monotonic() - start)
        finally:
            unmount_under(work)
