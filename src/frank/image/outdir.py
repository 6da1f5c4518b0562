"""A compose's output folder (``out/<stack>/``: plan.json, frank.lock, context/, image/),
built aside and swapped in whole.

Why: compose used to replace the folder with the new context before building, so the
previous image was gone while (and, on a failure or a kill, after) the new one was built.
Now everything is written into a stage folder beside the output, and only a complete stage
takes the output's place:

1. ``.out.swap`` records the stage's name and inode;  2. stage and output are exchanged in
one step (``renameat2(RENAME_EXCHANGE)``), so ``out`` is always whole, old or new, and the
stage's name now holds the old one;  3. whatever the new output lacks (``image/`` when
nothing was built, or when the image in place was already the one asked for) is moved
over from it;  4. it and the record are removed.

The next compose of that output finishes a kill's leftovers: if ``out`` has the recorded
inode the exchange happened and 3 and 4 are done, otherwise the stage is removed. Where the
filesystem cannot exchange, ``out`` is renamed aside to ``.out.old`` and the stage renamed
in; a kill between those two is rolled back (``.out.old`` back to ``out``). Leftovers are
removed only when no other compose of the output is running: each compose holds
``.out.lock`` shared while it works and exclusive for the swap.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

from frank.store.flock import opened, relock, try_exclusive

# stage folder -> the output it will become, for the writers that key on the final path
_STAGES: dict[Path, Path] = {}
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step; False where the kernel or filesystem cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (38, 22, 95):  # ENOSYS, EINVAL, EOPNOTSUPP: fall back to two renames
        return False
    raise OSError(err, os.strerror(err), str(b))


def final_path(path: Path) -> Path:
    """Where ``path`` will be once the stage holding it is swapped in (else ``path``)."""
    path = path.absolute()
    for stage, out in _STAGES.items():
        if path == stage or path.is_relative_to(stage):
            return out / path.relative_to(stage)
    return path


def _swap_record(out: Path) -> Path:
    return out.with_name(f".{out.name}.swap")


def _old(out: Path) -> Path:
    return out.with_name(f".{out.name}.old")


def _carry_over(old: Path, out: Path) -> None:
    """Steps 3 and 4: move what ``out`` lacks from ``old``, then drop ``old``."""
    if old.is_dir():
        for entry in sorted(old.iterdir()):
            if not (out / entry.name).exists():
                os.replace(entry, out / entry.name)
    shutil.rmtree(old, ignore_errors=True)


def recover(out: Path) -> None:
    """Finish or roll back a swap a kill interrupted. Call with the output lock exclusive."""
    old = _old(out)
    if old.exists():
        if out.exists():
            _carry_over(old, out)
        else:
            os.replace(old, out)
    record = _swap_record(out)
    try:
        doc = json.loads(record.read_text(encoding="utf-8"))
        stage = out.with_name(str(doc["stage"]))
        swapped = out.is_dir() and out.stat().st_ino == doc["ino"] and stage.name.startswith(
            f".{out.name}.stage-")
    except FileNotFoundError:
        return
    except (ValueError, KeyError, TypeError, OSError, RecursionError):
        swapped = False  # a record cut short: the exchange never started
        stage = out
    if swapped:
        _carry_over(stage, out)
    record.unlink(missing_ok=True)


def clean(out: Path) -> None:
    """Remove every stage and temp folder of ``out`` (and the context writer's own temp
    folders of earlier versions): call only when no other compose of it is running (the
    output lock held exclusive)."""
    recover(out)
    mine = re.compile(rf"\.\.?{re.escape(out.name)}\.(stage-.*|tmp-.*|swap|[a-z0-9_]{{8}})")
    for path in out.parent.iterdir():
        if mine.fullmatch(path.name):  # ".." + stage name: the context writer's temp
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


def _swap_in(stage: Path, out: Path) -> None:
    """Steps 1-4 (see the module docstring)."""
    os.chmod(stage, 0o755)
    if out.is_dir() and not out.is_symlink():
        record = _swap_record(out)
        record.write_text(json.dumps({"stage": stage.name, "ino": stage.stat().st_ino}))
        if _exchange(stage, out):
            _carry_over(stage, out)
            record.unlink()
            return
        record.unlink()
    old = _old(out)
    if out.exists() or out.is_symlink():
        os.replace(out, old)
    os.replace(stage, out)
    _carry_over(old, out)


@contextlib.contextmanager
def staged_output(out: Path) -> Iterator[Path]:
    """Yield a stage path (not yet created) to write the whole output into; on a clean
    exit it takes ``out``'s place whole. Temp files Python makes meanwhile go to a folder
    beside it (so a kill leaves none in /tmp), removed on exit either way."""
    out = out.absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    lock = out.with_name(f".{out.name}.lock")
    token = uuid.uuid4().hex[:12]
    stage = out.with_name(f".{out.name}.stage-{token}")
    scratch = out.with_name(f".{out.name}.tmp-{token}")
    with opened(lock) as fd:
        if try_exclusive(fd):  # nobody else composing into it: clear what kills left
            clean(out)
        relock(fd, shared=True)
        scratch.mkdir()
        saved = tempfile.tempdir
        tempfile.tempdir = str(scratch)
        _STAGES[stage] = out
        try:
            yield stage
            tempfile.tempdir = saved
            relock(fd, shared=False)
            recover(out)
            _swap_in(stage, out)
        finally:
            tempfile.tempdir = saved
            _STAGES.pop(stage, None)
            shutil.rmtree(scratch, ignore_errors=True)
            shutil.rmtree(stage, ignore_errors=True)
