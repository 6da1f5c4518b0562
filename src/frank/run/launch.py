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
import logging
import os
import re
import shutil
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


def is_true(value: str | None) -> bool:
    """huggingface-hub's reading of a boolean variable (``HF_HUB_OFFLINE=1``, ``yes``...)."""
    return (value or "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def hub_cache(env: dict[str, str], cache_dir: str | None) -> Path:
    """The hub cache the weights are read from, chosen as huggingface-hub chooses it, but
    from the engine's environment (the stack's env over the caller's), not the caller's."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(key):
            return Path(env[key]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    base = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base.expanduser() / "huggingface" / "hub"


def weights_source(spec: dict[str, Any]) -> str:
    """``owner/name@revision`` for hub weights, the directory for local ones."""
    return str(spec["path"]) if spec.get("path") else \
        f"{spec['repo_id']}@{spec.get('revision') or ''}"


def weights_folder(spec: dict[str, Any], env: dict[str, str], cache_dir: str | None) -> Path:
    """The folder the engine gets as its model: the local directory, or the hub cache's
    snapshot of the pinned revision (``models--OWNER--NAME/snapshots/REVISION``), which is
    where huggingface-hub puts a commit-hash revision. Nothing is fetched or read."""
    if spec.get("path"):
        return Path(spec["path"])
    repo = "models--" + str(spec["repo_id"]).replace("/", "--")
    return hub_cache(env, cache_dir) / repo / "snapshots" / str(spec.get("revision") or "")


def verify_folder(spec: dict[str, Any], folder: Path) -> None:
    """Every locked file present with its sha256; a local directory must hold nothing else
    (for it the hashes are the only pin: an unlisted file could change what is served)."""
    what = f"weights {weights_source(spec)}"
    files: dict[str, str] = spec.get("files", {})
    if spec.get("path"):
        if not folder.is_dir():
            raise LaunchError(f"{what}: the directory does not exist")
        for extra in sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                            if not p.is_dir()):
            if extra not in files:
                raise LaunchError(f"{what}: {extra} is not pinned in the part's files "
                                  "(add its sha256 or move it out)")
    for name, expected in sorted(files.items()):
        path = folder / name
        if not path.is_file():
            raise LaunchError(f"{what}: {name} is missing")
        actual = _sha256(path)
        if actual != expected:
            raise LaunchError(f"{what}: {name} sha256 is {actual}, lock says {expected}")


def _cached(spec: dict[str, Any], folder: Path) -> bool:
    files = spec.get("files", {})
    return bool(files) and all((folder / name).is_file() for name in files)


def fetch_weights(spec: dict[str, Any], cache_dir: str | None,
                  env: dict[str, str] | None = None) -> Path:
    """The pinned weights' folder, every locked sha256 checked.

    ``env`` is the engine's environment (the stack's env over the caller's): its
    ``HF_HUB_OFFLINE``, ``HF_HUB_CACHE``/``HF_HOME`` and other hub settings decide the fetch,
    so a stack that says offline never waits on the hub. Files already in the cache are
    used as they are; only a hub stack that is not offline downloads.
    """
    env = dict(os.environ) if env is None else env
    if spec.get("path"):
        folder = weights_folder(spec, env, cache_dir)
        verify_folder(spec, folder)
        return folder
    revision = spec.get("revision") or ""
    if not _HEX40.fullmatch(revision):
        raise LaunchError(f"weights {spec['name']}: revision {revision!r} is not a 40-hex hash")
    folder = weights_folder(spec, env, cache_dir)
    if not _cached(spec, folder):
        folder = _snapshot(spec, env, hub_cache(env, cache_dir))
    verify_folder(spec, folder)
    return folder


def _snapshot(spec: dict[str, Any], env: dict[str, str], cache: Path) -> Path:
    """huggingface-hub's snapshot_download, offline first, under the engine's hub settings."""
    what = f"weights {weights_source(spec)}"
    offline = is_true(env.get("HF_HUB_OFFLINE"))
    hub_env = {k: v for k, v in env.items() if k.startswith(("HF_", "HUGGINGFACE_"))}
    saved = {k: os.environ.get(k) for k in hub_env}
    os.environ.update(hub_env)  # huggingface-hub reads its settings when imported
    try:
        try:
            from huggingface_hub import snapshot_download
        except ImportError:
            if offline:
                raise LaunchError(f"{what} are not in the hub cache and HF_HUB_OFFLINE=1 "
                                  f"(cache: {cache})") from None
            raise LaunchError("huggingface-hub is not installed (pip install "
                              "huggingface-hub)") from None
        # one line on failure, not the hub's retry warnings
        logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
        args = {"repo_id": spec["repo_id"], "revision": spec["revision"],
                "allow_patterns": spec["allow_patterns"], "cache_dir": str(cache)}
        try:  # offline first: files already in the cache are used as they are
            return Path(snapshot_download(**args, local_files_only=True))
        except Exception:
            if offline:
                raise LaunchError(f"{what} are not in the hub cache and HF_HUB_OFFLINE=1 "
                                  f"(cache: {cache})") from None
        try:
            return Path(snapshot_download(**args))
        except Exception as exc:  # hub errors have many types; the message is what matters
            text = str(exc).strip()
            first = text.splitlines()[0] if text else type(exc).__name__
            raise LaunchError(f"{what}: {first}") from None
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class EngineMissing(LaunchError):
    """The engine command or its Python module is not there: nothing can start."""


_PYTHON = re.compile(r"python[0-9.]*")


def check_engine(cmd: list[str], env: dict[str, str]) -> None:
    """Fail in one line, before any weights are fetched, when the engine cannot start:
    the command is not on the engine's PATH, or (``python -m MODULE``) that Python cannot
    find the module's top-level package (found without importing it: cheap)."""
    exe = shutil.which(cmd[0], path=env.get("PATH", os.defpath))
    if exe is None:
        raise EngineMissing(f"engine command {cmd[0]!r} is not on PATH: install the engine, "
                            "or put the environment that has it first on PATH")
    if len(cmd) >= 3 and cmd[1] == "-m" and _PYTHON.fullmatch(Path(cmd[0]).name):
        module = cmd[2].split(".")[0]
        probe = subprocess.run(
            [exe, "-c", "import importlib.util, sys; "
             "sys.exit(importlib.util.find_spec(sys.argv[1]) is None)", module],
            env=env, capture_output=True, check=False)
        if probe.returncode != 0:
            raise EngineMissing(f"the engine's {cmd[0]} ({exe}) has no module {module!r}: "
                                f"install {module} there, or put the environment that has it "
                                "first on PATH")


_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def smoke_checks(lock: dict[str, Any]) -> list[tuple[str, str]]:
    """(part, module) for every import check the lock's parts declare, in lock order."""
    out = []
    for part in lock["parts"]:
        for module in ((part["spec"].get("check") or {}).get("imports") or []):
            if not isinstance(module, str) or not _MODULE.fullmatch(module):
                raise LaunchError(f"check of {part['name']}: {module!r} is not a module name")
            out.append((str(part["name"]), module))
    return out


def run_checks(lock: dict[str, Any], env: dict[str, str]) -> int:
    """Import each declared module in the engine's Python, one process per module, so a
    failure names its part and module; returns how many passed (raises on the first
    failure, before any weights are fetched)."""
    checks = smoke_checks(lock)
    if not checks:
        return 0
    python = shutil.which("python3", path=env.get("PATH", os.defpath))
    if python is None:
        raise LaunchError("the parts declare import checks and python3 is not on PATH")
    for part, module in checks:
        proc = subprocess.run([python, "-c", f"import {module}"], env=env, capture_output=True,
                              text=True, check=False)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise LaunchError(f"check of {part}: import {module} failed: {last}")
    print(f"frank: checks passed: {len(checks)} imports "
          f"({', '.join(m for _, m in checks)})", file=sys.stderr, flush=True)
    return len(checks)


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
    """Print or run the engine for a lock; returns the exit code.

    The engine is checked before the weights are fetched (a missing engine must not cost a
    download); ``--print`` shows the folder the engine would really get, fetching nothing.
    """
    spec = weights_part(lock)
    env = engine_env(lock, dict(os.environ))
    if not print_only:
        check_engine(engine_command(lock, "MODEL"), env)
        run_checks(lock, env)
    if model_override is not None or spec is None:
        model = model_override or lock["model"]["name"]
    elif print_only:
        model = str(weights_folder(spec, env, cache_dir))
    else:
        model = str(fetch_weights(spec, cache_dir, env))
        # said before the engine starts, so a log shows the order (and tests check it)
        print(f"frank: weights verified: {spec['name']}: {len(spec.get('files') or {})} files "
              f"match the lock's sha256 in {model}", file=sys.stderr, flush=True)
    cmd = engine_command(lock, model)
    if print_only:
        shown = {k: env[k] for k in sorted({*lock["env"], "VLLM_PLUGINS"})}
        out: dict[str, Any] = {"command": cmd, "env": shown, "lock_digest": lock["digest"]}
        if spec is not None and model_override is None:
            out["weights"] = {"part": spec["name"], "source": weights_source(spec),
                              "folder": model, "present": _cached(spec, Path(model))}
        print(json.dumps(out, indent=2, sort_keys=True))
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
    return exit_status(proc.wait())


def exit_status(code: int) -> int:
    """The launcher's exit status for the engine's: its own when it exited (0 when it
    stopped cleanly on SIGTERM, as vLLM does), 128 + N when signal N killed it (an engine
    that does not handle SIGTERM: 143), as a shell, Docker and Kubernetes report it. Popen
    says -N; passed to sys.exit as it is, -15 would be 241, which reads as a failure."""
    return 128 - code if code < 0 else code


def fetch_only(lock: dict[str, Any], cache_dir: str | None) -> int:
    """Fetch or find the lock's weights at their pinned revision and check every sha256;
    the engine is not started (nor looked for)."""
    spec = weights_part(lock)
    if spec is None:
        print("frank: no weights part in the lock: nothing to fetch", file=sys.stderr)
        return 0
    env = engine_env(lock, dict(os.environ))
    # Fetching is this step's job: the caller's HF_HUB_OFFLINE decides, not the stack's
    # (which is for the engine); unset, the hub is asked for what the cache lacks.
    env["HF_HUB_OFFLINE"] = os.environ.get("HF_HUB_OFFLINE", "0")
    folder = fetch_weights(spec, cache_dir, env)
    print(f"frank: weights verified: {spec['name']}: {len(spec.get('files') or {})} files "
          f"match the lock's sha256 in {folder}", file=sys.stderr, flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the image (``frank-launch --lock FILE [--print]``)."""
    parser = argparse.ArgumentParser(prog="frank-launch")
    parser.add_argument("--lock", default=os.environ.get("FRANK_LOCK", "/etc/frank/frank.lock"))
    parser.add_argument("--print", action="store_true", dest="print_only")
    parser.add_argument("--cache-dir", default=None,
                        help="hub cache (default: HF_HUB_CACHE or HF_HOME of the stack's env "
                             "over this environment)")
    parser.add_argument("--ready-timeout", type=float, default=600.0)
    parser.add_argument("--check", action="store_true",
                        help="run the parts' import checks and exit (0 when all pass)")
    parser.add_argument("--fetch-only", action="store_true",
                        help="fetch (or find) the pinned weights, check every sha256, exit: "
                             "a Kubernetes init step filling the hub cache volume")
    args = parser.parse_args(argv)
    try:
        lock = json.loads(Path(args.lock).read_text(encoding="utf-8"))
        if args.check:
            run_checks(lock, engine_env(lock, dict(os.environ)))
            return 0
        if args.fetch_only:
            return fetch_only(lock, args.cache_dir)
        return run(lock, print_only=args.print_only, cache_dir=args.cache_dir,
                   ready_timeout=args.ready_timeout)
    except (LaunchError, OSError, json.JSONDecodeError) as exc:
        print(f"frank-launch: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
