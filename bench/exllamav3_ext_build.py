"""Build exllamav3's ``exllamav3_ext`` on this host from pinned inputs, keyed by content;
print the time, the peak memory and the module's sha256.

Every input is pinned by sha256 in the repo's locks and fetched through frank's store
(verified), nothing else is read from the network, and the build itself is
builders/exllamav3-ext/build.py (standard library, no network):

- the exllamav3 wheel of parts/exl3-runtime/1.6.5.toml (its sources);
- from stacks/pylock.served.toml: torch 2.11.0 (headers only), the CUDA 13.0 toolchain the
  cuda-toolchain part forces (nvcc, crt, nvvm 13.0.88, cudart 13.0.96, cccl 13.0.85) and the
  cuBLAS, cuSPARSE, cuSOLVER, cuRAND headers torch's ATen/cuda headers include;
- Python 3.11's headers from libpython3.11-dev as pinned in
  images/bookworm-python-cc.debs.lock (the interpreter of the served base), or
  ``--python-include`` for another Python (the GPU proof's 3.12: not pinned, said so).

The inputs are unpacked at one fixed path (``/tmp/frank-exl3-ext``: nvcc writes paths into
what it makes) and the output kept at ``$FRANK_CACHE/exllamav3-ext/<key>/``, the key hashing
every input's sha256, the builder's bytes, the archs, the Python headers and the host g++
version line; the same key builds nothing. ``--only SRC`` builds a few sources (CI's check).

    FRANK_CACHE=/work/fcache nice -n 10 .venv/bin/python bench/exllamav3_ext_build.py \
        --archs 12.0 --jobs 2
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import resource
import shutil
import subprocess
import sys
import time
import tomllib
import zipfile
from pathlib import Path

from frank.build.kernel import host_compiler
from frank.hashing import sha256_json, sha256_tree
from frank.resolve.debs.lock import read_lock
from frank.resolve.debs.resolver import archive_roots
from frank.store.blobs import BlobStore
from frank.store.fetch import Fetcher, Pinned

REPO = Path(__file__).resolve().parents[1]
BUILDER = REPO / "builders" / "exllamav3-ext"
FIXED = Path("/tmp/frank-exl3-ext")
KEY_FORMAT = "frank-exllamav3-ext/1"
HEADERS_FROM = ("nvidia-cublas", "nvidia-cusparse", "nvidia-cusolver", "nvidia-curand")
TOOLCHAIN = ("nvidia-cuda-nvcc", "nvidia-cuda-crt", "nvidia-nvvm", "nvidia-cuda-runtime",
             "nvidia-cuda-cccl")


def pylock_wheel(pylock: dict[str, object], name: str) -> tuple[str, str, str]:
    """(version, url, sha256) of ``name``'s x86_64 (or pure) wheel in a pylock."""
    for pkg in pylock["packages"]:  # type: ignore[attr-defined]
        if pkg["name"] == name:
            for w in pkg.get("wheels", []):
                if "x86_64" in w["url"] or w["url"].endswith("-none-any.whl"):
                    return pkg["version"], w["url"], w["hashes"]["sha256"]
    raise SystemExit(f"stacks/pylock.served.toml has no {name} wheel")


def inputs() -> dict[str, dict[str, str]]:
    """Every pinned input: label -> url, sha256 (and what to take out of it)."""
    pylock = tomllib.loads((REPO / "stacks" / "pylock.served.toml").read_text())
    part = tomllib.loads((REPO / "parts" / "exl3-runtime" / "1.6.5.toml").read_text())
    out = {"exllamav3": {"url": part["wheel"]["url"], "sha256": part["wheel"]["sha256"],
                         "take": "exllamav3/"}}
    _, url, sha = pylock_wheel(pylock, "torch")
    out["torch"] = {"url": url, "sha256": sha, "take": "torch/include/"}
    for name in TOOLCHAIN:
        _, url, sha = pylock_wheel(pylock, name)
        out[name] = {"url": url, "sha256": sha, "take": "nvidia/"}
    for name in HEADERS_FROM:
        _, url, sha = pylock_wheel(pylock, name)
        out[name] = {"url": url, "sha256": sha, "take": "nvidia/cu13/include/"}
    image = REPO / "images" / "bookworm-python-cc.toml"
    from frank.model.imagefile import load_image_file

    debs = load_image_file(image).debs
    assert debs is not None
    lock = read_lock(image.with_suffix(".debs.lock"))
    roots = archive_roots(debs)
    dev = next(p for p in lock.packages if p.name == "libpython3.11-dev")
    out["libpython3.11-dev"] = {"url": f"{roots[dev.archive]}/{dev.filename}",
                                "sha256": dev.sha256, "take": "usr/include/"}
    return out


def _unzip(wheel: Path, dest: Path, take: str) -> None:
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            name = info.filename
            if not name.startswith(take) or info.is_dir() or ".." in Path(name).parts:
                continue
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, target.open("wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
            target.chmod(0o755 if (info.external_attr >> 16) & 0o111 else 0o644)


def assemble(pins: dict[str, dict[str, str]], fetcher: Fetcher) -> Path:
    """The inputs unpacked at FIXED (made afresh): wheels' chosen members, the .deb's headers."""
    paths = fetcher.fetch_all([Pinned(p["url"], p["sha256"]) for p in pins.values()])
    shutil.rmtree(FIXED, ignore_errors=True)
    FIXED.mkdir(parents=True)
    for label, pin in pins.items():
        path = paths[pin["sha256"]]
        if label == "libpython3.11-dev":
            tmp = FIXED / "deb"
            subprocess.run(["dpkg-deb", "-x", str(path), str(tmp)], check=True)
            shutil.move(str(tmp / "usr" / "include"), str(FIXED / "python"))
            shutil.rmtree(tmp)
        else:
            _unzip(path, FIXED / ("src" if label == "exllamav3" else "in"), pin["take"])
    lib = FIXED / "in" / "nvidia" / "cu13" / "lib"
    if not (lib.parent / "lib64").exists():
        (lib.parent / "lib64").symlink_to("lib")
    return FIXED


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--archs", default="12.0", help="torch's spelling, space-separated")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", action="append", default=[])
    ap.add_argument("--python-include", type=Path, action="append", default=[],
                    help="another Python's headers (default: the pinned 3.11 ones)")
    ap.add_argument("--ext-suffix", default=".cpython-311-x86_64-linux-gnu.so")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    store = BlobStore()
    pins = inputs()
    py_key = [sha256_tree(p) for p in args.python_include] or ["libpython3.11-dev"]
    key = sha256_json({"format": KEY_FORMAT, "inputs": {k: v["sha256"] for k, v in
                                                        sorted(pins.items())},
                       "builder": sha256_tree(BUILDER), "archs": args.archs,
                       "only": sorted(args.only), "python": py_key,
                       "suffix": args.ext_suffix, "host_cxx": host_compiler()})
    keep = store.root / "exllamav3-ext" / key
    t0 = time.monotonic()
    if not (keep / "result.json").is_file():
        fetcher = Fetcher(store)
        root = assemble(pins, fetcher)
        t_in = time.monotonic() - t0
        py = [str(p) for p in args.python_include] or [
            str(root / "python" / "python3.11"),
            str(root / "python" / "x86_64-linux-gnu" / "python3.11")]
        out = root / "out"
        cmd = [sys.executable, str(BUILDER / "build.py"), "--sources", str(root / "src" /
               "exllamav3"), "--cuda-home", str(root / "in" / "nvidia" / "cu13"),
               "--torch-include", str(root / "in" / "torch" / "include"),
               *[a for p in py for a in ("--python-include", p)],
               "--ext-suffix", args.ext_suffix, "--archs", args.archs, "--out", str(out),
               "--jobs", str(args.jobs), *[a for s in args.only for a in ("--only", s)]]
        t1 = time.monotonic()
        proc = subprocess.run(cmd, check=False)
        wall = time.monotonic() - t1
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        if proc.returncode != 0:
            print(f"build failed; log: {out / 'build.log'}", file=sys.stderr)
            return 1
        so = out / f"exllamav3_ext{args.ext_suffix}"
        tmp = keep.with_name(f".{key}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        shutil.copyfile(so, tmp / so.name)
        shutil.copyfile(out / "build.log", tmp / "build.log")
        result = {"module": so.name, "sha256": hashlib.sha256(so.read_bytes()).hexdigest(),
                  "size": so.stat().st_size, "archs": args.archs, "jobs": args.jobs,
                  "sources": len(args.only) or "all", "build_s": round(wall, 1),
                  "inputs_s": round(t_in, 1), "peak_process_mib": round(peak),
                  "key": key, "host": platform.node(), "cpus": len(
                      __import__("os").sched_getaffinity(0)),
                  "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        (tmp / "result.json").write_text(json.dumps(result, indent=1) + "\n")
        shutil.rmtree(keep, ignore_errors=True)
        tmp.rename(keep)
        shutil.rmtree(FIXED, ignore_errors=True)
    result = json.loads((keep / "result.json").read_text())
    result["path"] = str(keep / result["module"])
    result["cached_s"] = round(time.monotonic() - t0, 2)
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in
                                                         result.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
