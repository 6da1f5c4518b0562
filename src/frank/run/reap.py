"""Working containers a killed ``frank run`` left behind, found and removed.

A run stopped by SIGTERM removes its container; one killed by SIGKILL (or a test that kills
one) cannot, and the container stays in frank's engine storage with its root filesystem
mounted: later a cache folder cannot be deleted ("Device or resource busy"). Every run
holds a lock named after its container (``<runroot>/frank-runs/<name>.lock``) while the
container exists, and the kernel drops it when the run dies however it dies. The next run
(and ``frank gc``) removes each container of frank's naming (``frank-run-<hex>``) whose lock
nobody holds and that no live process names: its mounts go with it (``rm`` unmounts).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

from frank.store.flock import opened, try_exclusive

NAME = re.compile(r"frank-run-[0-9a-f]{12}")


def _lock_path(engine_args: list[str], name: str) -> Path | None:
    """Where a run's lock lives: beside the engine's runroot (buildah, podman)."""
    if "--runroot" not in engine_args:
        return None
    return Path(engine_args[engine_args.index("--runroot") + 1]) / "frank-runs" / f"{name}.lock"


@contextlib.contextmanager
def claimed(engine_args: list[str], name: str) -> Iterator[None]:
    """Hold the lock that says container ``name`` belongs to a live run, for the block."""
    path = _lock_path(engine_args, name)
    if path is None:
        yield
        return
    with opened(path) as fd:
        try_exclusive(fd)  # a fresh name: nobody else holds it
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                path.unlink()


def _named_by_a_process(name: str) -> bool:
    needle = name.encode()
    for p in Path("/proc").iterdir():
        if p.name.isdigit() and int(p.name) != os.getpid():
            with contextlib.suppress(OSError):
                if needle in (p / "cmdline").read_bytes():
                    return True
    return False


def _containers(engine_args: list[str]) -> list[str]:
    exe = Path(engine_args[0]).name
    args = ["containers", "--all", "--format", "{{.ContainerName}}"] if exe == "buildah" \
        else ["ps", "--all", "--format", "{{.Names}}"]
    proc = subprocess.run([*engine_args, *args], capture_output=True, text=True, check=False)
    return [n for n in proc.stdout.split() if NAME.fullmatch(n)] if proc.returncode == 0 \
        else []


def stale(engine_args: list[str]) -> list[str]:
    """frank's working containers in this storage whose run is gone."""
    found = []
    for name in _containers(engine_args):
        path = _lock_path(engine_args, name)
        if path is not None and path.exists():
            with opened(path) as fd:
                if not try_exclusive(fd):
                    continue  # its run holds it: alive
        if not _named_by_a_process(name):
            found.append(name)
    return found


def reap(engine_args: list[str]) -> list[str]:
    """Remove the stale containers (mounts included); their names."""
    gone = []
    exe = Path(engine_args[0]).name
    for name in stale(engine_args):
        rm = [*engine_args, "rm", name] if exe == "buildah" else [*engine_args, "rm", "-f", name]
        if subprocess.run(rm, capture_output=True, check=False).returncode == 0:
            gone.append(name)
        path = _lock_path(engine_args, name)
        if path is not None:
            with contextlib.suppress(OSError):
                path.unlink()
    return gone
