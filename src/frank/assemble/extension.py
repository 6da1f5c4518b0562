"""Build an ``extension`` part's module on the host from its pinned inputs, once per key.

The inputs (``frank.model.kinds.extension``) are fetched through the store (verified) and
unpacked at one fixed path, ``ROOT`` (nvcc writes paths into what it makes, so the same
path gives the same bytes on any machine; one build at a time holds it, by ``ROOT.lock``):

- ``src/``: the library's package folder from its wheel (the sources);
- ``in/``: the toolchain wheels' ``nvidia/`` trees and the header wheels' ``include``
  folders (torch's ``torch/include``, ``nvidia/cu13/include`` of cuBLAS, ...);
- ``python/``: ``usr/include`` of the interpreter's ``libpython3.X-dev`` .deb.

The builder (the part's ``builder``, standard library only) is run with those folders as
arguments; the module and its log are kept at ``$FRANK_CACHE/<builder folder>/<key>/``
(temp + rename) with ``result.json`` (time, peak memory, sha256). The key hashes every
input's sha256 by label, the builder's tree, the archs, the sources built (all unless
``only``), the Python headers, the module's suffix and the host C++ compiler's version line
(nvcc compiles host code with it; no wheel pins it): the same key builds nothing.
bench/exllamav3_ext_build.py calls this with its own archs, ``--only`` or another Python's
headers, so its keys and a compose's are one. The kept module is checked through the store's
stat ledger (a stat, unless it changed), and the part's build (no overrides) against its
``output_sha256`` when it pins one (the module file's sha256; not in the key).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name

from frank.assemble.aot import check_output
from frank.assemble.kernel import host_compiler, link_lib64
from frank.errors import FrankError
from frank.hashing import sha256_json, sha256_tree
from frank.model.archs import parse_arch
from frank.model.kinds.extension import Extension, PinnedDeb, ext_suffix, python_version
from frank.model.pins import wheel_filename
from frank.store.fetch import Fetcher, Pinned

ROOT = Path("/tmp/frank-exl3-ext")
_CANONICAL = ROOT  # a build elsewhere (a test's own root) has other bytes: its key says so
_WHY = re.compile(r"\berror\b|\bfatal\b|cannot find|undefined reference|rc=[1-9]",
                  re.IGNORECASE)


@dataclass(frozen=True)
class Input:
    """One pinned input: where it comes from and what of it the build uses."""

    url: str
    sha256: str
    take: str  # a member prefix, "include" (include folders only) or "deb"
    to: str  # src, in or python


def inputs(part: Extension) -> dict[str, Input]:
    """Every pinned input by label (a distribution's or .deb package's name)."""
    assert part.wheel is not None and part.toolchain is not None
    top = part.distribution.replace("-", "_")
    out = {part.distribution: Input(str(part.wheel.url), part.wheel.sha256, f"{top}/", "src")}
    for wheels, take in ((part.toolchain, "nvidia/"), (part.headers, "include")):
        for w in wheels:
            label = str(canonicalize_name(wheel_filename(str(w.url)).split("-", 1)[0]))
            out[label] = Input(str(w.url), w.sha256, take, "in")
    deb: PinnedDeb = part.python_headers
    out[deb.package] = Input(str(deb.url), deb.sha256, "deb", "python")
    return out


def torch_archs(archs: list[str]) -> str:
    """The builder's ``--archs``: torch's spelling, space-separated."""
    return " ".join(parse_arch(a).spell("torch") for a in archs)


def build_key(part: Extension, root: Path, *, archs: str, only: list[str],
              python: list[str], suffix: str) -> str:
    """The content key of one build (module docstring)."""
    builder = root / part.builder.path
    return sha256_json({"format": f"frank-{builder.name}/1",
                        "inputs": {k: v.sha256 for k, v in sorted(inputs(part).items())},
                        "builder": sha256_tree(builder), "archs": archs,
                        "only": sorted(only), "python": python, "suffix": suffix,
                        "host_cxx": host_compiler(),
                        **({"root": str(ROOT)} if ROOT != _CANONICAL else {})})


def _members(wheel: Path, dest: Path, take: str) -> None:
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            parts = Path(info.filename).parts
            wanted = ("include" in parts[:3]) if take == "include" else \
                info.filename.startswith(take)
            if not wanted or info.is_dir() or ".." in parts or info.filename.startswith("/"):
                continue
            target = dest.joinpath(*parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, target.open("wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
            target.chmod(0o755 if (info.external_attr >> 16) & 0o111 else 0o644)


def assemble(part: Extension, fetcher: Fetcher, manifest: Path | None = None) -> Path:
    """The inputs fetched (verified) and unpacked at ROOT, made afresh; the caller holds
    ROOT's lock."""
    pins = inputs(part)
    try:
        paths = fetcher.fetch_all([Pinned(p.url, p.sha256) for p in pins.values()])
    except FrankError as exc:
        raise FrankError(exc.message, file=manifest, field="toolchain") from None
    shutil.rmtree(ROOT, ignore_errors=True)
    ROOT.mkdir(parents=True)
    for pin in pins.values():
        path = paths[pin.sha256]
        if pin.take == "deb":
            tmp = ROOT / "deb"
            subprocess.run(["dpkg-deb", "-x", str(path), str(tmp)], check=True)
            shutil.move(str(tmp / "usr" / "include"), str(ROOT / "python"))
            shutil.rmtree(tmp)
        else:
            _members(path, ROOT / pin.to, pin.take)
    link_lib64(ROOT / "in")
    return ROOT


@dataclass(frozen=True)
class Built:
    """A kept build: its folder and its result.json."""

    folder: Path
    result: dict[str, object]

    @property
    def module(self) -> Path:
        return self.folder / str(self.result["module"])


def kept_folder(part: Extension, root: Path, store_root: Path) -> Path:
    """Where the store keeps the part's own build (no overrides), there or not."""
    suffix = ext_suffix(part.python_headers)
    key = build_key(part, root, archs=torch_archs(list(part.archs)), only=[],
                    python=[part.python_headers.package], suffix=suffix)
    return store_root / Path(part.builder.path).name / key


def build_extension(part: Extension, root: Path, fetcher: Fetcher, *,
                    manifest: Path | None = None, archs: str | None = None,
                    only: list[str] | None = None, python_include: list[Path] | None = None,
                    suffix: str | None = None, jobs: int | None = None) -> Built:
    """The part's module, built or kept by key. ``archs``, ``only``, ``python_include`` and
    ``suffix`` override the part's (the bench's and CI's smaller builds); each is in the key."""
    own = not (archs or only or python_include or suffix)  # the part's build: its pin holds
    archs = archs or torch_archs(list(part.archs))
    only = list(only or [])
    py_dirs = list(python_include or [])
    suffix = suffix or ext_suffix(part.python_headers)
    py_key = [sha256_tree(p) for p in py_dirs] or [part.python_headers.package]
    key = build_key(part, root, archs=archs, only=only, python=py_key, suffix=suffix)
    kept = fetcher.store.root / Path(part.builder.path).name / key
    if not (kept / "result.json").is_file():
        ROOT.parent.mkdir(parents=True, exist_ok=True)
        with open(f"{ROOT}.lock", "w") as hold:
            fcntl.flock(hold, fcntl.LOCK_EX)
            if not (kept / "result.json").is_file():
                _build(part, root, fetcher, manifest, kept, key, archs=archs, only=only,
                       py_dirs=py_dirs, suffix=suffix, jobs=jobs or os.cpu_count() or 1)
    built = Built(kept, json.loads((kept / "result.json").read_text()))
    got = fetcher.store.ledger.sha256(built.module) if built.module.is_file() else None
    if got != built.result["sha256"]:
        raise FrankError(f"the kept {built.module} is not what its result.json records "
                         f"(sha256 {built.result['sha256']}): remove {kept} to build it again",
                         file=manifest, field="builder")
    if own:
        check_output(part.output_sha256, str(got), manifest)
    return built


def _build(part: Extension, root: Path, fetcher: Fetcher, manifest: Path | None, kept: Path,
           key: str, *, archs: str, only: list[str], py_dirs: list[Path], suffix: str,
           jobs: int) -> None:
    t0 = time.monotonic()
    here = assemble(part, fetcher, manifest)
    t_in = time.monotonic() - t0
    top = part.distribution.replace("-", "_")
    nvcc = sorted(here.glob("in/nvidia/*/bin/nvcc"))
    torch = here / "in" / "torch" / "include"
    if not nvcc:
        raise FrankError("the toolchain wheels hold no nvcc (pin nvidia-cuda-nvcc)",
                         file=manifest, field="toolchain")
    if not torch.is_dir():
        raise FrankError("no torch/include among the header wheels (pin the closure's torch)",
                         file=manifest, field="headers")
    version = python_version(part.python_headers)
    py = [str(p) for p in py_dirs] or [str(here / "python" / f"python{version}"),
                                       str(here / "python" / "x86_64-linux-gnu" /
                                           f"python{version}")]
    out = here / "out"
    cmd = [sys.executable, str(root / part.builder.path / part.builder.main),
           "--sources", str(here / "src" / top), "--cuda-home", str(nvcc[0].parent.parent),
           "--torch-include", str(torch), *[a for p in py for a in ("--python-include", p)],
           "--ext-suffix", suffix, "--archs", archs, "--out", str(out), "--jobs", str(jobs),
           *[a for s in only for a in ("--only", s)]]
    t1 = time.monotonic()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
    wall = time.monotonic() - t1
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    peak = after.ru_maxrss / 1024  # the largest process of the build (one compile's)
    log = out / "build.log"
    if proc.returncode != 0:
        kept.parent.mkdir(parents=True, exist_ok=True)
        failed = kept.parent / f"build-{key[:16]}.log"
        text = (log.read_text(errors="replace") if log.is_file() else "") + proc.stderr
        failed.write_text(text)
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        why = list(dict.fromkeys(ln for ln in lines if _WHY.search(ln)))[:3] or lines[-2:]
        raise FrankError(f"{part.module} build failed (exit {proc.returncode}): "
                         f"{' | '.join(ln[:300] for ln in why) or 'no output'}; "
                         f"full log: {failed}", file=manifest, field="builder")
    so = out / f"{part.module}{suffix}"
    tmp = kept.with_name(f".{key}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    shutil.copyfile(so, tmp / so.name)
    shutil.copyfile(log, tmp / "build.log")
    result = {"module": so.name, "sha256": hashlib.sha256(so.read_bytes()).hexdigest(),
              "size": so.stat().st_size, "archs": archs, "jobs": jobs,
              "sources": len(only) or "all", "build_s": round(wall, 1), "cpu_s": round(cpu),
              "inputs_s": round(t_in, 1), "peak_process_mib": round(peak), "key": key,
              "host": platform.node(), "cpus": len(os.sched_getaffinity(0)),
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    (tmp / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    shutil.rmtree(kept, ignore_errors=True)
    tmp.rename(kept)
    shutil.rmtree(ROOT, ignore_errors=True)
