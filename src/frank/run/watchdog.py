"""A run's container stopped and removed when ``frank run`` dies without doing it.

SIGKILL (or the OOM killer) gives frank no chance to clean up, and nothing tells the engine:
it runs under ``buildah run`` / ``podman start`` in a session of its own (so that a Ctrl-C in
the terminal reaches frank alone, which stops the container in order). A parent-death signal
(``PR_SET_PDEATHSIG``) set in the client would reach only the client, not the entrypoint
below ``buildah-chroot-exec``; buildah answers it by killing the container outright and
leaves the container, mounted, in its storage. So every run starts this watchdog: a small
process, also in a session of its own, reading a pipe whose only write end is frank's. The
kernel closes that end when frank ends, however it ends. If frank said ``done`` first, the
watchdog exits; otherwise it stops the container as frank would have (``procs.stop_client``:
SIGTERM to the entrypoint, the grace, SIGKILL) and runs the plan's cleanup (``rm``, which
unmounts). What it is told comes through the pipe, never its command line: ``run.reap``
takes a container a live process names for one in use.

Lines on the pipe (JSON): ``{"cleanup": [[argv], ...], "engine", "grace", "forget"}`` first,
then ``{"client": pid, "started": ticks}`` once the client runs, then ``done``.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

from frank.run import procs

_DONE = "done"


class Watchdog:
    """frank's end of the pipe (see the module docstring)."""

    def __init__(self, engine: str, cleanup: list[list[str]], grace: float,
                 forget: list[Path]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "frank.run.watchdog"],
                                     stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        self._say({"cleanup": cleanup, "engine": engine, "grace": grace,
                   "forget": [str(p) for p in forget]})

    def _say(self, what: object) -> None:
        pipe: IO[bytes] | None = self.proc.stdin
        if pipe is None or pipe.closed:
            return
        with contextlib.suppress(OSError):  # a watchdog that is gone cannot help anyway
            pipe.write(json.dumps(what).encode() + b"\n")
            pipe.flush()

    def watch(self, client: int) -> None:
        """The engine's client is running: stop it if frank dies."""
        self._say({"client": client, "started": procs.start_time(client)})

    def stand_down(self) -> None:
        """frank has stopped and removed the container itself."""
        self._say(_DONE)
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)


def main() -> int:
    plan: dict[str, Any] = {}
    client: dict[str, Any] = {}
    for line in sys.stdin:
        doc = json.loads(line)
        if doc == _DONE:
            return 0
        if "client" in doc:
            client = doc
        else:
            plan = doc
    # EOF without "done": frank is gone
    pid = client.get("client")
    if pid is not None:
        procs.stop_client(int(pid), str(plan.get("engine")), float(plan.get("grace", 20.0)),
                          client.get("started"))
    for cmd in plan.get("cleanup") or []:
        subprocess.run(cmd, capture_output=True, check=False)
    for path in plan.get("forget") or []:  # the run's lock (``run.reap.claimed``)
        with contextlib.suppress(OSError):
            Path(path).unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
