"""Release mode: trust only bytes whose sha256 the stack's lock pins (issue 53).

The threat: someone who can write anything in FRANK_CACHE (layer records and blobs, bases,
kept step outputs, stamps, the ledger), but not the repository: a CI cache shared with an
untrusted job. A release build derives every layer, the base and the config again in a
scratch store that holds only the downloads the lock pins (the lock's and the base's .debs
lock's sha256s: hard links of the cache's blobs, hashed in full before use, since the
scratch store has no stamps), then compares what it made with what the cache offers under
the same keys: layer records, bases, kept step outputs. The first difference is one line
naming the layer and the path; each record that differs is dropped from the cache (a layer
record forgotten, a base or kept outputs moved to ``quarantine/``), so the next compose makes
them again: heal, never brick. The image written is the derived one.

Host builds that take an hour (an ``aot`` part's modules, an ``extension``'s module) are the
exception a pin makes: a part whose lock pins ``output_sha256`` (a fixed output, as Nix's
fixed-output derivations) has its kept output copied into the scratch store, hashed there in
full and taken only if it is the pin; else (absent, or different: a finding, moved to
``quarantine/``) it is built again, and held to the pin when built. An unpinned one is built
again, said in one line.

``frank compose --release`` and, unless ``--trust-cache`` is given, ``frank push``,
``frank attest`` and ``ci/build-images`` build this way.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from frank.errors import FrankError
from frank.fsutil import write_atomic
from frank.model.kinds.aot import Aot
from frank.model.kinds.extension import Extension
from frank.resolve.lock import Lock
from frank.store.blobs import BlobStore

_SHA = re.compile(r"\b[0-9a-f]{64}\b")


@dataclass
class Finding:
    """One thing the cache offered that the pins do not make."""

    what: str  # "layer frank:launcher", "base test-base", "step outputs step:x"
    path: str  # the first image path that differs ("-" when none can be named)
    cache: str
    derived: str
    dropped: str

    def line(self) -> str:
        return (f"release: {self.what}: the cache's {self.cache} is not what the lock's pins "
                f"make ({self.derived}); first difference at {self.path}; {self.dropped}")


@dataclass
class Release:
    """A scratch store seeded with the pinned downloads, and what the comparison found."""

    real: BlobStore
    scratch: Path
    findings: list[Finding] = field(default_factory=list)
    seeded: int = 0
    kept: list[Finding] = field(default_factory=list)  # kept outputs that are not their pin
    taken: list[str] = field(default_factory=list)  # parts whose pinned output was taken


def pinned_digests(lock: Lock, root: Path) -> set[str]:
    """Every sha256 the lock pins, and those of the files it pins by hash: the base's .debs
    lock and the Python closure's pylock."""
    from frank.hashing import sha256_file

    text = json.dumps(lock.model_dump(mode="json"))
    found = set(_SHA.findall(text))
    name = str(lock.base_image.get("name", ""))
    files = [(root / "images" / f"{name}.debs.lock", lock.base_image.get("debs_lock_sha256"))]
    closure = lock.python_closure or {}
    if closure.get("file"):  # the pylock the lock pins by hash: the closure's wheels
        files.append((root / str(closure["file"]), closure.get("sha256")))
    for path, sha in files:
        if sha and path.is_file() and path.resolve().is_relative_to(root.resolve()) and \
                sha256_file(path) == sha:
            found |= set(_SHA.findall(path.read_text(encoding="utf-8")))
    return found


def seed(real: BlobStore, scratch: Path, digests: set[str]) -> int:
    """Hard links of the cache's blobs named by a pinned digest (no stamps: each is hashed
    in full when the scratch store first reads it); how many."""
    blobs = scratch / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    n = 0
    for hexd in sorted(digests):
        src = real.blob_dir / hexd
        if not src.is_file():
            continue
        try:
            os.link(src, blobs / hexd)
        except OSError:
            shutil.copyfile(src, blobs / hexd)
        n += 1
    return n


@contextlib.contextmanager
def scratch_cache(lock: Lock, root: Path) -> Iterator[Release]:
    """FRANK_CACHE set to a scratch store of pinned downloads for the ``with`` body (the
    build's own ``BlobStore()`` calls land there); removed after."""
    real = BlobStore()
    # under the store's tmp/: what a killed release leaves goes with the next first user
    scratch = Path(tempfile.mkdtemp(prefix="release-", dir=real.tmp_dir))
    old = os.environ.get("FRANK_CACHE")
    try:
        release = Release(real, scratch)
        release.seeded = seed(real, scratch, pinned_digests(lock, root))
        take_pinned_outputs(release, lock, root)
        os.environ["FRANK_CACHE"] = str(scratch)
        yield release
    finally:
        if old is None:
            os.environ.pop("FRANK_CACHE", None)
        else:
            os.environ["FRANK_CACHE"] = old
        from frank.store.blobs import leave_users
        from frank.store.tmpdirs import unmount_under

        with contextlib.suppress(Exception):
            leave_users(scratch)
        with contextlib.suppress(Exception):
            unmount_under(scratch)
        shutil.rmtree(scratch, ignore_errors=True)


def compare(release: Release, layout: Path) -> list[Finding]:
    """What the cache offers under each key the derived build wrote, against it; each
    record that differs dropped from the cache."""
    scratch = BlobStore(release.scratch)
    names = _layer_names(layout)
    out = list(release.kept)
    out += _layers(release.real, scratch, names)
    out += _bases(release.real, release.scratch)
    out += _step_outputs(release.real.root, release.scratch)
    release.findings = out
    return out


def take_pinned_outputs(release: Release, lock: Lock, root: Path) -> None:
    """Each ``aot`` or ``extension`` part's kept output, into the scratch store if hashed
    there in full it is the lock's ``output_sha256``; what differs is a finding, moved to
    ``quarantine/`` (module docstring). Lines on stderr say what is built again and why."""
    import sys

    for locked in lock.parts:
        if locked.kind not in ("aot", "extension"):
            continue
        part = (Aot if locked.kind == "aot" else Extension).model_validate(locked.spec)
        pin = part.output_sha256
        if pin is None:
            said = "pins no output_sha256"
        else:
            got = _take(release, part, root, root / locked.manifest, pin)
            if got == "taken":
                release.taken.append(locked.name)
                print(f"release: {locked.name}: its kept output, hashed in full, is its "
                      "output_sha256: taken, not built again", file=sys.stderr, flush=True)
                continue
            if isinstance(got, Finding):
                release.kept.append(got)
            said = "has no kept output" if got == "absent" else \
                "has a kept output that is not its output_sha256"
        print(f"release: {locked.name} {said}: building it again", file=sys.stderr,
              flush=True)


def _take(release: Release, part: Aot | Extension, root: Path, manifest: Path, pin: str
          ) -> Finding | str:
    """``taken`` (copied into the scratch store, hashed there in full, the pin), ``absent``,
    or a finding (the cache's folders moved to ``quarantine/``)."""
    from frank.assemble.outputs import kept_output, output_sha256
    from frank.store.ledger import hash_file

    real, scratch = release.real.root, release.scratch
    files = {name: p.relative_to(real)
             for name, p in kept_output(part, root, manifest, real).items()}
    if not all((real / rel).is_file() for rel in files.values()):
        return "absent"
    for rel in files.values():  # copied (megabytes: no inode shared with the cache), then
        (scratch / rel).parent.mkdir(parents=True, exist_ok=True)  # hashed where it is read
        shutil.copyfile(real / rel, scratch / rel)
    hashes = {rel: hash_file(scratch / rel) for rel in files.values()}
    got = output_sha256(part, {n: scratch / rel for n, rel in files.items()},
                        lambda p: hashes[p.relative_to(scratch)])
    if got == pin:
        ledger = BlobStore(scratch).ledger  # read once: the build takes it as hashed
        for rel, sha in hashes.items():
            ledger.note(scratch / rel, sha)
        if not isinstance(part, Aot):  # its record written here, not taken from the cache
            rel = files[""]
            write_atomic((scratch / rel).parent / "result.json", json.dumps(
                {"module": rel.name, "sha256": got, "key": rel.parent.name,
                 "taken": "release: the kept module, hashed in full, is output_sha256"}))
        return "taken"
    for rel in files.values():
        shutil.rmtree(scratch / rel.parent, ignore_errors=True)
    bad = release.real.root / "quarantine" / "outputs"
    bad.mkdir(parents=True, exist_ok=True)
    for rel in dict.fromkeys(r.parent for r in files.values()):
        with contextlib.suppress(OSError):
            os.replace(real / rel, tempfile.mkdtemp(prefix=f"{rel.name[:16]}-", dir=bad))
    return Finding(f"kept output of {part.name}", ", ".join(str(r) for r in files.values()),
                   f"output {got}", f"output_sha256 {pin}",
                   "moved to quarantine/: this build makes it again")


def _layer_names(layout: Path) -> dict[str, str]:
    """Layer digest -> its name in the derived image's history."""
    from frank.image.oci import read_layout_blob, resolve_manifest

    try:
        _, _, manifest = resolve_manifest(layout)
        config = json.loads(read_layout_blob(layout, manifest["config"]["digest"], "config"))
    except Exception:
        return {}
    history = [h for h in config.get("history") or [] if not h.get("empty_layer")]
    return {str(d["digest"]): str(h.get("created_by", "")).removeprefix("frank: ")
            for d, h in zip(manifest.get("layers") or [], history, strict=False)}


def first_path(cache_blob: Path, derived_blob: Path) -> str:
    """The first image path (in path order) whose member differs between two layer tars."""
    from frank.audit.layers import read_layer

    def table(blob: Path) -> dict[str, tuple[str, str, int, str]]:
        return {e.path: (e.kind, e.sha256, e.mode & 0o7777, e.link)
                for e in read_layer(0, blob).entries}
    try:
        a, b = table(cache_blob), table(derived_blob)
    except Exception:
        return "- (the cache's blob is not a readable tar)"
    diff = sorted(p for p in set(a) | set(b) if a.get(p) != b.get(p))
    return f"/{diff[0]}" if diff else "- (same members, other bytes)"


def _layers(real: BlobStore, scratch: BlobStore, names: dict[str, str]) -> list[Finding]:
    out = []
    for entry in sorted(scratch.layer_dir.iterdir()) if scratch.layer_dir.is_dir() else []:
        key = entry.name
        mine = scratch.get_layer(key)
        theirs = real.get_layer(key)
        if mine is None or theirs is None or theirs.digest == mine.digest:
            continue
        path = first_path(real.path(theirs.digest), scratch.path(mine.digest))
        real.drop_layer(key)
        out.append(Finding(f"layer {names.get(mine.digest, key[:16])}", path, theirs.digest,
                           mine.digest, "its record is dropped: the next compose makes it"))
    return out


def _bases(real: BlobStore, scratch: Path) -> list[Finding]:
    from frank.assemble.baselayout import BaseImage, _move_aside

    out = []
    for record in sorted((scratch / "bases").glob("*.json")):
        mine = BaseImage.model_validate_json(record.read_text())
        cached = real.root / "bases" / record.name
        try:
            theirs = BaseImage.model_validate_json(cached.read_text()).digest
        except (OSError, ValueError):
            continue
        if theirs == mine.digest:
            continue
        path = _base_path(real.root / "bases" / record.stem, scratch / "bases" / record.stem)
        _move_aside(real, [real.root / "bases" / record.stem, cached], record.stem)
        out.append(Finding(f"base {mine.name}", path, theirs, mine.digest,
                           "moved to quarantine/: the next compose makes it"))
    return out


def _base_path(cache_layout: Path, derived_layout: Path) -> str:
    from frank.image.oci import layout_blob_path, resolve_manifest

    try:
        blobs = []
        for layout in (cache_layout, derived_layout):
            _, _, manifest = resolve_manifest(layout)
            blobs.append([layout_blob_path(layout, d["digest"]) for d in manifest["layers"]])
        for a, b in zip(blobs[0], blobs[1], strict=False):
            if a.name != b.name:
                return first_path(a, b)
    except Exception:
        return "- (the cache's base layout is not readable)"
    return "- (its config or manifest)"


def _step_outputs(real_root: Path, scratch: Path) -> list[Finding]:
    from frank.assemble.stepcache import _move_aside, tree_digest

    out = []
    for folder in sorted((scratch / "step-outputs").glob("*")):
        theirs = real_root / "step-outputs" / folder.name
        if not (theirs / "tree").is_dir():
            continue
        mine_digest = tree_digest(folder / "tree")
        their_digest = tree_digest(theirs / "tree")
        if mine_digest == their_digest:
            continue
        path = _tree_path(theirs / "tree", folder / "tree")
        _move_aside(real_root, theirs)
        out.append(Finding(f"kept outputs of step key {folder.name[:16]}", path,
                           f"tree {their_digest[:16]}", f"tree {mine_digest[:16]}",
                           "moved to quarantine/: the next build runs the step"))
    return out


def _tree_path(a: Path, b: Path) -> str:
    from frank.hashing import sha256_file

    def table(root: Path) -> dict[str, str]:
        out = {}
        for p in sorted(root.rglob("*")):
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                out[rel] = "link " + os.readlink(p)
            elif p.is_file():
                out[rel] = f"{sha256_file(p)} {p.stat().st_mode & 0o111:o}"
            else:
                out[rel] = "dir"
        return out
    ta, tb = table(a), table(b)
    diff = sorted(p for p in set(ta) | set(tb) if ta.get(p) != tb.get(p))
    return f"/{diff[0]}" if diff else "-"


class ReleaseRefused(FrankError):
    """The image is not what the lock's pins make (exit 1: a finding, not a bad input)."""

    exit_code = 1


def derive_and_check(layout: Path, lock: Lock, root: Path, *, what: str,
                     mirrors: tuple[Path, ...] = ()) -> str:
    """The image at ``layout`` made again from the lock's pins in a scratch store (every
    layer, the base, the config): its digest, or a refusal of ``what`` naming the first
    layer and path that differ. What the cache offered that differs is dropped as
    ``compare`` does (the lines are printed)."""
    import sys

    from frank.assemble.builder import build
    from frank.assemble.plan import build_plan
    from frank.image.oci import layout_blob_path, resolve_manifest

    plan = build_plan(lock, root)
    have, _, manifest = resolve_manifest(layout)
    with tempfile.TemporaryDirectory(prefix="frank-release-") as tmp, \
            scratch_cache(lock, root) as release:
        built = build(plan, root, Path(tmp) / "out", "auto", mirrors=mirrors, quiet=True)
        for finding in compare(release, built.layout):
            print(finding.line(), file=sys.stderr, flush=True)
        if built.digest == have:
            return have
        _, _, derived = resolve_manifest(built.layout)
        names = _layer_names(built.layout)
        mine = [str(d["digest"]) for d in manifest.get("layers") or []]
        want = [str(d["digest"]) for d in derived.get("layers") or []]
        for i, digest in enumerate(want):
            if i < len(mine) and mine[i] != digest:
                path = first_path(layout_blob_path(layout, mine[i]),
                                  layout_blob_path(built.layout, digest))
                where = f"layer {i} ({names.get(digest, '?')}) at {path}"
                break
        else:
            where = "the config or manifest" if len(mine) == len(want) else \
                f"{len(mine)} layers, the pins make {len(want)}"
        raise ReleaseRefused(f"refusing to {what}: the image is {have}, the lock's pins make "
                             f"{built.digest}; first difference: {where} (`frank compose "
                             f"{lock.stack} --release` writes the derived one)", file=layout)
