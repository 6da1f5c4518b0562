"""Apply a Python-only engine patch on the host, to the files of the engine's wheel.

A patch is written against the engine's source tree (``vllm/...``, ``csrc/...``,
``tests/...``); the image holds only what the wheel installs. So the diff is split per
file, the parts under the wheel's top-level packages are applied with GNU ``patch`` to
the original files read from the wheel, and the layer gets exactly the changed and new
files (a deleted file becomes an OCI whiteout). A new file outside the wheel's packages
(CUDA sources the wheel never compiles, tests, tools) lands where the part's
``[destinations]`` puts its top-level folder; any other file of the patch it cannot place
fails the build, naming them (issue 54: 67 files of 77 were applied and the build passed).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from frank.errors import FrankError
from frank.model.diffs import FileDiff, split_diff


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
    placed: list[str] = field(default_factory=list)  # image paths of new files outside it


def apply_to_wheel(patch_text: str, wheel: Path, site_root: Path, *, label: str,
                   log: Path, destinations: dict[str, str] | None = None,
                   image_root: Path | None = None) -> PatchResult:
    """Apply the wheel's part of ``patch_text``; changed files land under ``site_root``."""

    def originals(paths: list[str]) -> dict[str, bytes]:
        with zipfile.ZipFile(wheel) as zf:
            names = set(zf.namelist())
            return {p: zf.read(p) for p in paths if p in names}

    return apply_to_files(patch_text, wheel_packages(wheel), originals, site_root,
                          label=label, log=log, what=wheel.name, destinations=destinations,
                          image_root=image_root)


_PROGRAM: str | None = None


def patch_program() -> str:
    """Which ``patch`` applies patches here: its path and ``--version`` first line (GNU
    patch's fuzz and its handling of odd hunks vary between releases), asked once. What a
    kept result of applying a patch is keyed on, beside the patch and the files."""
    global _PROGRAM
    if _PROGRAM is None:
        import shutil

        path = shutil.which("patch") or "patch"
        try:
            proc = subprocess.run([path, "--version"], capture_output=True, text=True,
                                  check=False, timeout=30)
            first = (proc.stdout.splitlines() or ["?"])[0]
        except (OSError, subprocess.SubprocessError):
            first = "none"
        _PROGRAM = f"{path}: {first}"
    return _PROGRAM


def apply_to_files(patch_text: str, packages: set[str],
                   originals: Callable[[list[str]], dict[str, bytes]], site_root: Path, *,
                   label: str, log: Path, what: str,
                   destinations: dict[str, str] | None = None,
                   image_root: Path | None = None) -> PatchResult:
    """Apply the part of ``patch_text`` under ``packages`` (top-level folders of the site
    folder) to the original files ``originals`` gives (site-relative path -> bytes);
    changed files land under ``site_root``, a deleted one as an OCI whiteout; a new file
    outside them under ``image_root`` at its folder's destination (``_placed``)."""
    parts = split_diff(patch_text)
    inside = [p for p in parts if PurePosixPath(p.path).parts[0] in packages]
    placed = _placed([p for p in parts if p not in inside], len(parts), packages,
                     destinations or {}, label=label, what=what)
    for p in [*inside, *placed]:
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
        filtered.write_text("".join(p.text for p in [*inside, *placed]), encoding="utf-8")
        proc = subprocess.run(
            ["patch", "-p1", "--batch", "--forward", "--no-backup-if-mismatch",
             "--reject-file=-", "-d", str(work), "-i", str(filtered)],
            capture_output=True, text=True, check=False)
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a", encoding="utf-8") as f:
            f.write(f"$ patch -p1 ({label}: {len(inside)} files of {len(parts)} in the "
                    f"packages, {len(placed)} placed outside)\n")
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
        out = []
        for p in placed:
            top, _, rest = p.path.partition("/")
            image = f"{(destinations or {})[top].rstrip('/')}/{rest}"
            assert image_root is not None
            dest = image_root / image.lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(work / p.path, dest)
            out.append(image)
    return PatchResult(changed=sorted(changed), deleted=sorted(deleted), placed=sorted(out))


def _placed(outside: list[FileDiff], total: int, packages: set[str],
            destinations: dict[str, str], *, label: str, what: str) -> list[FileDiff]:
    """The patch's files outside the engine's packages, each new and in a folder the part
    gives a destination; any other is named in the build's failure, and a destination
    that places nothing is refused (a field must have its effect)."""
    lost = [p.path for p in outside
            if PurePosixPath(p.path).parts[0] not in destinations or not p.created]
    if lost:
        more = f" and {len(lost) - 5} more" if len(lost) > 5 else ""
        raise FrankError(
            f"the patch has {len(lost)} of its {total} files that it cannot place: "
            f"{', '.join(lost[:5])}{more} (outside {what}'s packages "
            f"{', '.join(sorted(packages))}; a new file there needs a destination for its "
            "top-level folder in the part's [destinations]; a changed one cannot be placed)",
            field=label)
    used = {PurePosixPath(p.path).parts[0] for p in outside}
    idle = sorted(set(destinations) - used)
    if idle:
        raise FrankError(f"destinations.{idle[0]} places no file: the patch has no new file "
                         f"under {idle[0]}/ outside {what}'s packages", field=label)
    return outside
