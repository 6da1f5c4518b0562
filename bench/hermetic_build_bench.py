#!/usr/bin/env python3
"""The served stack built hermetically by the embedded builder, as a user runs it.

Measures, side by side in one run on a scratch copy of the repo (whole `frank` processes):

  cold      empty cache: every wheel downloaded, every layer assembled and tarred
  no-op     recompose of the built stack (goal < 1 s, median of --noop runs)
  one-part  the region-cache plugin's source changed (goal: one layer + the lock, < 5 s)
  bump      vLLM 0.24.0 -> 0.25.0, which keeps torch 2.11.0 (goal: >= 80% of bytes reused)
  warm-dl   the first cache with its layer blobs and index deleted (wheels kept), on a
            pristine copy: must give the cold digest again
  cold-2    a second empty cache (the first one's downloads as its mirror, so this box's
            disk holds one copy of the wheels), SOURCE_DATE_EPOCH unset: the same digest
  buildah   quoted from ../shared/BUILD-FACTS.md: the same context through `buildah bud`
            with RUN pip install took 495 s; bench/buildah_pip_bench.py measures buildah
            side by side with frank on served-cpu's closure (served's needs more disk)

and the image size against the official vllm/vllm-openai image of the same release
(28.6 GB, vLLM PR #22377). The mhc-overlap patch URL is not reachable from this network,
so the scratch copy takes that one part back (`frank revert mhc-overlap`) unless --mirror
names a folder holding it.

Usage: .venv/bin/python bench/hermetic_build_bench.py [--mirror DIR]
       [--noop 5] [--results bench/results/hermetic-build-DATE.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from tests.spine_helpers import copy_repo  # noqa: E402

OFFICIAL_GB = 28.6  # vllm/vllm-openai, vLLM PR #22377
NO_MHC = " with mhc-overlap reverted (`frank revert mhc-overlap`: its URL is unreachable here)"


def frank(repo: Path, cache: Path, *args: str) -> tuple[float, dict]:
    env = {k: v for k, v in os.environ.items() if k != "SOURCE_DATE_EPOCH"}
    env["FRANK_CACHE"] = str(cache)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "frank", *args], cwd=repo, env=env,
                          capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"frank {' '.join(args)}: {proc.stderr.strip()[-2000:]}")
    return elapsed, json.loads(proc.stdout) if proc.stdout.startswith("{") else {}


def compose(repo: Path, cache: Path, out: Path, mirror: Path | None) -> tuple[float, dict]:
    args = ["compose", "stacks/served.toml", "--json", "--out", str(out)]
    if mirror is not None:
        args += ["--mirror", str(mirror)]
    return frank(repo, cache, *args)


def without_mhc(repo: Path) -> None:
    """Take mhc-overlap back in the scratch copy, as a user would: one `frank revert`."""
    proc = subprocess.run([sys.executable, "-m", "frank", "revert", "mhc-overlap", "--stack",
                           "stacks/served.toml"], cwd=repo, capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        raise SystemExit(f"frank revert mhc-overlap: {proc.stderr.strip()}")


def image_layers(layout: Path) -> list[dict]:
    index = json.loads((layout / "index.json").read_text())
    blobs = layout / "blobs" / "sha256"
    manifest = json.loads((blobs / index["manifests"][0]["digest"].split(":")[1]).read_text())
    return list(manifest["layers"])


def drop_layer_blobs(cache: Path) -> None:
    """Forget every built layer (index and blobs) but keep downloaded wheels."""
    for keys in (cache / "layer-keys").glob("*"):
        keys.unlink()
    for rec in (cache / "layers").glob("*"):
        try:
            doc = json.loads(rec.read_text())
            digest = doc.get("record", doc)["digest"].split(":")[1]  # {"key", "record"}
        except (ValueError, KeyError, OSError, AttributeError):
            continue
        (cache / "blobs" / "sha256" / digest).unlink(missing_ok=True)
        (cache / "stamps" / digest).unlink(missing_ok=True)
        rec.unlink()


def bump_engine(repo: Path, cache: Path) -> None:
    """Add vllm-base v0.25.0 (wheel pinned from uv's resolution) and use it in served."""
    with tempfile.TemporaryDirectory() as tmp:
        req = Path(tmp) / "r.in"
        req.write_text("vllm==0.25.0\n")
        subprocess.run([str(Path(sys.executable).with_name("uv")), "pip", "compile", str(req),
                        "--format", "pylock.toml", "-o", str(Path(tmp) / "pylock.toml"),
                        "--python-version", "3.11", "--python-platform",
                        "x86_64-manylinux_2_36", "-q", "--no-config"], check=True)
        doc = tomllib.loads((Path(tmp) / "pylock.toml").read_text())
    vllm = next(p for p in doc["packages"] if p["name"] == "vllm")
    wheel = next(w for w in vllm["wheels"] if "x86_64" in w["url"])
    old = (repo / "parts" / "vllm-base" / "v0.24.0.toml").read_text()
    new = re.sub(r'(?m)^version = .*$', 'version = "v0.25.0"', old)
    new = re.sub(r'(?m)^release = .*$', 'release = "0.25.0"', new)
    new = re.sub(r'(?m)^url = .*$', f'url = "{wheel["url"]}"', new)
    new = re.sub(r'(?m)^sha256 = .*$', f'sha256 = "{wheel["hashes"]["sha256"]}"', new)
    (repo / "parts" / "vllm-base" / "v0.25.0.toml").write_text(new)
    stack = repo / "stacks" / "served.toml"
    stack.write_text(stack.read_text().replace('vllm-base = "v0.24.0"', 'vllm-base = "v0.25.0"'))
    frank(repo, cache, "lock", "stacks/served.toml")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mirror", type=Path, default=None)
    parser.add_argument("--noop", type=int, default=5)
    parser.add_argument("--keep", type=Path, default=None, help="work here and keep it")
    parser.add_argument("--results", type=Path, default=None)
    opts = parser.parse_args()
    work = opts.keep or Path(tempfile.mkdtemp(prefix="frank-hermetic-bench-"))
    rows: list[tuple[str, str, str]] = []
    repo = copy_repo(work / "repo")
    if opts.mirror is None:
        without_mhc(repo)
    cache_a, cache_b = work / "cache-a", work / "cache-b"
    frank(repo, cache_a, "lock", "stacks/served.toml")

    t_cold, cold = compose(repo, cache_a, work / "out-a", opts.mirror)
    digest = cold["image"]["digest"]
    layers = image_layers(work / "out-a" / "image")
    size = sum(x["size"] for x in layers)
    rows.append(("cold (empty cache)", f"{t_cold:.0f} s",
                 f"{cold['image']['layers_built']} layers built; {size / 1e9:.2f} GB"))

    noop = []
    for _ in range(opts.noop):
        t, out = compose(repo, cache_a, work / "out-a", opts.mirror)
        assert out["image"]["layers_built"] == 0 and out["image"]["digest"] == digest, out
        noop.append(t)
    rows.append((f"no-op recompose (median of {opts.noop})", f"{statistics.median(noop):.2f} s",
                 f"goal < 1 s; range {min(noop):.2f}-{max(noop):.2f} s"))

    # a pristine copy for the rebuilds that must give the cold digest again
    pristine = copy_repo(work / "pristine")
    if opts.mirror is None:
        without_mhc(pristine)
    frank(pristine, cache_a, "lock", "stacks/served.toml")

    plugin = repo / "plugins" / "region_cache" / "frank_region_cache" / "__init__.py"
    plugin.write_text(plugin.read_text() + "\n# bench: a one-part change\n")
    t_one, one = compose(repo, cache_a, work / "out-a", opts.mirror)
    rows.append(("one-part change (region-cache plugin)", f"{t_one:.2f} s",
                 f"{one['image']['layers_built']} layers built (the plugin and the lock); "
                 "goal < 5 s"))

    before = {x["digest"] for x in image_layers(work / "out-a" / "image")}
    bump_engine(repo, cache_a)
    t_bump, bump = compose(repo, cache_a, work / "out-a", opts.mirror)
    after = image_layers(work / "out-a" / "image")
    reused = sum(x["size"] for x in after if x["digest"] in before)
    total = sum(x["size"] for x in after)
    rows.append(("vLLM 0.24.0 -> 0.25.0 (torch kept)", f"{t_bump:.0f} s",
                 f"{bump['image']['layers_built']} layers built; {reused / total:.1%} of "
                 f"{total / 1e9:.2f} GB reused (goal >= 80%)"))
    shutil.rmtree(work / "out-a", ignore_errors=True)

    drop_layer_blobs(cache_a)
    t_warm, warm = compose(pristine, cache_a, work / "out-warm", opts.mirror)
    rows.append(("warm downloads, no layer blobs", f"{t_warm:.0f} s",
                 f"{warm['image']['layers_built']} layers built; digest "
                 f"{'identical' if warm['image']['digest'] == digest else 'DIFFERENT'}"))
    shutil.rmtree(work / "out-warm", ignore_errors=True)
    drop_layer_blobs(cache_a)  # only downloads left: they are the second cache's mirror

    mirror = cache_a / "blobs" / "sha256"
    t_cold2, cold2 = compose(pristine, cache_b, work / "out-b", mirror)
    same = cold2["image"]["digest"] == digest
    rows.append(("cold-2 (second empty cache; wheels from the first as a mirror)",
                 f"{t_cold2:.0f} s",
                 f"digest {'identical' if same else 'DIFFERENT: ' + cold2['image']['digest']}"))
    shutil.rmtree(cache_b, ignore_errors=True)
    shutil.rmtree(work / "out-b", ignore_errors=True)
    rows.append(("image size vs official vllm-openai", f"{size / 1e9:.2f} GB",
                 f"{size / 1e9 / OFFICIAL_GB:.2f}x of {OFFICIAL_GB} GB (goal <= 0.5x)"))

    rows.append(("buildah bud with RUN pip install", "495 s",
                 "served's context, quoted from ../shared/BUILD-FACTS.md; "
                 f"{495 / t_cold:.1f}x frank cold. Measured side by side on served-cpu's "
                 "closure by bench/buildah_pip_bench.py (a new digest every run)"))

    table = ["| step | time | notes |", "|---|---|---|",
             *[f"| {a} | {b} | {c} |" for a, b, c in rows]]
    machine = (f"{platform.node()} ({platform.machine()}, {os.cpu_count()} cores, "
               f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB)")
    text = "\n".join([
        f"# Hermetic build of the served stack, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC", "",
        f"Command: `{' '.join([Path(sys.executable).name, *sys.argv])}`  ",
        f"Machine: {machine}  ",
        f"Stack: served{'' if opts.mirror else NO_MHC}; lock digest {cold['digest']}  ",
        f"Image digest (cold, compare on another machine): `{digest}`", "", *table, ""])
    print(text)
    if opts.results:
        opts.results.write_text(text)
    if opts.keep is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
