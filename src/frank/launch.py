"""The one launcher: `frank serve` on the host and the image's entrypoint.

Standard library only (huggingface-hub is imported only when weights must be fetched), so
the same file runs inside any engine image. From a lock it builds the engine command line
and environment, fetches or verifies the weights at their pinned revision, then runs the
engine, forwards SIGINT/SIGTERM, and reports ready when the health endpoint answers.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

_HEX40 = re.compile(r"[0-9a-f]{40}")


class LaunchError(Exception):
    """A one-line reason the engine was not started."""


def flag_args(flags: dict[str, Any]) -> list[str]:
    """``{"tensor-parallel-size": 2, "enforce-eager": True}`` -> CLI arguments."""
    out: list[str] = []
    for key, value in sorted(flags.items()):
        if value is True:
            out.append(f"--{key}")
        elif value is False:
            out.append(f"--no-{key}")
        else:
            out.extend([f"--{key}", str(value)])
    return out


def weights_part(lock: dict[str, Any]) -> dict[str, Any] | None:
    """The lock's weights part spec, if any."""
    return next((p["spec"] for p in lock["parts"] if p["kind"] == "weights"), None)


def engine_env(lock: dict[str, Any], base: dict[str, str]) -> dict[str, str]:
    """The engine's environment: the lock's env and exactly the stack's plugins."""
    env = dict(base)
    env.update(lock["env"])
    env["VLLM_PLUGINS"] = ",".join(lock["plugins"])
    return env


def engine_command(lock: dict[str, Any], model: str) -> list[str]:
    """``[*command, model, *flags]``; the command comes from the stack (default vllm serve)."""
    return [*lock.get("command", ["vllm", "serve"]), model, *flag_args(lock["flags"])]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch_weights(spec: dict[str, Any], cache_dir: str | None) -> Path:
    """Download (or find offline) the pinned revision and check every locked sha256."""
    revision = spec.get("revision") or ""
    if not _HEX40.fullmatch(revision):
        raise LaunchError(f"weights {spec['name']}: revision {revision!r} is not a 40-hex hash")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise LaunchError("huggingface-hub is not installed (pip install huggingface-hub)") \
            from None
    args = {"repo_id": spec["repo_id"], "revision": revision,
            "allow_patterns": spec["allow_patterns"], "cache_dir": cache_dir}
    try:  # offline first: files already in the cache are used as they are
        folder = Path(snapshot_download(**args, local_files_only=True))
    except Exception:
        if os.environ.get("HF_HUB_OFFLINE") == "1":
            raise LaunchError(f"weights {spec['repo_id']}@{revision} are not in the hub "
                              "cache and HF_HUB_OFFLINE=1") from None
        try:
            folder = Path(snapshot_download(**args))
        except Exception as exc:  # hub errors have many types; the message is what matters
            text = str(exc).strip()
            first = text.splitlines()[0] if text else type(exc).__name__
            raise LaunchError(f"weights {spec['repo_id']}@{revision}: {first}") from None
    for name, expected in sorted(spec.get("files", {}).items()):
        path = folder / name
        if not path.is_file():
            raise LaunchError(f"weights {spec['repo_id']}@{revision}: {name} is missing")
        actual = _sha256(path)
        if actual != expected:
            raise LaunchError(f"weights {spec['repo_id']}@{revision}: {name} sha256 is "
                              f"{actual}, lock says {expected}")
    return folder


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """Poll the health endpoint until it answers 200, the engine exits, or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    return False


def run(lock: dict[str, Any], *, print_only: bool, cache_dir: str | None, ready_timeout: float,
        model_override: str | None = None) -> int:
    """Print or run the engine for a lock; returns the exit code."""
    spec = weights_part(lock)
    env = engine_env(lock, dict(os.environ))
    if model_override is not None:
        model = model_override
    elif spec is None:
        model = lock["model"]["name"]
    elif print_only:
        model = f"{spec['repo_id']}@{spec['revision']}"
    else:
        model = str(fetch_weights(spec, cache_dir))
    cmd = engine_command(lock, model)
    if print_only:
        shown = {k: env[k] for k in sorted({*lock["env"], "VLLM_PLUGINS"})}
        print(json.dumps({"command": cmd, "env": shown, "lock_digest": lock["digest"]},
                         indent=2, sort_keys=True))
        return 0
    proc = subprocess.Popen(cmd, env=env)

    def forward(signum: int, _frame: object) -> None:
        proc.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    host = str(lock["flags"].get("host", "127.0.0.1"))
    port = int(lock["flags"].get("port", 8000))
    if wait_ready(f"http://{host}:{port}/health", proc, ready_timeout):
        print(f"frank: ready: {lock['stack']} ({lock['digest']}) on http://{host}:{port}",
              file=sys.stderr, flush=True)
    return proc.wait()


def main(argv: list[str] | None = None) -> int:
    """Entry point of the image (``frank-launch --lock FILE [--print]``)."""
    parser = argparse.ArgumentParser(prog="frank-launch")
    parser.add_argument("--lock", default=os.environ.get("FRANK_LOCK", "/etc/frank/frank.lock"))
    parser.add_argument("--print", action="store_true", dest="print_only")
    parser.add_argument("--cache-dir", default=os.environ.get("HF_HUB_CACHE"))
    parser.add_argument("--ready-timeout", type=float, default=600.0)
    args = parser.parse_args(argv)
    try:
        lock = json.loads(Path(args.lock).read_text(encoding="utf-8"))
        return run(lock, print_only=args.print_only, cache_dir=args.cache_dir,
                   ready_timeout=args.ready_timeout)
    except (LaunchError, OSError, json.JSONDecodeError) as exc:
        print(f"frank-launch: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
