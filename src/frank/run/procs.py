"""Process bookkeeping for engines frank starts (trial runs, test servers, containers):
found by group or by parentage, never by name, and stopped the way ``frank run`` stops
them."""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import time
from pathlib import Path

_CHROOT_EXEC = "buildah-chroot-exec"


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in a process group: the engine core and workers an
    engine leaves behind are found by group, never by name."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            if os.getpgid(int(p.name)) == pgid:
                state = (p / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    out.append(int(p.name))
        except (ProcessLookupError, PermissionError, FileNotFoundError, IndexError):
            continue
    return out


def _stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name (state first); [] if gone."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = collections.defaultdict(list)
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            fields = _stat(int(p.name))
            if len(fields) > 1 and fields[1].isdigit():
                kids[int(fields[1])].append(int(p.name))
    return kids


def argv0(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        return ""


def parent(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot): with the pid, names one process even
    after the pid is reused."""
    fields = _stat(pid)
    return int(fields[19]) if len(fields) > 19 else None


def alive(pid: int, started: int | None = None) -> bool:
    """``pid`` is running (not a zombie) and, given ``started``, is the process that
    started then."""
    fields = _stat(pid)
    if not fields or fields[0] == "Z":
        return False
    return started is None or start_time(pid) == started


def descendants(pid: int) -> list[int]:
    """Every live process under ``pid``, parents before children."""
    kids, out, todo = _children(), [], [pid]
    while todo:
        for child in kids.get(todo.pop(0), []):
            out.append(child)
            todo.append(child)
    return out


def entrypoint_pid(client: int) -> int | None:
    """The image's entrypoint process under a ``buildah run`` client, once it exists."""
    for pid in descendants(client):
        up = parent(pid)
        if up is not None and Path(argv0(up)).name == _CHROOT_EXEC:
            return pid
    return None


def session_members(sid: int) -> list[int]:
    """Live processes of session ``sid``: a run's client is started in a session of its
    own, which everything in its container inherits and keeps after the client is gone."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            with contextlib.suppress(OSError):
                if os.getsid(int(p.name)) == sid and alive(int(p.name)):
                    out.append(int(p.name))
    return out


def stop_processes(pids: list[int], grace: float) -> None:
    """SIGTERM to each, then SIGKILL to those still alive after ``grace`` seconds (an
    engine's launcher passes SIGTERM on; the engine gets it too and stops either way)."""
    started = {pid: start_time(pid) for pid in pids}
    _signal(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(alive(p, s) for p, s in started.items()) and time.monotonic() < deadline:
        time.sleep(0.1)
    _signal([p for p, s in started.items() if alive(p, s)], signal.SIGKILL)


def _signal(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def stop_client(client: int, engine: str, grace: float, started: int | None = None) -> None:
    """Stop a container through its engine client as ``frank run`` does: SIGTERM to the
    image's entrypoint (buildah: the launcher, which stops the engine cleanly; ``buildah
    run`` itself would kill the container outright) or to the client (podman passes it on),
    then, after ``grace`` seconds, SIGKILL to the client and everything under it. The
    client leads a session of its own (``start_new_session``): where it is gone already
    (killed by SIGPIPE once frank's end of its output closed), what is left of its session
    (the container's processes, reparented) is stopped instead."""
    if not alive(client, started):
        stop_processes(session_members(client), grace)
        return
    target = (entrypoint_pid(client) if engine == "buildah" else None) or client
    _signal([target], signal.SIGTERM)
    deadline = time.monotonic() + grace
    while (alive(client, started) or session_members(client)) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [*reversed(descendants(client)), client] if alive(client, started) else []
    _signal([*left, *session_members(client)], signal.SIGKILL)
