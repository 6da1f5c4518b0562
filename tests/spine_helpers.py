"""Shared test helpers: a throwaway copy of the repo, a CLI runner, process checks."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# What a frank repo is made of, as far as the spine is concerned.
REPO_DIRS = ("parts", "stacks", "images", "plugins", "kernels", "builders")


def copy_repo(dest: Path) -> Path:
    """Copy the repo's parts, stacks, images and sources into ``dest``."""
    for name in REPO_DIRS:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, dest / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "build",
                                                          "*.egg-info", "*.so", "*.o",
                                                          ".frank.lock"))
    return dest


@dataclass
class Result:
    """What a frank process did."""

    code: int
    out: str
    err: str


def frank(*args: str, cwd: Path) -> Result:
    """Run the real `frank` CLI in a fresh process (as a user would)."""
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.run([sys.executable, "-m", "frank", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)
    return Result(proc.returncode, proc.stdout, proc.stderr)


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under root with its bytes: to prove a failed command wrote nothing. The
    repo lock (``stacks/.frank.lock``, empty, held with fcntl by every writing command, even
    one that then refuses) is no content and is left out."""
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != ".frank.lock"}


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line mentions ``text`` (a path or marker only the
    calling test uses): proof that everything a test started has stopped."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                argv = (p / "cmdline").read_bytes().replace(b"\0", b" ")
                if text in argv.decode(errors="replace"):
                    out.append(int(p.name))
            except OSError:
                continue
    return out


def audit_recorded(layout: Path, stack: str = "demo") -> None:
    """Record a passed audit for a hand-made stand-in image (no frank lock, or no layers),
    which `frank push` refuses unaudited: for tests about the registry or the push record,
    not the audit (that is tests/test_audit.py's)."""
    import json

    from frank.audit.report import AuditReport, Cost, save_record

    digest = json.loads((layout / "index.json").read_text())["manifests"][0]["digest"]
    save_record(AuditReport(layout=str(layout), digest=digest, stack=stack,
                            lock_digest="sha256:" + "0" * 64, target="sm_120", ok=True,
                            cost=Cost(seconds=0, cpu_seconds=0, layers=0, bytes=0, files=0)),
                layout.parent)
