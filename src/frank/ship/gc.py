"""``frank gc``: the store gives back what nothing here references any more.

Why: every wheel, layer blob, base, kept step output and git clone stays in the cache for
ever (a served variant is about 14 GB). Kept: every blob a committed lock, pylock or .debs
lock names (their sha256 are the blobs' names), every blob of an image in ``out/`` and of a
recorded push (manifests followed to their configs and layers), the base each [debs] image
file makes now, and anything changed within ``keep_days``. The rest goes, with the index
records and stamps of the blobs that go, the warm caches of images no longer kept
(``run.warmcache``), and the images frank imported into its engine storages that nothing
keeps (``ship.gcimages``: a run's image stays while its run is recent).

Safe against a concurrent compose: every process that uses the store holds its
``users.lock`` shared for its life (``store.blobs``); gc takes it exclusively, so it waits
for those to finish (up to ``wait`` seconds, then refuses in one line) and a command started
meanwhile waits for gc. So the gc process never opens a ``BlobStore`` itself: its own shared
hold would stop its exclusive one.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from frank.errors import FrankError
from frank.run import warmcache
from frank.store.flock import opened, try_exclusive

_HEX = re.compile(r"(?<![0-9a-f])[0-9a-f]{64}(?![0-9a-f])")
_SMALL = 4 << 20  # a blob this small may be a manifest or an index: its digests are followed
# Folders of the cache kept by age alone (what a key of theirs stands for is not at hand).
BY_AGE = ("step-outputs", "git", "quarantine", "kernels", "toolchains", "run-cache",
          "audit-bases", "audit-patches", "audit-records", "audit-verdicts")


@dataclass
class Collected:
    """What gc did (or, with ``dry_run``, would do)."""

    freed: int = 0
    removed: dict[str, int] = field(default_factory=dict)
    kept_blobs: int = 0
    reaped: list[str] = field(default_factory=list)  # what killed runs and builds left

    def note(self, what: str, size: int) -> None:
        self.freed += size
        self.removed[what] = self.removed.get(what, 0) + 1


def _size(path: Path) -> int:
    if path.is_symlink() or not path.is_dir():
        with contextlib.suppress(OSError):
            return path.lstat().st_size
        return 0
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += Path(folder, name).lstat().st_size
    return total


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


def referenced(root: Path) -> set[str]:
    """The blob names (hex) the repo's locks, its out/ images and its pushes reference."""
    from frank.ship.pushes import read_pushes

    keep: set[str] = set()
    files = [*(root / "stacks").glob("*.lock"), *(root / "stacks").glob("pylock.*.toml"),
             *(root / "images").glob("*.debs.lock")]
    for f in files:
        keep.update(_HEX.findall(f.read_text(encoding="utf-8", errors="replace")))
    for blobs in (root / "out").glob("*/image/blobs/sha256"):
        keep.update(p.name for p in blobs.iterdir())
    if (root / "out" / "pushes.jsonl").is_file():
        keep.update(r.digest.split(":", 1)[1] for r in read_pushes(root))
    return keep


def _follow(blob_dir: Path, keep: set[str]) -> set[str]:
    """``keep`` and every digest a kept manifest or index names, to the end."""
    todo, seen = list(keep), set(keep)
    while todo:
        path = blob_dir / todo.pop()
        with contextlib.suppress(OSError, ValueError):
            if path.stat().st_size <= _SMALL:
                doc = json.loads(path.read_bytes())
                if isinstance(doc, dict) and ("layers" in doc or "manifests" in doc):
                    for digest in _HEX.findall(json.dumps(doc)):
                        if digest not in seen:
                            seen.add(digest)
                            todo.append(digest)
    return seen


def current_bases(root: Path) -> set[str]:
    """The keys of the bases the repo's image files make or pin now."""
    from frank.assemble.debs.build import base_key
    from frank.model.imagefile import load_image_file
    from frank.resolve.debs.lock import current_lock

    keys = set()
    for path in sorted((root / "images").glob("*.toml")):
        # a base pinned by digest is kept under its digest (a registry may not be at hand)
        keys.update(_HEX.findall(path.read_text(encoding="utf-8", errors="replace")))
        with contextlib.suppress(FrankError):
            img = load_image_file(path)
            if img.debs is not None:
                keys.add(base_key(current_lock(img.debs, path)[0]))
    return keys


def storages(store_root: Path) -> list[list[str]]:
    """The engine argv (``--root`` and the rest) of each engine storage in the cache."""
    from frank.assemble.engines import _runroot

    found = []
    for root in sorted((store_root / "containers").glob("*")):
        name, _, driver = root.name.partition("-")
        exe = shutil.which(name)
        if name in ("buildah", "podman") and exe is not None and root.is_dir():
            found.append([exe, "--root", str(root), "--runroot", str(_runroot(root)),
                          "--storage-driver", driver or "vfs"])
    return found


def reap_all(store_root: Path, *, dry_run: bool = False) -> list[str]:
    """Remove what killed runs and builds left (``run.reap.leftovers``) in each engine
    storage of the cache and in /tmp, mounts included (``dry_run``: only name them)."""
    from frank.run.reap import leftovers

    return leftovers(storages(store_root), dry_run=dry_run, storage_mounts=True, engines=True)


def engine_images(store_root: Path, referenced: set[str], recent_run: Callable[[str], bool],
                  done: Collected, *, dry_run: bool) -> None:
    """Give back the engine storages' images nothing keeps (``ship.gcimages``)."""
    from frank.ship import gcimages

    for args in storages(store_root):
        root = Path(args[args.index("--root") + 1])
        gone, untag = gcimages.plan(gcimages.listed(args), referenced=referenced,
                                    recent_run=recent_run)
        if dry_run:
            for img in gone:
                done.note("engine images", img.size)
            continue
        before = _size(root)
        removed = gcimages.remove(args, gone, untag)
        done.freed += max(0, before - _size(root))  # shared layers counted once
        if removed:
            done.removed["engine images"] = done.removed.get("engine images", 0) + len(removed)


@contextlib.contextmanager
def exclusive(store_root: Path, wait: float) -> Iterator[None]:
    """The store to ourselves: ``users.lock`` exclusive, waiting up to ``wait`` seconds."""
    with opened(store_root / "users.lock") as fd:
        deadline = time.monotonic() + wait
        while not try_exclusive(fd):
            if time.monotonic() >= deadline:
                raise FrankError(f"the store is in use by another frank command (waited "
                                 f"{wait:g} s); run gc when it is done", file=store_root)
            time.sleep(0.2)
        yield


def collect(store_root: Path, root: Path, *, keep_days: float, dry_run: bool = False,
            wait: float = 30.0) -> Collected:
    """Remove what nothing references and nothing changed within ``keep_days``."""
    done = Collected()
    if not store_root.is_dir():
        return done
    cutoff = time.time() - keep_days * 86400

    def old(path: Path) -> bool:
        with contextlib.suppress(OSError):
            return path.lstat().st_mtime < cutoff
        return False

    def drop(path: Path, what: str) -> None:
        done.note(what, _size(path))
        if not dry_run:
            _remove(path)

    with exclusive(store_root, wait):
        done.reaped = reap_all(store_root, dry_run=dry_run)
        blob_dir = store_root / "blobs" / "sha256"
        kept = referenced(root)
        warm, warm_gone = warmcache.for_gc(store_root, _follow(blob_dir, kept))
        keep = _follow(blob_dir, kept | warm)
        for folder in warm_gone:  # the warm caches of images no longer kept
            drop(folder, "warm caches")
        gone: set[str] = set()
        for blob in sorted(blob_dir.iterdir()) if blob_dir.is_dir() else []:
            if blob.name in keep or not old(blob):
                done.kept_blobs += 1
                continue
            gone.add(blob.name)
            drop(blob, "blobs")
            stamp = store_root / "stamps" / blob.name
            if stamp.exists():
                drop(stamp, "stamps")
        for record in sorted((store_root / "layer-keys").glob("*-*")):
            if record.name.split("-", 1)[0] in gone:
                drop(record, "layer records")
        for record in sorted((store_root / "layers").glob("*")):
            with contextlib.suppress(OSError, ValueError, AttributeError, TypeError):
                digest = json.loads(record.read_bytes())["record"]["digest"].split(":")[1]
                if digest in gone or not (blob_dir / digest).exists():
                    drop(record, "layer records")
        # the audit's kept readings (frank.audit.kept) of layer blobs and wheels gone: named
        # by the blob's hex digest, of no use without it
        for readings in ("audit-layers", "audit-wheels"):
            for reading in sorted((store_root / readings).glob("*.json")):
                if reading.stem in gone or not (blob_dir / reading.stem).exists():
                    drop(reading, "audit readings")
        bases = current_bases(root)
        for made in sorted((store_root / "bases").glob("*")):
            key = made.name.split(".", 1)[0]
            if key not in bases and old(made):
                drop(made, "bases")
        for name in BY_AGE:
            for entry in sorted((store_root / name).glob("*")):
                if old(entry) and not entry.name.endswith(".lock"):
                    drop(entry, name)

        def recent_run(digest24: str) -> bool:
            folder = store_root / "run-cache" / digest24
            return folder.exists() and not old(folder)

        engine_images(store_root, keep | bases, recent_run, done, dry_run=dry_run)
    return done
