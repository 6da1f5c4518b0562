"""A real Docker daemon for the tests: Debian's dockerd on its own socket, data root and exec
root, started once per test session and stopped (its folders removed) at the end.

Why its own: a test must not touch a daemon someone else uses (their images, containers,
disk), and CI's machine has none running. overlay2 because vfs copies every layer in full;
no iptables and no bridge because the tests run containers on the host's network or none.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

START_TIMEOUT_S = 60


def why_not() -> str | None:
    """Why no daemon can be started here, or None."""
    if shutil.which("dockerd") is None:
        return "needs dockerd (apt-get install docker.io; scripts/setup does)"
    if os.geteuid() != 0:
        return "dockerd needs root"
    return None


@contextmanager
def dockerd() -> Iterator[str]:
    """Start a daemon; yield its DOCKER_HOST (``unix://...``); stop it and remove its folders.

    A daemon that does not answer within ``START_TIMEOUT_S`` is an error naming its log (the
    caller decides whether that skips)."""
    import docker

    # short: containerd's sockets live under the exec root and unix socket paths are short
    top = Path(tempfile.mkdtemp(prefix="frank-dockerd-", dir="/tmp"))
    host = f"unix://{top}/docker.sock"
    log = top / "dockerd.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            ["dockerd", "--data-root", str(top / "root"), "--exec-root", str(top / "exec"),
             "--pidfile", str(top / "pid"), "-H", host, "--storage-driver", "overlay2",
             "--iptables=false", "--ip6tables=false", "--bridge=none"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                docker.DockerClient(base_url=host, timeout=5).ping()
                break
            except Exception:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"dockerd did not start (exit {proc.poll()}): "
                                       f"{log.read_text(errors='replace')[-1500:]}") from None
                time.sleep(0.5)
        yield host
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        _unmount_under(top)
        shutil.rmtree(top, ignore_errors=True)


def _unmount_under(top: Path) -> None:
    """Unmount what the daemon left mounted below ``top`` (its netns file under the exec
    root stays mounted after a clean stop), deepest first."""
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for path in sorted((m for m in mounts if m.startswith(f"{top}/")), key=len, reverse=True):
        subprocess.run(["umount", "-l", path], capture_output=True, check=False)
