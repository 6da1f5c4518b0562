"""Working containers a killed ``frank run`` left behind, found and removed.

A run stopped by SIGTERM removes its container; one killed by SIGKILL (or a test that kills
one) cannot, and the container stays in frank's engine storage with its root filesystem
mounted: later a cache folder cannot be deleted ("Device or resource busy"). Every run
holds a lock named after its container (``<runroot>/frank-runs/<name>.lock``) while the
container exists, and the kernel drops it when the run dies however it dies. The next run
(and ``frank gc``) removes each container of frank's naming (``frank-run-<hex>``) whose lock
nobody holds and that no live process names: its mounts go with it (``rm`` unmounts).
A run's watchdog (``run.watchdog``) stops its engine when the run is killed; where both were
killed, the engine serves on, named by its client: ``frank gc`` stops it (``stop_orphans``)
and then removes the container.
``leftovers`` adds the rest a killed command leaves: a build's working containers
(``build.engines.reap_builds``), frank's folders in /tmp (``store.tmpdirs``) and the run
roots of deleted caches (``build.engines.reap_runroots``).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

from frank.run.procs import stop_processes
from frank.store.flock import opened, try_exclusive
from frank.store.tmpdirs import mount_points

NAME = re.compile(r"frank-run-[0-9a-f]{12}")
ORPHAN_GRACE_S = 10.0  # an orphan's engine gets this long to stop cleanly


def lock_path(engine_args: list[str], name: str) -> Path | None:
    """Where a run's lock lives: beside the engine's runroot (buildah, podman)."""
    if "--runroot" not in engine_args:
        return None
    return Path(engine_args[engine_args.index("--runroot") + 1]) / "frank-runs" / f"{name}.lock"


@contextlib.contextmanager
def claimed(engine_args: list[str], name: str) -> Iterator[None]:
    """Hold the lock that says container ``name`` belongs to a live run, for the block."""
    path = lock_path(engine_args, name)
    if path is None:
        yield
        return
    with opened(path) as fd:
        try_exclusive(fd)  # a fresh name: nobody else holds it
        os.write(fd, f"{os.getpid()}\n".encode())  # for a reader; the lock is what counts
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                path.unlink()


def _naming(name: str) -> list[int]:
    """Live processes (not this one) that name container ``name``: in their command line
    (its engine's client) or as ``FRANK_RUN`` in their environment (every process in it,
    which outlives a client killed with its run)."""
    needle, env, out = name.encode(), f"FRANK_RUN={name}\0".encode(), []
    for p in Path("/proc").iterdir():
        if p.name.isdigit() and int(p.name) != os.getpid():
            with contextlib.suppress(OSError):
                if needle in (p / "cmdline").read_bytes() or \
                        env in (p / "environ").read_bytes() + b"\0":
                    out.append(int(p.name))
    return out


def _named_by_a_process(name: str) -> bool:
    return bool(_naming(name))


def _containers(engine_args: list[str]) -> list[str]:
    exe = Path(engine_args[0]).name
    args = ["containers", "--all", "--format", "{{.ContainerName}}"] if exe == "buildah" \
        else ["ps", "--all", "--format", "{{.Names}}"]
    proc = subprocess.run([*engine_args, *args], capture_output=True, text=True, check=False)
    return [n for n in proc.stdout.split() if NAME.fullmatch(n)] if proc.returncode == 0 \
        else []


def _claimed(engine_args: list[str], name: str) -> bool:
    """Whether a live run holds container ``name``'s lock."""
    path = lock_path(engine_args, name)
    if path is None or not path.exists():
        return False
    with opened(path) as fd:
        return not try_exclusive(fd)


def stale(engine_args: list[str]) -> list[str]:
    """frank's working containers in this storage whose run is gone."""
    return [name for name in _containers(engine_args)
            if not _claimed(engine_args, name) and not _named_by_a_process(name)]


def orphans(engine_args: list[str]) -> dict[str, list[int]]:
    """Containers whose run is gone (nobody holds the run's lock) while their engine still
    serves: the run and its watchdog (``run.watchdog``) were both killed. Container ->
    the processes that name it (``_naming``). Only runs that hold a lock (buildah,
    podman) can be told from live ones."""
    found = {}
    for name in _containers(engine_args):
        if lock_path(engine_args, name) is not None and not _claimed(engine_args, name):
            clients = _naming(name)
            if clients:
                found[name] = clients
    return found


def stop_orphans(engine_args: list[str], *, dry_run: bool = False) -> list[str]:
    """Stop each orphan's processes (``procs.stop_processes``: SIGTERM, the grace,
    SIGKILL); ``reap`` then removes its container. Their names."""
    found = orphans(engine_args)
    if not dry_run:
        for pids in found.values():
            stop_processes(pids, ORPHAN_GRACE_S)
    return list(found)


def reap(engine_args: list[str]) -> list[str]:
    """Remove the stale containers (mounts included); their names."""
    gone = []
    exe = Path(engine_args[0]).name
    for name in stale(engine_args):
        rm = [*engine_args, "rm", name] if exe == "buildah" else [*engine_args, "rm", "-f", name]
        if subprocess.run(rm, capture_output=True, check=False).returncode == 0:
            gone.append(name)
        path = lock_path(engine_args, name)
        if path is not None:
            with contextlib.suppress(OSError):
                path.unlink()
    return gone


def _unmount_idle_storage(engine_args: list[str]) -> list[str]:
    """The driver's folder of an overlay storage stays bind-mounted on itself after every
    engine command (containers/storage makes it private that way), so a cache holding it
    cannot be deleted ("Device or resource busy"). With nothing mounted below it (no
    container mounted: the engine mounts it again when next used) it is unmounted."""
    root = Path(engine_args[engine_args.index("--root") + 1])
    driver = engine_args[engine_args.index("--storage-driver") + 1] \
        if "--storage-driver" in engine_args else "vfs"
    top = str(root / driver)
    points = mount_points()
    idle = top in points and not any(p.startswith(top + "/") for p in points)
    if idle and subprocess.run(["umount", top], capture_output=True).returncode == 0:
        return [f"{top}, the mount an engine storage kept"]
    return []


def leftovers(storages: list[list[str]], *, dry_run: bool = False,
              storage_mounts: bool = False, engines: bool = False) -> list[str]:
    """Remove (``dry_run``: only find) what killed runs and builds left: their containers in
    each engine storage (``storages``: engine argv with ``--root``), mounts included,
    frank's folders in /tmp that nobody holds (``store.tmpdirs``), the run roots of deleted
    caches, and (``storage_mounts``, for gc) each storage's own idle mount; one line each.
    ``engines`` (gc) first stops the engines of runs that are gone (``stop_orphans``)."""
    from frank.assemble.engines import reap_builds, reap_runroots
    from frank.store import tmpdirs

    said = []
    for args in storages:
        if engines:
            said += [f"{n}, the engine of a run that was killed (stopped)"
                     for n in stop_orphans(args, dry_run=dry_run)]
        said += [f"{n}, the container of a run that was killed"
                 for n in (stale(args) if dry_run else reap(args))]
        said += [f"{n}, the {'result' if n.startswith('localhost/') else 'working container'}"
                 " of a build that was killed" for n in reap_builds(args, dry_run=dry_run)]
        if storage_mounts and not dry_run:
            said += _unmount_idle_storage(args)
    said += [f"{p}, a folder in /tmp no frank command holds"
             for p in tmpdirs.reap(dry_run=dry_run)]
    said += [f"{p}, the run root of an engine storage that is gone"
             for p in reap_runroots(dry_run=dry_run)]
    return said
