#!/usr/bin/env python3
"""The README's first command as a newcomer meets it: `scripts/setup && scripts/demo` in a
fresh clone with empty caches (frank's store, uv's cache, the demo's hub cache), then
`scripts/demo` again (warm). Prints the times and writes them, with the machine, its load,
the commit and the served-cpu image digest, to --results.

Usage: .venv/bin/python bench/newcomer_bench.py --scratch DIR [--results FILE] [--keep]
The clone and every cache live under DIR (removed at the end unless --keep); nothing of this
checkout's own caches is used. Needs what scripts/setup needs (Debian tools, network to PyPI).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def timed(cmd: str, cwd: Path, env: dict[str, str], log: Path) -> float:
    """Wall seconds of one shell command, its output to ``log``; a failure stops the bench."""
    start = time.perf_counter()
    with log.open("w") as out:
        done = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, stdout=out,
                              stderr=subprocess.STDOUT, check=False)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{cmd!r} exited {done.returncode} after {seconds:.1f} s; see {log}")
    return seconds


def image_digest(clone: Path) -> str:
    index = json.loads((clone / "out/served-cpu/image/index.json").read_text())
    return str(index["manifests"][0]["digest"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scratch", type=Path, required=True)
    parser.add_argument("--results", type=Path, default=None)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    scratch = args.scratch.resolve()
    if scratch.exists():
        raise SystemExit(f"{scratch} exists: give a new folder")
    clone = scratch / "clone"
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.strip()
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(clone)],
                   check=True)
    subprocess.run(["git", "checkout", "--quiet", commit], cwd=clone, check=True)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FRANK_", "UV_", "VIRTUAL_ENV"))}
    env |= {"FRANK_CACHE": str(scratch / "frank-cache"), "UV_CACHE_DIR": str(scratch / "uv"),
            "FRANK_DEMO_DIR": str(scratch / "demo")}
    rows = []
    try:
        setup = timed("scripts/setup", clone, env, scratch / "setup.log")
        rows.append(("scripts/setup, empty uv cache", setup))
        demo = timed("scripts/demo", clone, env, scratch / "demo-cold.log")
        rows.append(("scripts/demo, empty frank store (cold image build, serve, reply)", demo))
        rows.append(("the first command in all: scripts/setup && scripts/demo", setup + demo))
        warm = timed("scripts/demo", clone, env, scratch / "demo-warm.log")
        rows.append(("scripts/demo again (image current, engine storage warm)", warm))
        digest = image_digest(clone)
        reply = [line for line in (scratch / "demo-warm.log").read_text().splitlines()
                 if line.startswith("demo: reply:")]
    finally:
        load = os.getloadavg()
    for label, seconds in rows:
        print(f"{label:70} {seconds:7.1f} s")
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    text = "\n".join([
        f"# The README's first command, in a fresh clone, {when}",
        "",
        f"Command: `python bench/newcomer_bench.py --scratch {args.scratch}"
        f"{f' --results {args.results}' if args.results else ''}`  ",
        f"Commit: `{commit}`  ",
        f"Machine: {platform.node()} ({platform.machine()}, {os.cpu_count()} cores), load "
        f"average at the end {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}  ",
        f"served-cpu image digest: `{digest}`  ",
        f"Reply line: `{reply[0] if reply else '(none)'}`",
        "",
        "| step | time |",
        "|---|---|",
        *[f"| {label} | {seconds:.1f} s |" for label, seconds in rows],
        "",
        "Empty caches: frank's store, uv's cache and the demo's hub cache are new folders under "
        "the scratch folder; downloads come from PyPI through this machine's proxy.",
        "",
    ])
    if args.results:
        args.results.write_text(text)
        print(f"wrote {args.results}")
    if not args.keep:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
