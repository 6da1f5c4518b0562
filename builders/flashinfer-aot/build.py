"""Build FlashInfer modules ahead of time, with FlashInfer's own generators and ninja rules.

Run by frank (``frank.build.aot``) on the host, offline, with the interpreter that runs
frank and ``PYTHONPATH`` set to one folder holding the pinned wheels unpacked (the
flashinfer-python wheel the image installs, a CPU torch, apache-tvm-ffi, ninja, and NVIDIA's
CUDA wheels of one release under ``nvidia/``). Its environment says the rest:
``CUDA_HOME`` (that folder's ``nvidia/cu13``), ``FLASHINFER_CUDA_ARCH_LIST`` (the archs, in
FlashInfer's spelling), ``FLASHINFER_WORKSPACE_BASE`` (an empty folder: FlashInfer writes
its generated sources and build trees there), ``MAX_JOBS`` and ``PATH`` (ninja, nvcc).

    python build.py --input served.toml --out OUT [--only NAME]...

For each module of the input file (``[[module]]``: ``name``, ``generator`` as
``package.module:function``, ``args``), it calls the generator, refuses a spec named
otherwise, builds all of them in one ninja run (so the sources of every module share the
cores), and writes ``OUT/<name>/<name>.so``, stripped of local symbols (nvcc names some
after its temp file, ``tmpxft_<pid>``, which would make two builds differ). A line
``module NAME: SECONDS`` per module (the time its last object finished, from ninja's log)
goes to stdout. ``python -m flashinfer.aot`` is not used: from an installed wheel it looks
for a source checkout and always builds its whole grid.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
import time
import tomllib
import types
from pathlib import Path


def bare_package(name: str) -> None:
    """Import ``name`` as a namespace for its submodules without running its __init__
    (flashinfer's imports every kernel family and their run-time dependencies, none of
    which building a module needs)."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None:
        sys.exit(f"build.py: {name} is not importable from PYTHONPATH")
    pkg = types.ModuleType(name)
    pkg.__path__ = list(spec.submodule_search_locations)
    pkg.__spec__ = spec
    pkg.__file__ = spec.origin
    sys.modules[name] = pkg


def load_modules(path: Path, only: list[str]) -> list[dict]:
    with path.open("rb") as f:
        doc = tomllib.load(f)
    modules = doc.get("module", [])
    names = [m["name"] for m in modules]
    unknown = sorted(set(only) - set(names))
    if unknown:
        sys.exit(f"build.py: {path}: no module {unknown[0]!r}")
    return [m for m in modules if not only or m["name"] in only]


def make_spec(module: dict):  # -> flashinfer.jit.core.JitSpec
    target, _, func = module["generator"].partition(":")
    if not target.startswith("flashinfer.jit") or not func:
        sys.exit(f"build.py: module {module['name']}: generator {module['generator']!r} is "
                 "not a flashinfer.jit function")
    spec = getattr(importlib.import_module(target), func)(*module.get("args", []))
    if spec.name != module["name"]:
        sys.exit(f"build.py: module {module['name']}: {module['generator']} makes "
                 f"{spec.name!r}")
    return spec


def finished_at(log: Path) -> dict[str, float]:
    """When the last output of each build folder finished, in seconds after the start
    (ninja's log: start ms, end ms, mtime, output path)."""
    out: dict[str, float] = {}
    if not log.is_file():
        return out
    for line in log.read_text().splitlines()[1:]:
        parts = line.split("\t")
        if len(parts) >= 4:
            folder = Path(parts[3]).parent.name
            out[folder] = max(out.get(folder, 0.0), int(parts[1]) / 1000)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--only", action="append", default=[])
    args = ap.parse_args()
    modules = load_modules(args.input, args.only)
    bare_package("flashinfer")
    from flashinfer.jit import core
    from flashinfer.jit import env as jit_env

    specs = [make_spec(m) for m in modules]
    start = time.monotonic()
    core.build_jit_specs(specs, verbose=True, skip_prebuilt=False)
    times = finished_at(jit_env.FLASHINFER_JIT_DIR / ".ninja_log")
    strip = os.environ.get("STRIP", "strip")
    for spec in specs:
        dest = args.out / spec.name / f"{spec.name}.so"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(spec.jit_library_path, dest)
        subprocess.run([strip, "--strip-unneeded", str(dest)], check=True)
        os.chmod(dest, 0o644)
        print(f"module {spec.name}: {times.get(spec.name, time.monotonic() - start):.1f}",
              flush=True)


if __name__ == "__main__":
    main()
