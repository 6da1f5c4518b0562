"""Writing files so that nothing on disk is ever half-written, and the repo root."""

from __future__ import annotations

import os
from pathlib import Path

from frank.errors import FrankError


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write to a temp file beside ``path`` and rename it into place."""
    raw = data.encode() if isinstance(data, str) else data
    path.parent.mkdir(parents=True, exist_ok=True)
    import tempfile  # only when writing: read commands start without it

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(raw)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def find_repo_root(start: Path) -> Path:
    """The nearest folder at or above ``start`` that holds ``parts/`` or ``stacks/``
    (resolved). Looked for along the path as given, not its target: ``stacks/sub`` linking
    to another repo's stacks/ is still in this repo, where what it links to is refused as
    outside (``inside_repo``), instead of making that repo the one written."""
    start = Path(os.path.abspath(start))
    for folder in [start, *start.parents]:
        if (folder / "parts").is_dir() and (folder / "stacks").is_dir():
            return folder.resolve()
    raise FrankError(f"no frank repo (a folder with parts/ and stacks/) at or above {start}")


def inside_repo(root: Path, path: Path, *, file: Path | str, field: str) -> Path:
    """``path`` resolved, refused in one line (naming ``file`` and ``field``) when links
    take it out of the repo at ``root``: frank never reads or writes another tree."""
    real = path.resolve()
    if not real.is_relative_to(root.resolve()):
        raise FrankError(f"{path} links to {real}, outside the repo", file=file, field=field)
    return real


def repo_path(root: Path, value: str, *, file: Path, field: str, must_exist: bool = True) -> Path:
    """Resolve a repo-relative path, refusing one that escapes the repo or is missing."""
    if Path(value).is_absolute():
        raise FrankError(f"{value!r} must be relative to the repo root", file=file, field=field)
    if not Path(os.path.normpath(root / value)).is_relative_to(root):
        raise FrankError(f"{value!r} escapes the repo root", file=file, field=field)
    full = (root / value).resolve()
    if not full.is_relative_to(root.resolve()):
        raise FrankError(f"{value!r} links to {full}, outside the repo", file=file, field=field)
    if must_exist and not full.exists():
        raise FrankError(f"{value!r} does not exist", file=file, field=field)
    return full
