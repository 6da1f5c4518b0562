"""Apply a Python-only engine patch on the host, to the files of the engine's wheel.

A patch is written against the engine's source tree (``vllm/...``, ``csrc/...``,
``tests/...``); the image holds only what the wheel installs. So the diff is split per
file, the parts under the wheel's top-level packages are applied with GNU ``patch`` to
the original files read from the wheel, and the layer gets exactly the changed and new
files (a deleted file becomes an OCI whiteout). Parts outside the wheel (CUDA sources the
wheel never compiles, tests, tools) are reported, not applied.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from frank.errors import FrankError
from frank.model.diffs import split_diff


def wheel_packages(wheel: Path) -> set[str]:
    """The top-level folders a wheel installs into site-packages."""
    with zipfile.ZipFile(wheel) as zf:
        return {n.split("/", 1)[0] for n in zf.namelist() if "/" in n
                and not n.split("/", 1)[0].endswith((".dist-info", ".data"))}


@dataclass(frozen=True)
class PatchResult:
    """What applying a patch to a wheel's files gave."""

    changed: list[str]  # site-relative paths written into the layer
    deleted: list[str]
    skipped: list[str]  # diff paths outside the wheel (not in the image)


def apply_to_wheel(patch_text: str, wheel: Path, site_root: Path, *, label: str,
                   log: Path) -> PatchResult:
    """Apply the wheel's part of ``patch_text``; changed files land under ``site_root``."""

    def originals(paths: list[str]) -> dict[str, bytes]:
        with zipfile.ZipFile(wheel) as zf:
            names = set(zf.namelist())
            return {p: zf.read(p) for p in paths if p in names}

    return apply_to_files(patch_text, wheel_packages(wheel), originals, site_root,
                          label=label, log=log, what=wheel.name)


def apply_to_files(patch_text: str, packages: set[str],
                   originals: Callable[[list[str]], dict[str, bytes]], site_root: Path, *,
                   label: str, log: Path, what: str) -> PatchResult:
    """Apply the part of ``patch_text`` under ``packages`` (top-level folders of the site
    folder) to the original files ``originals`` gives (site-relative path -> bytes);
    changed files land under ``site_root``, a deleted one as an OCI whiteout."""
    parts = split_diff(patch_text)
    inside = [p for p in parts if PurePosixPath(p.path).parts[0] in packages]
    skipped = sorted(p.path for p in parts if p not in inside)
    for p in inside:
        pp = PurePosixPath(p.path)
        if pp.is_absolute() or ".." in pp.parts:
            raise FrankError(f"the patch names an unsafe path {p.path!r}", field=label)
    with tempfile.TemporaryDirectory(prefix="frank-patch-") as tmp:
        work = Path(tmp) / "tree"
        work.mkdir()
        for rel, data in originals([p.path for p in inside]).items():
            target = work / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        filtered = Path(tmp) / "filtered.patch"
        filtered.write_text("".join(p.text for p in inside), encoding="utf-8")
        proc = subprocess.run(
            ["patch", "-p1", "--batch", "--forward", "--no-backup-if-mismatch",
             "--reject-file=-", "-d", str(work), "-i", str(filtered)],
            capture_output=True, text=True, check=False)
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a", encoding="utf-8") as f:
            f.write(f"$ patch -p1 ({label}: {len(inside)} files of {len(parts)})\n")
            f.write(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            why = [x for x in (proc.stdout + proc.stderr).splitlines()
                   if "FAILED" in x or "can't find" in x.lower() or "malformed" in x.lower()
                   or "reversed" in x.lower()][:2]
            raise FrankError(f"the patch does not apply to {what}: "
                             f"{'; '.join(why) or 'patch failed'} (log {log})", field=label)
        changed, deleted = [], []
        for p in inside:
            if p.deleted:
                deleted.append(p.path)
                whiteout = site_root / PurePosixPath(p.path).parent / \
                    f".wh.{PurePosixPath(p.path).name}"
                whiteout.parent.mkdir(parents=True, exist_ok=True)
                whiteout.write_bytes(b"")
                continue
            src = work / p.path
            if not src.is_file():
                raise FrankError(f"the patch left no file at {p.path}", field=label)
            dest = site_root / p.path
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest)
            changed.append(p.path)
    return PatchResult(changed=sorted(changed), deleted=sorted(deleted), skipped=skipped)
