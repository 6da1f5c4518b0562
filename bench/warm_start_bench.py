"""`frank run` to ready, three ways: cold, warm on the same machine, first start elsewhere.

Usage (from the repo root, after `frank compose STACK`; HUB: a hub cache holding the weights):

    nice -n 10 .venv/bin/python bench/warm_start_bench.py stacks/served-cpu-compiled.toml \\
        --hub-cache HUB --trials 3 --out bench/results/warm-start-DATE.json

Machine A and machine B are two FRANK_CACHE folders (each with its own engine storage). On A
the image is imported into the engine's storage once (timed, its own line), `frank warm`
makes the warm cache, and `frank push --compression none` sends image and cache to a
docker-registry on 127.0.0.1 (the cache as a referrer). Each trial then times, in turn:

- cold: A, `frank run --no-warm-cache` (every engine cache starts empty);
- warm: A, `frank run` (the warm cache from A's store, overlay or copy as the line says);
- second: B, `frank run` with B's warm index, warm blobs and run cache emptied first, so the
  cache is pulled from the registry and unpacked inside the timed start. B's engine storage
  keeps the image it imported before the first trial: that import (timed, its own line) is
  paid by a new machine with or without a cache and is left out of the comparison.

Goals (issue 55): second within 1.2x of warm; second saves at least 80% of the cold start's
compile time, where compile time is cold - warm (what a warm start does not do) and the
saving is cold - second. Medians, the image and artifact digests and the machine are in the
JSON written to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
FRANK = [sys.executable, "-m", "frank"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def env_for(cache: Path) -> dict[str, str]:
    return {**os.environ, "FRANK_CACHE": str(cache), "FRANK_PROGRESS_AFTER": "3600"}


def timed(cmd: list[str], cache: Path, log: Path) -> float:
    start = time.monotonic()
    with log.open("ab") as out:
        proc = subprocess.run(cmd, cwd=REPO, env=env_for(cache), stdout=out, stderr=out,
                              check=False)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd[2:])} exited {proc.returncode}; see {log}")
    return time.monotonic() - start


def to_ready(args: list[str], cache: Path, log: Path, limit: float) -> tuple[float, str]:
    """Seconds from starting `frank run` to its ready line, and that line; then stopped."""
    start = time.monotonic()
    with log.open("ab") as out:
        out.write(f"\n=== frank run {' '.join(args)} (FRANK_CACHE={cache})\n".encode())
        out.flush()
        proc = subprocess.Popen([*FRANK, "run", *args], cwd=REPO, env=env_for(cache),
                                stdout=out, stderr=subprocess.PIPE)
        assert proc.stderr is not None
        line = ""
        for raw in iter(proc.stderr.readline, b""):
            out.write(raw)
            text = raw.decode(errors="replace")
            if text.startswith("frank: ready:"):
                line = text.strip()
                break
            if time.monotonic() - start > limit:
                break
        seconds = time.monotonic() - start
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=120)
        out.write(rest or b"")
    if not line:
        sys.exit(f"frank run {' '.join(args)} never said ready; see {log}")
    return seconds, line


def start_registry(work: Path, port: int | None = None) -> tuple[subprocess.Popen[bytes], str]:
    port = port or free_port()
    work.mkdir(parents=True, exist_ok=True)
    (work / "config.yml").write_text(
        "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n"
        f"    rootdirectory: {work / 'data'}\nhttp:\n  addr: 127.0.0.1:{port}\n")
    proc = subprocess.Popen(["docker-registry", "serve", str(work / "config.yml")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "OTEL_TRACES_EXPORTER": "none"})
    for _ in range(100):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1).close()
            return proc, f"127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    proc.kill()
    sys.exit("docker-registry did not start")


def reset_second(cache: Path) -> None:
    """Machine B before a trial: no warm index, no warm blobs, no run cache."""
    warm = cache / "warm"
    for entry in warm.rglob("*") if warm.is_dir() else []:
        if entry.is_file():
            digest = entry.read_text().strip().split(":")[-1]
            blob = cache / "blobs" / "sha256" / digest
            if blob.is_file():
                doc = json.loads(blob.read_bytes())
                for layer in doc.get("layers", []):
                    (cache / "blobs" / "sha256" / layer["digest"].split(":")[1]).unlink(
                        missing_ok=True)
                blob.unlink()
    shutil.rmtree(warm, ignore_errors=True)
    shutil.rmtree(cache / "run-cache", ignore_errors=True)


def machine() -> dict[str, Any]:
    model = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    return {"host": platform.node(), "cpu": model, "cores": os.cpu_count(),
            "kernel": platform.release(),
            "load_1m": round(os.getloadavg()[0], 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("stack")
    ap.add_argument("--hub-cache", required=True)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--work", type=Path, default=Path("/tmp/frank-warm-bench"))
    ap.add_argument("--wait-ready", type=float, default=1200)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--arms", default="cold,warm,second",
                    help="The arms, in the order each trial runs them.")
    ap.add_argument("--reuse", action="store_true",
                    help="Keep --work's machines, warm cache and registry from an earlier run "
                         "of this script: run only the trials.")
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    A, B, log = a.work / "machine-a", a.work / "machine-b", a.work / "bench.log"
    if not a.reuse:
        shutil.rmtree(B, ignore_errors=True)
    run_args = [a.stack, "--hub-cache", a.hub_cache, "--wait-ready", str(a.wait_ready)]
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                              "command": " ".join(sys.argv), "machine": machine()}
    print(f"machine: {result['machine']}", flush=True)
    if a.reuse:
        made = json.loads((a.work / "warm.json").read_text())
        port = int(json.loads((a.work / "registry.json").read_text())["port"])
        registry, where = start_registry(a.work / "registry", port)
        result["warm"] = made
    else:
        result["import_a_s"] = timed([*FRANK, "run", *run_args, "--", "--print"], A, log)
        print(f"import into A's engine storage: {result['import_a_s']:.1f} s (left out)",
              flush=True)
        made = json.loads(subprocess.run(
            [*FRANK, "warm", a.stack, "--hub-cache", a.hub_cache, "--json"], cwd=REPO,
            env=env_for(A), capture_output=True, check=True).stdout)
        (a.work / "warm.json").write_text(json.dumps(made))
        result["warm"] = made
        print(f"frank warm: {made['artifact']} ({made['layer_size']:,} bytes, ready "
              f"{made['ready_s']:.1f} s, packed {made['pack_s']:.1f} s) on {made['made_on']}",
              flush=True)
        registry, where = start_registry(a.work / "registry")
        (a.work / "registry.json").write_text(json.dumps({"port": where.split(":")[1]}))
    try:
        if not a.reuse:
            repo = f"{where}/bench/{Path(a.stack).stem}"
            result["push_s"] = timed([*FRANK, "push", Path(a.stack).stem, "--to", repo,
                                      "--compression", "none"], A, log)
            print(f"pushed image and warm cache to {repo} ({result['push_s']:.1f} s)",
                  flush=True)
            result["import_b_s"] = timed([*FRANK, "run", *run_args, "--", "--print"], B, log)
            print(f"import into B's engine storage: {result['import_b_s']:.1f} s (left out)",
                  flush=True)
        arms: dict[str, list[float]] = {k: [] for k in a.arms.split(",")}
        lines: dict[str, list[str]] = {k: [] for k in arms}
        for t in range(a.trials):
            for arm in arms:
                if arm == "second":
                    reset_second(B)
                cache = B if arm == "second" else A
                extra = ["--no-warm-cache"] if arm == "cold" else []
                seconds, line = to_ready([*run_args, *extra], cache, log, a.wait_ready)
                arms[arm].append(seconds)
                lines[arm].append(line)
                print(f"trial {t + 1} {arm:6s} {seconds:7.1f} s  {line.split('; ', 1)[-1]}",
                      flush=True)
    finally:
        registry.terminate()
        registry.wait()
    if a.out:  # the trials as they are, before the summary needs all three arms
        a.out.write_text(json.dumps({**result, "trials": arms, "ready_lines": lines}, indent=2))
    med = {k: statistics.median(v) for k, v in arms.items()}
    compile_s = med["cold"] - med["warm"]
    saved = (med["cold"] - med["second"]) / compile_s if compile_s > 0 else float("nan")
    result.update({"trials": arms, "ready_lines": lines, "medians_s": med,
                   "second_over_warm": med["second"] / med["warm"],
                   "compile_s": compile_s, "second_saves_of_compile": saved,
                   "image": made["image"], "artifact": made["artifact"]})
    print(f"\n{'arm':8s} {'median s':>9s}  trials")
    for k, v in arms.items():
        print(f"{k:8s} {med[k]:9.1f}  {', '.join(f'{x:.1f}' for x in v)}")
    print(f"second / warm = {result['second_over_warm']:.2f} (goal <= 1.2); compile time "
          f"(cold - warm) {compile_s:.1f} s, the second machine saves {saved:.0%} of it "
          "(goal >= 80%)")
    print(f"image {made['image']}\nartifact {made['artifact']}")
    if a.out:
        a.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
