#!/usr/bin/env python3
"""frank's embedded builder against the usual way: buildah with ``RUN pip install``.

Side by side in one run, each from an empty cache:

  frank    ``frank compose STACK --locked`` (every wheel of the locked closure downloaded on the
           host, verified, installed into layer trees by frank, no command in the image)
  buildah  a Dockerfile on the same base that COPYs the same requirements (each wheel by URL
           and sha256, from the same pylock, ``--require-hashes``) and runs ``pip install``
           inside the image under ``buildah bud --isolation chroot``, the host's CA and index
           passed as build secrets (as frank's own impure steps get them)

each ``--runs`` times (default 2), so that the digests say which build is reproducible. The
buildah image holds the closure only (the stack's small host-built layers, i.e. the patch,
plugin, data, kernel and lock, are left out); it is timed without them, so the ratio favours
buildah slightly. Disk: about 4x the installed closure while a buildah build runs.

Usage: .venv/bin/python bench/buildah_pip_bench.py [--stack stacks/served-cpu.toml]
       [--runs 2] [--results bench/results/buildah-pip-DATE.md]
"""

from __future__ import annotations

import argparse
import ensurepip
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import unquote, urlparse

ROOT = Path(__file__).resolve().parent.parent

DOCKERFILE = """\
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
COPY pip.whl requirements.txt /tmp/bench/
COPY wheels/ /tmp/bench/wheels/
RUN --mount=type=secret,id=frank-ca,target=/etc/ssl/certs/ca-certificates.crt \\
    --mount=type=secret,id=frank-pip,target=/etc/pip.conf \\
    python3 /tmp/bench/pip.whl/pip install --no-deps --require-hashes --only-binary :all: \\
      --break-system-packages --disable-pip-version-check --no-cache-dir \\
      -r /tmp/bench/requirements.txt
"""


def pip_wheel() -> Path:
    """The pip wheel CPython bundles (ensurepip): pip runs from it, the base has no pip."""
    bundled = Path(ensurepip.__file__).parent / "_bundled"
    return next(bundled.glob("pip-*.whl"))


def context_for(stack: Path, ctx: Path) -> int:
    """Write the Dockerfile context for stack's locked closure; return the wheel count."""
    from frank.resolve import closure
    from frank.resolve.resolver import resolve

    resolved = resolve(stack, ROOT)
    request = closure.request_for(resolved)
    assert request is not None, "the stack has no Python closure"
    wheels = closure.load(closure.pylock_path(stack), request)
    (ctx / "wheels").mkdir(parents=True)
    lines = []
    for w in wheels:
        if w.url.startswith("file:"):  # a local wheel (torch's CPU build): into the context
            src = Path(unquote(urlparse(w.url).path))
            shutil.copy2(src, ctx / "wheels" / src.name)
            url = f"file:///tmp/bench/wheels/{src.name}"
        else:
            url = w.url
        lines.append(f"{w.name} @ {url} --hash=sha256:{w.sha256}")
    (ctx / "requirements.txt").write_text("\n".join(lines) + "\n")
    shutil.copy2(pip_wheel(), ctx / "pip.whl")
    (ctx / "Dockerfile").write_text(DOCKERFILE)
    return len(wheels)


def buildah_once(stack: Path, work: Path) -> tuple[float, str, int]:
    """One buildah build from an empty engine storage: seconds, image digest, bytes."""
    from frank.assemble.base import resolve_base
    from frank.assemble.engines import build_dockerfile, get_engine
    from frank.store.blobs import BlobStore

    cache = work / "cache"
    os.environ["FRANK_CACHE"] = str(cache)
    store = BlobStore(cache)
    base = resolve_base(ROOT / "images" / "bookworm-python.toml", store, quiet=True)
    ctx = work / "context"
    context_for(stack, ctx)
    engine = get_engine("buildah", store)
    start = time.perf_counter()
    digest = build_dockerfile(engine, ctx, work / "image", base_layout=base.layout,
                              base_digest=base.digest, source_date_epoch=0, store=store,
                              log=work / "build.log")
    elapsed = time.perf_counter() - start
    size = sum(p.stat().st_size for p in (work / "image" / "blobs" / "sha256").iterdir())
    return elapsed, digest, size


def frank_once(stack: Path, work: Path) -> tuple[float, str, int]:
    """``frank compose --locked`` from an empty cache: seconds, image digest, bytes."""
    env = {k: v for k, v in os.environ.items() if k != "SOURCE_DATE_EPOCH"}
    env["FRANK_CACHE"] = str(work / "cache")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "frank", "compose", str(stack), "--locked",
                           "--json", "--out", str(work / "out")], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"frank compose: {proc.stderr.strip()[-2000:]}")
    image = json.loads(proc.stdout)["image"]
    layout = Path(image["layout"])
    size = sum(p.stat().st_size for p in (layout / "blobs" / "sha256").iterdir())
    return elapsed, str(image["digest"]), size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stack", type=Path, default=ROOT / "stacks" / "served-cpu.toml")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--results", type=Path, default=None)
    opts = parser.parse_args()
    stack = opts.stack.resolve()
    runs: dict[str, list[tuple[float, str, int]]] = {"frank": [], "buildah": []}
    for i in range(opts.runs):
        for name, once in (("frank", frank_once), ("buildah", buildah_once)):
            with tempfile.TemporaryDirectory(prefix=f"frank-{name}-bench-", dir="/var/tmp") as d:
                try:
                    runs[name].append(once(stack, Path(d)))
                finally:
                    subprocess.run(["buildah", "--root", str(Path(d) / "cache" / "containers"),
                                    "rm", "--all"], capture_output=True, check=False)
            t, digest, size = runs[name][-1]
            print(f"{name} run {i + 1}: {t:.0f} s, {size / 1e9:.2f} GB, {digest}", flush=True)
    rows = []
    for name in ("frank", "buildah"):
        times = [t for t, _, _ in runs[name]]
        digests = {d for _, d, _ in runs[name]}
        rows.append((name, " / ".join(f"{t:.0f} s" for t in times),
                     f"{runs[name][0][2] / 1e9:.2f} GB",
                     "same digest every run" if len(digests) == 1 else
                     f"{len(digests)} digests in {len(times)} runs",
                     ", ".join(sorted(d[:19] + "…" for d in digests))))
    ratio = min(t for t, _, _ in runs["buildah"]) / min(t for t, _, _ in runs["frank"])
    machine = (f"{platform.node()} ({platform.machine()}, {os.cpu_count()} cores, "
               f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB)")
    text = "\n".join([
        f"# frank's embedded builder vs buildah RUN pip install, "
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC", "",
        f"Command: `{' '.join([Path(sys.executable).name, *sys.argv])}`  ",
        f"Machine: {machine}  ", f"Stack: {stack.relative_to(ROOT)} (its locked closure, "
        "every run from an empty cache)", "",
        "| builder | time per run | image | reproducible | digests |", "|---|---|---|---|---|",
        *[f"| {' | '.join(r)} |" for r in rows], "",
        f"buildah / frank (fastest run of each): {ratio:.1f}x", ""])
    print(text)
    if opts.results:
        opts.results.write_text(text)


if __name__ == "__main__":
    main()
