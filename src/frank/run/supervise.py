"""Execute a ``RunPlan``: start the container, pass signals on, say when it is ready, and
always remove the working container (on a normal exit, an error, SIGTERM or Ctrl-C).

Why signals go to the entrypoint process under buildah: ``buildah run`` answers SIGTERM by
killing the container outright, so the engine never shuts down cleanly. Chroot isolation
shares the host's process table, so the launcher (the child of ``buildah-chroot-exec``) is
signalled directly and forwards to the engine as it does under ``frank serve``. podman
proxies signals from its client to the container itself; a docker container is signalled
through the daemon (``run.dockerrun.ContainerProcess``), its docker-init passing them on.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import IO, Any

from frank.errors import FrankError
from frank.image.oci import image_view
from frank.run import launch, runcache
from frank.run.container import RUN_CACHE_IN_CONTAINER, RunPlan, warm_mounts, warm_suffix
from frank.run.enginecopy import differences, expected_tree, imported_again, refused, tree_of_dir
from frank.run.procs import descendants, entrypoint_pid
from frank.run.reap import claimed, leftovers, lock_path
from frank.run.watchdog import Watchdog
from frank.store.tmpdirs import drop, hold, release

STOP_GRACE_S = 20.0
# What buildah itself says when the container exits non-zero: not the container's words.
_ENGINE_NOISE = re.compile(r"subprocess exited (with status -?\d+|on \w+)|"
                           r"Error: (exit status -?\d+|signal: \w+)")
# The launcher's own ready line inside the container (stack and lock digest only): frank run
# prints one ready line instead, naming the image and the lock, each labelled.
_LAUNCHER_READY = re.compile(r"frank: ready: \S+ \(sha256:[0-9a-f]{64}\) on \S+")


class _Interrupted(Exception):
    """A signal arrived before the container was started."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _passed(text: str, tail: collections.deque[str]) -> bool:
    """Whether a container's line is passed on (not buildah's own exit notes, not the
    launcher's ready line); the passed ones are kept as the last lines for errors."""
    if _ENGINE_NOISE.fullmatch(text) or _LAUNCHER_READY.fullmatch(text):
        return False
    if text:
        tail.append(text)
    return True


def _pump(src: IO[bytes], dest: IO[bytes], tail: collections.deque[str]) -> None:
    """Pass the container's lines on (see ``_passed``), keeping the last."""
    for line in iter(src.readline, b""):
        if not _passed(line.decode(errors="replace").strip(), tail):
            continue
        dest.write(line)
        dest.flush()


def _quiet(cmd: list[str], what: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        raise FrankError(f"{what} failed (exit {proc.returncode}): "
                         f"{' '.join((lines or ['?'])[-1].split())}")
    return proc.stdout


def _port_free(url: str) -> None:
    """Refuse to start when something already listens where the engine will: its /health
    would be taken for the container's."""
    parsed = urllib.parse.urlsplit(url)
    with socket.socket() as sock:
        sock.settimeout(1)
        if sock.connect_ex((parsed.hostname or "127.0.0.1", parsed.port or 80)) == 0:
            raise FrankError(f"something already listens on {parsed.netloc}, the port the "
                             "lock's flags give the engine: stop it first")


class Runner:
    """One execution of a plan (see the module docstring for how signals travel)."""

    def __init__(self, plan: RunPlan, ready_timeout: float,
                 output: IO[bytes] | None = None) -> None:
        self.plan = plan
        self.ready_timeout = ready_timeout
        self.output = output  # both of the container's streams; default ours
        self.proc: subprocess.Popen[bytes] | None = None
        self.signalled: int | None = None
        self.tail: collections.deque[str] = collections.deque(maxlen=20)
        self.image_name: str | None = None
        self.cleaning = False
        self.pumps: list[threading.Thread] = []
        self._claim: contextlib.AbstractContextManager[None] | None = None
        self.docker: Any = None  # the SDK's client, for engine docker
        self._view: int | None = None  # the held folder of the image's view (``link``)
        self._watchdog: Watchdog | None = None  # stops the container if frank is killed

    def _signal(self, signum: int, _frame: FrameType | None) -> None:
        if self.proc is None and not self.cleaning:
            raise _Interrupted(signum)
        if self.cleaning or self.signalled is not None:  # again: stop waiting for a clean exit
            self._kill()
            return
        self.signalled = signum
        self._forward(signum)

    def _forward(self, signum: int) -> None:
        assert self.proc is not None
        if self.plan.engine == "docker":
            self.proc.send_signal(signum)
            return
        target = self.proc.pid
        if self.plan.engine == "buildah":
            target = entrypoint_pid(self.proc.pid) or target
        with contextlib.suppress(ProcessLookupError):
            os.kill(target, signum)

    def _kill(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        if self.plan.engine == "docker":
            self.proc.kill()
            return
        for pid in [*reversed(descendants(self.proc.pid)), self.proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def _stop(self) -> None:
        """SIGTERM to the container, then SIGKILL if it has not exited within the grace."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self._forward(signal.SIGTERM)
        try:
            self.proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self._kill()
            self.proc.wait()

    def execute(self) -> int:
        """Run the plan; the container's exit code, or a FrankError when it never served."""
        handlers = {s: signal.signal(s, self._signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self.start()
            if self.plan.serve:
                self._await_ready()
            assert self.proc is not None
            code = self.proc.wait()
            return code if code >= 0 else 128 - code
        except _Interrupted as exc:
            return 128 + exc.signum
        finally:
            self.finish()
            for signum, handler in handlers.items():
                signal.signal(signum, handler)

    def start(self) -> None:
        """Prepare the working container and start the image's entrypoint in it."""
        if self.plan.serve:
            _port_free(self.plan.url)
        storages = [self.plan.engine_args] if self.plan.engine != "docker" else []
        for what in leftovers(storages):  # what killed runs and builds left
            print(f"frank: removed {what}", file=sys.stderr, flush=True)
        if self.plan.link:  # buildah: per image digest, a second run of the image shares it
            self._view = hold(Path(self.plan.link).parent)  # held: not reaped while used
            image_view(Path(self.plan.layout), self.plan.image, Path(self.plan.link))
        if self.plan.engine in ("buildah", "podman"):
            self._claim = claimed(self.plan.engine_args, self.plan.container)
            self._claim.__enter__()
            lock = lock_path(self.plan.engine_args, self.plan.container)
            self._watchdog = Watchdog(self.plan.engine, self.plan.cleanup, STOP_GRACE_S,
                                      [lock] if lock else [])
        if self.plan.run_cache and not runcache.prepare_pycache(Path(self.plan.run_cache)):
            print("frank: the run cache's bytecode had no valid seal (issue 53): emptied it",
                  file=sys.stderr, flush=True)
        if self.plan.engine == "docker":
            self._start_docker()
            return
        for cmd in self.plan.prepare:
            _quiet(cmd, f"{Path(cmd[0]).name}, preparing the container")
        self._remember_image()
        self._check_engine_copy()
        self.proc = subprocess.Popen(self.plan.run, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True)
        if self._watchdog is not None:
            self._watchdog.watch(self.proc.pid)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        outs = (self.output or sys.stdout.buffer, self.output or sys.stderr.buffer)
        self.pumps = [threading.Thread(target=_pump, args=(src, dest, self.tail), daemon=True)
                      for src, dest in zip((self.proc.stdout, self.proc.stderr), outs,
                                           strict=True)]
        for t in self.pumps:
            t.start()

    def _start_docker(self) -> None:
        """Load the image into the daemon (id checked) and start its container."""
        from frank.run import dockerrun
        from frank.run.container import docker_tag

        assert self.plan.docker is not None and self.plan.run_cache is not None
        self.docker = dockerrun.client()
        for name in dockerrun.reap(self.docker):  # what runs killed by SIGKILL left
            print(f"frank: removed {name}, the container of a run that was killed",
                  file=sys.stderr, flush=True)
        mounts = [(self.plan.run_cache, RUN_CACHE_IN_CONTAINER, False),
                  *warm_mounts(self.plan),
                  *((m.host, m.container, True) for m in self.plan.mounts)]
        kwargs = dockerrun.create_kwargs(self.plan.docker, name=self.plan.container,
                                         env=self.plan.env, mounts=mounts)
        container = dockerrun.checked_container(
            self.docker, Path(self.plan.layout), self.plan.image, docker_tag(self.plan.image),
            kwargs, progress=lambda m: print(f"frank: {m}", file=sys.stderr, flush=True))
        outs = (self.output or sys.stdout.buffer, self.output or sys.stderr.buffer)
        proc, pump = dockerrun.start(container, outs, lambda text: _passed(text, self.tail))
        self.proc = proc  # type: ignore[assignment]  # Popen's poll/wait/signal, see dockerrun
        self.pumps = [pump]

    def finish(self) -> None:
        """Stop the container (SIGTERM, then SIGKILL after the grace) and remove it."""
        self.cleaning = True  # a signal now only hurries the stop: cleanup must finish
        self._stop()
        self._drain()
        self._clean()
        if self.plan.run_cache and self.proc is not None:
            runcache.seal_pycache(Path(self.plan.run_cache))

    def _await_ready(self) -> None:
        assert self.proc is not None
        start = time.monotonic()
        if launch.wait_ready(self.plan.url, self.proc, self.ready_timeout):
            ready = (f"frank: ready: {self.plan.stack} image {self.plan.image} lock "
                     f"{self.plan.lock_digest} on {self.plan.url.removesuffix('/health')} "
                     f"({time.monotonic() - start:.1f} s, container {self.plan.container} "
                     f"via {self.plan.engine}){warm_suffix(self.plan)}")
            if self.output is not None:
                self.output.write(ready.encode() + b"\n")
                self.output.flush()
            else:
                print(ready, file=sys.stderr, flush=True)
            return
        if self.proc.poll() is None:  # still running, never answered
            self._stop()
            self._drain()
            raise FrankError(f"{self.plan.url} did not answer 200 within {self.ready_timeout:g}"
                             f" s; stopped the container{self._last_lines()}",
                             field="--wait-ready")
        code = self.proc.wait()
        if code != 0 and self.signalled is None:
            self._drain()
            raise FrankError(f"the container exited {code} before {self.plan.url} answered"
                             f"{self._last_lines()}")

    def _drain(self) -> None:
        """Wait (briefly) for the container's last lines to be passed on."""
        for t in self.pumps:
            t.join(5)

    def _last_lines(self) -> str:
        lines = list(self.tail)[-3:]
        return ": " + " | ".join(lines) if lines else ""

    def _remember_image(self) -> None:
        """The image buildah stored for the working container, removed with it afterwards."""
        if self.plan.engine != "buildah":
            return
        proc = subprocess.run([*self.plan.engine_args, "inspect", "--type", "container",
                               "--format", "{{.FromImage}}", self.plan.container],
                              capture_output=True, text=True, check=False)
        self.image_name = proc.stdout.strip() or None

    def _engine_differences(self) -> list[str]:
        """Where the working container's root (the engine's stored copy of the image) is
        not what the image's layers make (see ``frank.image.enginecopy``)."""
        base, ctr, exe = self.plan.engine_args, self.plan.container, self.plan.engine
        root = _quiet([*base, "mount", ctr], f"{exe} mount, checking the engine's copy")
        try:
            return differences(expected_tree(Path(self.plan.layout), self.plan.image),
                               tree_of_dir(Path(root.strip().splitlines()[-1])))
        finally:
            subprocess.run([*base, "umount", ctr], capture_output=True, check=False)

    def _check_engine_copy(self) -> None:
        """Run only what the layout holds (buildah, podman): a stored copy that differs is
        removed (every image of frank's storage no container uses) and imported again from
        the layout; one that still differs is refused."""
        wrong = self._engine_differences()
        if not wrong:
            return
        base = self.plan.engine_args
        for cmd in self.plan.cleanup:  # the working container
            subprocess.run(cmd, capture_output=True, check=False)
        subprocess.run([*base, "rmi", "--all"], capture_output=True, check=False)
        imported_again(self.plan.image, wrong)
        for cmd in self.plan.prepare:
            _quiet(cmd, f"{Path(cmd[0]).name}, preparing the container")
        still = self._engine_differences()
        if still:
            raise refused(self.plan.image, still,
                          base[base.index("--root") + 1] if "--root" in base else None)

    def _clean(self) -> None:
        if self.plan.engine == "docker":
            if self.docker is not None:
                from frank.run.dockerrun import remove

                remove(self.docker, self.plan.container)
            return
        for cmd in self.plan.cleanup:
            subprocess.run(cmd, capture_output=True, check=False)
        if self._claim is not None:
            self._claim.__exit__(None, None, None)
            self._claim = None
        if self._watchdog is not None:
            self._watchdog.stand_down()
            self._watchdog = None
        # buildah keeps the imported image, named by its digest, for the next run (the
        # layout is verified before every run; the storage is the engine's, like its cache)
        if self.image_name and self.plan.engine != "buildah":
            subprocess.run([*self.plan.engine_args, "rmi", self.image_name],
                           capture_output=True, check=False)
        if self._view is not None and self.plan.link:  # the next run makes it again
            release(self._view)
            self._view = None
            drop(Path(self.plan.link).parent)  # unless another run of the image holds it


def execute(plan: RunPlan, ready_timeout: float) -> int:
    """Run ``plan`` to the end; see ``Runner``."""
    return Runner(plan, ready_timeout).execute()


class Interrupted(Exception):
    """SIGINT or SIGTERM arrived while ``serving`` held a container (it is removed)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def serving(plan: RunPlan, ready_timeout: float, output: IO[bytes]) -> Iterator[Runner]:
    """Start ``plan``'s container, yield once /health answers, then stop and remove it.

    Why not ``execute``: a caller that drives the engine itself (a trial's workload) needs
    the container between ready and stop. The container's output goes to ``output``; a
    container that never serves is a ``FrankError`` (quoting its last lines) after it is
    removed; SIGINT/SIGTERM raise ``Interrupted`` so the caller's own cleanup runs too, and
    a second one during the stop hurries it.
    """
    runner = Runner(plan, ready_timeout, output)

    def interrupt(signum: int, _frame: FrameType | None) -> None:
        if runner.cleaning:
            runner._kill()
            return
        raise Interrupted(signum)

    handlers = {s: signal.signal(s, interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        runner.start()
        runner._await_ready()
        assert runner.proc is not None
        if runner.proc.poll() is not None:  # exited 0 before it ever answered
            raise FrankError(f"the container exited {runner.proc.returncode} before "
                             f"{plan.url} answered{runner._last_lines()}")
        yield runner
    finally:
        runner.finish()
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
