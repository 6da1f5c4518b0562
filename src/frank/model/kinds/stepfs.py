"""What a post-install step changed in its stage, outside what it declared.

A step's layer holds only its declared ``outputs`` (and ``removes``): anything else the
command changes in the image is dropped when the stage ends, so a script that edits a file it
did not declare would leave the image silently unlike what the step meant. This file runs in
the step's stage with the image's own python3 (frank ships its text there, so it uses the
standard library only): ``save`` records every path's type, mode, owner, size, mtime and link
text before the command, ``check`` compares after it and prints one line naming the
undeclared changes, exiting 1.

Left out, as scratch no layer keeps and no step could mean to change: ``/proc``, ``/sys``,
``/dev``, ``/run`` (the engine's mounts), ``/tmp`` and ``/var/tmp``, the step's own input
folders and its workdir when frank made it, and Python's bytecode caches (``__pycache__``:
the interpreter writes them on import, and frank leaves them out of every layer). A folder's
own mtime and size change whenever an entry is added, so folders are compared by type, mode
and owner only; a new folder on the way to an allowed path is allowed.
"""

from __future__ import annotations

import os
import pickle
import stat
import sys

SCRATCH = ("/proc", "/sys", "/dev", "/run", "/tmp", "/var/tmp")
SHOWN = 12  # paths named in the error line; the rest are counted


def _under(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def snapshot(skip: list[str], root: str = "/") -> dict[str, tuple[object, ...]]:
    """Every path of the filesystem at ``root`` (not under ``skip``; both as image paths)
    -> what a change would alter."""
    out: dict[str, tuple[object, ...]] = {}
    todo = ["/"]
    while todo:
        folder = todo.pop()
        try:
            entries = list(os.scandir(root.rstrip("/") + folder))
        except OSError:
            continue
        for entry in entries:
            path = folder.rstrip("/") + "/" + entry.name
            if entry.name == "__pycache__" or _under(path, skip):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            owner = (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
            if stat.S_ISDIR(st.st_mode):
                out[path] = ("d", *owner)
                todo.append(path)
            elif stat.S_ISLNK(st.st_mode):
                out[path] = ("l", *owner, os.readlink(entry.path))
            elif stat.S_ISREG(st.st_mode):
                out[path] = ("f", *owner, st.st_size, st.st_mtime_ns)
            else:
                out[path] = ("o", stat.S_IFMT(st.st_mode), *owner, st.st_rdev)
    return out


def changes(before: dict[str, tuple[object, ...]], after: dict[str, tuple[object, ...]],
            allowed: list[str], new_scratch: list[str]) -> list[str]:
    """``PATH (added|changed|removed)`` for each difference outside ``allowed`` (and under a
    ``new_scratch`` folder only when that folder did not exist before)."""
    allowed = allowed + [s for s in new_scratch if s not in before]
    found = []
    for path in sorted(set(before) | set(after)):
        if before.get(path) == after.get(path) or _under(path, allowed):
            continue
        if path not in before and after[path][0] == "d" and \
                any(a.startswith(path.rstrip("/") + "/") for a in allowed):
            continue  # a new folder on the way to an output
        what = "added" if path not in before else "removed" if path not in after else "changed"
        found.append(f"{ascii(path)[1:-1]} ({what})")
    return found


def _split(args: list[str]) -> dict[str, list[str]]:
    """``--name a b --other c`` -> {name: [a, b], other: [c]}."""
    out: dict[str, list[str]] = {}
    key = ""
    for arg in args:
        if arg.startswith("--"):
            key = arg[2:]
            out.setdefault(key, [])
        else:
            out.setdefault(key, []).append(arg)
    return out


def main(argv: list[str]) -> int:
    """``save STATE --skip P...`` or ``check STATE --step NAME --skip P... --allowed P...
    --new-scratch P...``."""
    what, state, opts = argv[0], argv[1], _split(argv[2:])
    skip = [*SCRATCH, *opts.get("skip", [])]
    if what == "save":
        with open(state, "wb") as f:
            pickle.dump(snapshot(skip), f)
        return 0
    with open(state, "rb") as f:
        before = pickle.load(f)
    found = changes(before, snapshot(skip), opts.get("allowed", []),
                    opts.get("new-scratch", []))
    if not found:
        return 0
    more = f" and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
    print(f"frank: step {opts['step'][0]} changed files outside its outputs, which its layer "
          f"would drop: {', '.join(found[:SHOWN])}{more}; declare them in outputs or removes, "
          "or write scratch under /tmp", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
