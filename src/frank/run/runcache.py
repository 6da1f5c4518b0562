"""The run cache's bytecode, sealed: nothing from the cache executes unchecked (issue 53).

``frank run`` points the container's ``PYTHONPYCACHEPREFIX`` at ``run-cache/<image>/pycache``
so a second start of an image does not compile every module again (12 s of vLLM's start on
a CPU). A .pyc there runs in the container, and Python checks a timestamp .pyc only by its
source's mtime and size, both easy to copy. So the folder is sealed when a run ends: an HMAC
(sha256) over every path, mode and content under it, keyed by a secret of this user kept
outside the cache (``$XDG_CONFIG_HOME/frank/run-cache.key``, made on first use, 0600). The
next run keeps the folder only when the seal is right; anything else (no seal, a file added,
edited or linked in, a run killed before it sealed) and the folder is emptied, so the
container compiles from the image's own (audited) sources. Someone who can write the cache
but not the user's config folder cannot make a seal. The seal is taken off while a run is
using the folder.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import shutil
import stat
import tempfile
from pathlib import Path

from frank.fsutil import write_atomic

KEY_NAME = "run-cache.key"
SEAL = "pycache.seal"
PYCACHE = "pycache"


def key_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "frank" / KEY_NAME


def _key() -> bytes:
    path = key_path()
    try:
        data = path.read_bytes()
        if len(data) >= 32:
            return data
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".key-")
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, os.urandom(32))
        os.close(fd)
        os.link(tmp, path)  # the first writer wins; a racing one reads the winner's
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    return path.read_bytes()


def _digest(folder: Path, key: bytes) -> str | None:
    """The HMAC of ``folder``'s tree, None if it holds anything but folders and files."""
    mac = hmac.new(key, digestmod=hashlib.sha256)
    for top, dirs, files in os.walk(folder):
        dirs.sort()
        rel_top = os.path.relpath(top, folder)
        for name in sorted(files) + [d for d in dirs]:
            path = os.path.join(top, name)
            st = os.lstat(path)
            rel = os.path.normpath(os.path.join(rel_top, name))
            if stat.S_ISDIR(st.st_mode):
                mac.update(f"d {rel}\0".encode())
                continue
            if not stat.S_ISREG(st.st_mode):
                return None  # a link or a device: never sealed
            with open(path, "rb") as f:
                content = hashlib.file_digest(f, "sha256").hexdigest()
            mac.update(f"f {st.st_mode & 0o7777:o} {content} {rel}\0".encode())
    return mac.hexdigest()


def prepare_pycache(run_cache: Path) -> bool:
    """Before a run: keep ``run_cache/pycache`` if its seal is right (True), else empty it
    (False). The seal is taken off either way: the run is about to write there."""
    folder, seal = run_cache / PYCACHE, run_cache / SEAL
    try:
        said = seal.read_text().strip()
    except OSError:
        said = ""
    seal.unlink(missing_ok=True)
    if not folder.is_dir() or folder.is_symlink():
        if folder.is_symlink() or folder.exists():
            folder.unlink()
        folder.mkdir(parents=True, exist_ok=True)
        return True
    if not any(folder.iterdir()):
        return True
    actual = _digest(folder, _key())
    if said and actual is not None and hmac.compare_digest(said, actual):
        return True
    aside = Path(tempfile.mkdtemp(prefix=".pycache-unsealed-", dir=run_cache))
    os.replace(folder, aside / PYCACHE)
    shutil.rmtree(aside, ignore_errors=True)
    folder.mkdir()
    return False


def seal_pycache(run_cache: Path) -> None:
    """After a run: seal what the run's container compiled into the folder."""
    folder = run_cache / PYCACHE
    if not folder.is_dir() or folder.is_symlink():
        return
    digest = _digest(folder, _key())
    if digest is not None:
        write_atomic(run_cache / SEAL, digest + "\n")
