"""Build an ``aot`` part's modules on the host, offline, one content key per module.

The pinned wheels (the library's own, its builder's Python packages, NVIDIA's CUDA wheels of
one release) are fetched through ``frank.store.fetch`` (verified) and unpacked once per set
of hashes into ``$FRANK_CACHE/aot-toolchains/<key>``, with the link stubs no wheel ships:

- ``lib64`` -> ``lib`` in each CUDA folder (nvcc.profile and FlashInfer link from lib64),
- ``lib/libcudart.so`` -> ``libcudart.so.13`` (the runtime wheel has only the versioned
  name; ``-lcudart`` wants the bare one),
- ``lib/stubs/libcuda.so``: an empty shared library whose soname is ``libcuda.so.1``, for
  ``-lcuda`` (the driver's library is the GPU machine's, never a wheel's; a module that
  records it needs ``libcuda.so.1``, which the driver provides).

Each module's key hashes the builder's main file, the wheels, the module's own entry
(name, generator, arguments), the archs, the interpreter's version and the host C++
compiler's version line (nvcc calls it; no wheel pins it). A module whose key has a kept
``$FRANK_CACHE/aot/<key>/<name>.so`` is not built again; the missing ones are built in one
run of the builder (one ninja over all their sources, ``MAX_JOBS`` = the cores), in the
private mount and network namespace ``frank.assemble.kernel`` uses, at fixed paths
(``BUILD_ROOT/src``, ``BUILD_ROOT/toolchain``), so two machines give the same bytes. Every
run is appended to ``$FRANK_CACHE/aot/runs.jsonl`` (the modules it built and their times).

A part that pins ``output_sha256`` has what it gets (built or kept) held to it: the
``sha256_tree`` of the folder its layer places (``<name>/<name>.so`` each, 0644), from each
file's sha256 through the store's stat ledger, so a kept output costs a stat per module.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from frank.assemble.kernel import (
    BUILD_ROOT,
    SYSTEM_PATH,
    _run_build,
    host_compiler,
    isolation,
    unpack_wheels,
)
from frank.errors import FrankError
from frank.hashing import sha256_bytes, sha256_file, sha256_json
from frank.model.archs import spell_archs
from frank.model.kinds.aot import Aot, AotModule, read_modules
from frank.model.kinds.engine import LocalWheelFile
from frank.store.fetch import Fetcher, Pinned

LAYOUT = "frank-aot/1"  # bump when the unpacked layout, the stubs or the build env change
_TIME = re.compile(r"^module (\S+): ([0-9.]+)$", re.MULTILINE)
_WHY = re.compile(r"\berror\b|\bfatal\b|cannot find|undefined reference|FAILED|build.py:",
                  re.IGNORECASE)


def module_keys(part: Aot, root: Path, manifest: Path, *, isolated: bool
                ) -> tuple[list[AotModule], dict[str, str]]:
    """The part's modules and each one's key."""
    modules = read_modules((root / part.modules).read_text(encoding="utf-8"),
                           label=part.modules, manifest=manifest)
    main = root / part.builder.path / part.builder.main
    base = {"layout": LAYOUT, "builder": sha256_file(main), "wheels": _wheel_shas(part),
            "archs": spell_archs(part.archs, "flashinfer"), "host_cxx": host_compiler(),
            "python": f"{sys.version_info[0]}.{sys.version_info[1]}", "isolated": isolated}
    return modules, {m.name: sha256_json({**base, "module": m.model_dump()})
                     for m in modules}


def kept_paths(part: Aot, root: Path, manifest: Path, store_root: Path) -> dict[str, Path]:
    """name -> where the store keeps each module of ``part`` (there or not)."""
    modules, keys = module_keys(part, root, manifest, isolated=isolation() is not None)
    return {m.name: store_root / "aot" / keys[m.name] / f"{m.name}.so" for m in modules}


def output_digest(paths: dict[str, Path], hash_of: Callable[[Path], str]) -> str:
    """What ``output_sha256`` pins: ``frank.hashing.sha256_tree`` of the folder the layer
    places at ``dest`` (``<name>/<name>.so``, mode 0644), from each file's sha256 as
    ``hash_of`` gives it (the ledger's in a compose, a full read in release mode)."""
    files = sorted((f"{name}/{name}.so", path) for name, path in paths.items())
    return sha256_bytes("".join(f"{hash_of(path)} - {rel}\n" for rel, path in files).encode())


def check_output(pin: str | None, got: str, manifest: Path | None) -> None:
    """A pinned output that is not what the build made (or kept): one line naming the
    manifest's field and both digests."""
    if pin is not None and got != pin:
        raise FrankError(f"the build's output is {got}, the pin is {pin}: a stale pin or a "
                         "build that does not reproduce (`frank pin NAME@VERSION --output` "
                         "writes the kept output's digest)", file=manifest, field="output_sha256")


def build_modules(part: Aot, root: Path, manifest: Path, fetcher: Fetcher | None = None,
                  *, jobs: int | None = None) -> dict[str, Path]:
    """name -> the built (or kept) ``<name>.so`` of every module of ``part``; held to the
    part's ``output_sha256`` when it pins one."""
    fetcher = fetcher or Fetcher()
    prefix = isolation()
    modules, keys = module_keys(part, root, manifest, isolated=prefix is not None)
    kept = fetcher.store.root / "aot"
    paths = {m.name: kept / keys[m.name] / f"{m.name}.so" for m in modules}
    missing = [m for m in modules if not paths[m.name].is_file()]
    if missing:
        _build(part, root, manifest, fetcher, missing, keys, prefix, jobs or os.cpu_count() or 1)
    if part.output_sha256 is not None:
        check_output(part.output_sha256, output_digest(paths, fetcher.store.ledger.sha256),
                     manifest)
    return paths


def _wheel_shas(part: Aot) -> list[str]:
    assert part.wheel is not None and part.toolchain is not None
    return [part.wheel.sha256, *(w.sha256 for w in part.toolchain),
            *(w.sha256 for w in part.python)]


def _pins(part: Aot) -> list[tuple[str, Pinned]]:
    assert part.wheel is not None and part.toolchain is not None
    out = [(str(part.wheel.url), Pinned(str(part.wheel.url), part.wheel.sha256))]
    out += [(str(w.url), Pinned(str(w.url), w.sha256)) for w in part.toolchain]
    for p in part.python:
        url = f"file://{p.path}" if isinstance(p, LocalWheelFile) else str(p.url)
        out.append((url, Pinned(url, p.sha256)))
    return out


def unpack(part: Aot, manifest: Path, fetcher: Fetcher) -> Path:
    """Every wheel fetched (verified) and unpacked into one folder, once per set of hashes,
    with the link stubs (module docstring)."""
    key = sha256_json({"layout": LAYOUT, "wheels": _wheel_shas(part)})
    dest = fetcher.store.root / "aot-toolchains" / key
    if dest.is_dir():
        return dest
    return unpack_wheels(fetcher, _pins(part), dest, manifest, finish=_link_stubs)


def _link_stubs(root: Path) -> None:
    """``libcudart.so`` beside its versioned file, and an empty ``stubs/libcuda.so``: the
    link stubs the module docstring names."""
    for lib in root.glob("nvidia/*/lib"):
        for versioned in lib.glob("libcudart.so.*"):
            if not (lib / "libcudart.so").exists():
                (lib / "libcudart.so").symlink_to(versioned.name)
        _libcuda_stub(lib / "stubs" / "libcuda.so")


def _libcuda_stub(path: Path) -> None:
    """An empty shared library named libcuda.so.1, made by the host's compiler."""
    path.parent.mkdir(parents=True, exist_ok=True)
    cc = shutil.which("gcc", path=SYSTEM_PATH) or shutil.which("cc", path=SYSTEM_PATH)
    if cc is None:
        raise FrankError(f"no gcc on {SYSTEM_PATH} to make the libcuda.so link stub")
    subprocess.run([cc, "-shared", "-nostdlib", "-Wl,-soname,libcuda.so.1", "-o", str(path),
                    "-x", "c", "/dev/null"], check=True, capture_output=True)


def _build(part: Aot, root: Path, manifest: Path, fetcher: Fetcher, missing: list[AotModule],
           keys: dict[str, str], prefix: tuple[str, ...] | None, jobs: int) -> None:
    toolchain = unpack(part, manifest, fetcher)
    kept = fetcher.store.root / "aot"
    kept.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=kept))
    try:
        src = work / "src"
        for sub in ("prog", "in", "ws", "out", "tmp"):
            (src / sub).mkdir(parents=True)
        shutil.copyfile(root / part.builder.path / part.builder.main, src / "prog" / "build.py")
        shutil.copyfile(root / part.modules, src / "in" / "modules.toml")
        here = BUILD_ROOT / "src" if prefix is not None else src
        tools = BUILD_ROOT / "toolchain" if prefix is not None else toolchain
        env = _env(toolchain, tools, here, part, jobs, manifest)
        only = " ".join(f"--only {m.name}" for m in missing)
        command = (f"exec {shlex.quote(sys.executable)} -S -s prog/build.py "
                   f"--input in/modules.toml --out out {only}")
        log = kept / f"build-{keys[missing[0].name][:16]}.log"
        start = time.monotonic()
        rc = _run_build(command, src, toolchain, env, prefix, log)
        wall = time.monotonic() - start
        if rc != 0:
            raise FrankError(f"module build failed (exit {rc}): {_why(log)}; full log: {log}",
                             file=manifest, field="modules")
        text = log.read_text(errors="replace")
        times = {name: float(t) for name, t in _TIME.findall(text)}
        for m in missing:
            built = src / "out" / m.name / f"{m.name}.so"
            if not built.is_file():
                raise FrankError(f"the builder made no {m.name}.so; full log: {log}",
                                 file=manifest, field="modules")
            target = kept / keys[m.name]
            stage = Path(tempfile.mkdtemp(prefix=".keep-", dir=kept))
            shutil.copyfile(built, stage / built.name)
            os.chmod(stage / built.name, 0o644)
            try:
                stage.rename(target)
            except OSError:
                shutil.rmtree(stage, ignore_errors=True)
                if not target.is_dir():
                    raise
        record = {"part": part.name, "built": {m.name: times.get(m.name) for m in missing},
                  "keys": {m.name: keys[m.name] for m in missing}, "wall_s": round(wall, 1),
                  "jobs": jobs, "log": log.name}
        with (kept / "runs.jsonl").open("a", encoding="utf-8") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _env(toolchain: Path, tools: Path, here: Path, part: Aot, jobs: int, manifest: Path
         ) -> dict[str, str]:
    """The builder's whole environment, at the paths the build sees (``tools``, ``here``)."""
    nvcc = sorted(toolchain.glob("nvidia/*/bin/nvcc"))
    if not nvcc:
        raise FrankError("the toolchain wheels hold no nvcc (pin nvidia-cuda-nvcc)",
                         file=manifest, field="toolchain")
    cuda = nvcc[0].parent.parent.relative_to(toolchain)
    ninja = sorted(toolchain.glob("*.data/scripts/ninja"))
    if not ninja:
        raise FrankError("no ninja among the python wheels (pin the ninja wheel)",
                         file=manifest, field="python")
    path = [str(tools / ninja[0].parent.relative_to(toolchain)), str(tools / cuda / "bin"),
            SYSTEM_PATH]
    return {
        "PATH": ":".join(path), "PYTHONPATH": str(tools), "CUDA_HOME": str(tools / cuda),
        "FLASHINFER_CUDA_ARCH_LIST": spell_archs(part.archs, "flashinfer"),
        "FLASHINFER_WORKSPACE_BASE": str(here / "ws"), "MAX_JOBS": str(jobs),
        "TMPDIR": str(here / "tmp"), "HOME": str(here / "tmp"),
        "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0",
        "LC_ALL": "C", "TZ": "UTC", "SOURCE_DATE_EPOCH": "0",
    }


def _why(log: Path) -> str:
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    picked = list(dict.fromkeys(ln for ln in lines if _WHY.search(ln)))[:3] or lines[-2:]
    return " | ".join(ln[:300] for ln in picked) or "no output"
