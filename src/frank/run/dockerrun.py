"""A container of a verified image in a Docker daemon, driven through the ``docker`` SDK.

The image reaches the daemon as one archive stream and is started by the id the daemon
gives it, which must be the layout's config digest (``build.dockerapi.load_layout``): a tag
could be moved by anyone who can talk to the daemon, an id cannot. The container gets what
the buildah path gives the engine: the lock's env, the weights mounted read-only, the run
cache, the host's network when the engine binds loopback (else the port published on
127.0.0.1), a ``/dev/shm`` large enough for the engine's shared tensors, and the lock's GPUs
as a device request (``--gpus N``; the daemon needs NVIDIA's runtime for that).

``ContainerProcess`` makes the container look like the ``Popen`` the supervisor watches
(poll, wait, a signal to the container's main process), so readiness, SIGTERM forwarding
and the stop/kill grace are the supervisor's, the same for every engine.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from frank.assemble.dockerapi import LoadedImage, client, load_layout
from frank.errors import FrankError
from frank.run.enginecopy import (
    Tree,
    differences,
    expected_tree,
    imported_again,
    refused,
    tree_of_tar,
)
from frank.store.tmpdirs import alive

if TYPE_CHECKING:
    import docker
    from docker.models.containers import Container

DEFAULT_SHM = "1g"  # vLLM's CPU and multi-GPU paths share tensors through /dev/shm


@dataclass(frozen=True)
class DockerSpec:
    """How the container is made, beyond what ``RunPlan`` already says (env, mounts)."""

    command: list[str]  # after the image's entrypoint
    network: str  # "host" or "none", or "publish" (the port on 127.0.0.1)
    port: int
    shm_size: str = DEFAULT_SHM
    ipc: str = "private"
    gpus: int = 0
    labels: dict[str, str] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def create_kwargs(spec: DockerSpec, *, name: str, env: dict[str, str],
                  mounts: list[tuple[str, str, bool]]) -> dict[str, Any]:
    """The keyword arguments of ``containers.create`` for ``spec`` (shown by ``--print
    --json`` and used as they are)."""
    from docker.types import DeviceRequest, Mount

    kw: dict[str, Any] = {
        "command": list(spec.command),
        "name": name,
        "environment": dict(env),
        "mounts": [Mount(target, source, type="bind", read_only=ro)
                   for source, target, ro in mounts],
        "shm_size": spec.shm_size,
        "ipc_mode": spec.ipc,
        "init": True,  # docker-init as PID 1 passes SIGTERM on and reaps the engine's children
        "labels": dict(spec.labels),
        "detach": True,
    }
    if spec.network == "publish":
        kw["ports"] = {f"{spec.port}/tcp": ("127.0.0.1", spec.port)}
    else:
        kw["network_mode"] = spec.network
    if spec.gpus > 0:
        kw["device_requests"] = [DeviceRequest(count=spec.gpus, capabilities=[["gpu"]])]
    return kw


def cli_line(spec: DockerSpec, *, name: str, image: str, env: dict[str, str],
             mounts: list[tuple[str, str, bool]]) -> list[str]:
    """The ``docker run`` command that makes the same container (for ``--print``)."""
    argv = ["docker", "run", "--rm", "--name", name, "--init", "--shm-size", spec.shm_size,
            "--ipc", spec.ipc]
    argv += ["-p", f"127.0.0.1:{spec.port}:{spec.port}"] if spec.network == "publish" else \
        ["--network", spec.network]
    for source, target, ro in mounts:
        argv += ["--volume", f"{source}:{target}{':ro' if ro else ''}"]
    for k in sorted(env):
        argv += ["--env", f"{k}={env[k]}"]
    if spec.gpus > 0:
        argv += ["--gpus", str(spec.gpus)]
    return [*argv, image, *spec.command]


class ContainerProcess:
    """A started container, seen as a process: ``poll``, ``wait``, ``send_signal``, ``kill``."""

    def __init__(self, container: Container) -> None:
        self.container = container
        self.returncode: int | None = None
        container.reload()
        self.pid = int(container.attrs.get("State", {}).get("Pid") or 0)

    def poll(self) -> int | None:
        if self.returncode is None:
            from docker.errors import NotFound

            try:
                self.container.reload()
            except NotFound:
                self.returncode = -int(signal.SIGKILL)
                return self.returncode
            state = self.container.attrs.get("State", {})
            if state.get("Status") in ("exited", "dead"):
                self.returncode = int(state.get("ExitCode", 0))
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        import subprocess

        import requests

        if self.poll() is not None:
            assert self.returncode is not None
            return self.returncode
        try:
            result = self.container.wait(timeout=timeout)
        except (requests.exceptions.ConnectionError, requests.exceptions.ReadTimeout):
            raise subprocess.TimeoutExpired("docker wait", timeout or 0) from None
        self.returncode = int(result.get("StatusCode", 0))
        return self.returncode

    def send_signal(self, signum: int) -> None:
        from docker.errors import APIError

        with contextlib.suppress(APIError):
            self.container.kill(signal=int(signum))

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _pump(container: Container, outs: tuple[IO[bytes], IO[bytes]],
          keep: Callable[[str], bool]) -> None:
    """The container's stdout and stderr to ours, whole lines, each passed on only when
    ``keep`` says so (from its first line: the attach replays what came before it)."""
    stream = container.attach(stdout=True, stderr=True, stream=True, logs=True, demux=True)
    rest = [b"", b""]
    for pair in stream:
        for i, data in enumerate(pair):
            if not data:
                continue
            *lines, rest[i] = (rest[i] + data).split(b"\n")
            for line in lines:
                if keep(line.decode(errors="replace").strip()):
                    outs[i].write(line + b"\n")
                    outs[i].flush()
    for i, data in enumerate(rest):
        if data and keep(data.decode(errors="replace").strip()):
            outs[i].write(data + b"\n")
            outs[i].flush()


# What the daemon itself puts in a container's root (its init layer) and mounts over at start.
DAEMON_MADE = ("/.dockerenv", "/etc/hostname", "/etc/hosts", "/etc/resolv.conf", "/etc/mtab",
               "/dev", "/proc", "/sys")


class _Chunks(io.RawIOBase):
    """An iterator of byte chunks (the SDK's streamed answer) as a file to read."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks, self.rest = chunks, b""

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        while not self.rest:
            self.rest = next(self.chunks, b"")
            if not self.rest:
                return 0
        n = min(len(buf), len(self.rest))
        buf[:n], self.rest = self.rest[:n], self.rest[n:]
        return n


def root_tree(c: docker.DockerClient, container: Container) -> Tree:
    """The container's root filesystem as the daemon exports it (the engine's copy)."""
    raw = _Chunks(iter(c.api.export(str(container.id))))
    return tree_of_tar(io.BufferedReader(raw, 1 << 20))


def create(loaded: LoadedImage, c: docker.DockerClient, kwargs: dict[str, Any]) -> Container:
    """Make the container (not started)."""
    from docker.errors import APIError

    try:
        return c.containers.create(loaded.ref, **kwargs)
    except APIError as exc:
        raise FrankError(f"the Docker daemon could not make the container: "
                         f"{' '.join(str(exc.explanation or exc).split())}") from None


def checked_container(c: docker.DockerClient, layout: Path, digest: str, tag: str,
                      kwargs: dict[str, Any],
                      progress: Callable[[str], None] | None = None) -> Container:
    """A container (not started) whose root is what the layout's layers make.

    The daemon reuses a layer it holds by its diff_id without reading it again, so an image
    it already has (the same id) may carry a file edited in its storage. The container's
    exported root is compared with the layout's tree (the daemon's own files and the
    mount points left out: they are covered at start); one that differs is removed with its
    image, the layout loaded again, and a copy that still differs refused."""
    expected = expected_tree(layout, digest)
    ignore = [*DAEMON_MADE, *(str(m["Target"]) for m in kwargs.get("mounts", []))]
    loaded = load_layout(c, layout, tag, digest, progress=progress)
    for again in (False, True):
        container = create(loaded, c, kwargs)
        wrong = differences(expected, root_tree(c, container), ignore=ignore)
        if not wrong:
            return container
        remove(c, str(container.id))
        if again:
            raise refused(digest, wrong, None)
        with contextlib.suppress(Exception):
            c.images.remove(loaded.id, force=True)
        imported_again(digest, wrong)
        loaded = load_layout(c, layout, tag, digest, reuse=False, progress=progress)
    raise AssertionError("unreachable")


def start(container: Container, outs: tuple[IO[bytes], IO[bytes]],
          keep: Callable[[str], bool]) -> tuple[ContainerProcess, threading.Thread]:
    """Start a made container; its output is pumped by the returned thread."""
    from docker.errors import APIError

    pump = threading.Thread(target=_pump, args=(container, outs, keep), daemon=True)
    pump.start()
    try:
        container.start()
    except APIError as exc:
        with contextlib.suppress(APIError):
            container.remove(force=True)
        raise FrankError(f"the Docker daemon could not start the container: "
                         f"{' '.join(str(exc.explanation or exc).split())}") from None
    return ContainerProcess(container), pump


OWNER_LABEL = "dev.frank.run-owner"
_RUN_NAME = re.compile(r"frank-run-[0-9a-f]{12}")


def owner() -> str:
    """This process as the label a run's container carries: boot id, pid namespace, pid.
    A daemon may serve other machines and containers: only this boot's and namespace's
    runs are judged by their pid."""
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return f"{boot}/{os.readlink('/proc/self/ns/pid')}/{os.getpid()}"


def reap(c: docker.DockerClient) -> list[str]:
    """Remove the daemon's containers of frank's runs (``frank-run-<hex>``, owner label)
    whose run, on this machine and in this pid namespace, is gone (killed by SIGKILL); a
    run stopped any other way removes its own. The names removed."""
    here = owner().rpartition("/")[0]
    gone = []
    for ctr in c.containers.list(all=True, filters={"label": OWNER_LABEL}):
        where, _, pid = str((ctr.labels or {}).get(OWNER_LABEL, "")).rpartition("/")
        if where == here and pid.isdigit() and _RUN_NAME.fullmatch(str(ctr.name)) \
                and not alive(int(pid)):
            remove(c, str(ctr.id))
            gone.append(str(ctr.name))
    return gone


def remove(c: docker.DockerClient, name: str) -> None:
    """Remove the container (running or not); gone already is fine."""
    from docker.errors import APIError, NotFound

    with contextlib.suppress(NotFound, APIError):
        c.containers.get(name).remove(force=True)


__all__ = ["ContainerProcess", "DockerSpec", "checked_container", "cli_line", "client",
           "create", "create_kwargs", "load_layout", "owner", "reap", "remove", "root_tree",
           "start"]
