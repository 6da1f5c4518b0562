"""Build exllamav3's compiled extension (``exllamav3_ext``) ahead of time, offline.

exllamav3 (a py3-none-any wheel) ships its CUDA/C++ sources under ``exllamav3/exllamav3_ext/``
and, at first import, builds them with ``torch.utils.cpp_extension.load`` unless a module
named ``exllamav3_ext`` is already importable (``exllamav3/ext.py``). This program makes that
module from the same sources with the same flags torch's ``load`` and exllamav3's
``util/cuda_flags.py`` would give (torch 2.11's ``_write_ninja_file_and_compile_objects``:
``-DTORCH_EXTENSION_NAME``, ``-DTORCH_API_INCLUDE_EXTENSION_H``, ``COMMON_NVCC_FLAGS``,
``-std=c++17 -fPIC``; exllamav3's ``-O3 --use_fast_math``, its two cudafe suppressions,
``--compress-mode=size``; ``-Ofast`` for the C++ units), with nothing but its arguments:

- ``--sources``: the folder holding ``exllamav3_ext/`` (the unpacked wheel);
- ``--cuda-home``: one CUDA release's nvcc, crt, nvvm, runtime and cccl, plus the
  cuBLAS/cuSPARSE/cuSOLVER/cuRAND headers torch's ``ATen/cuda`` headers include;
- ``--torch-include``: torch's ``include`` folder (headers only: no torch is imported);
- ``--python-include``: the folders holding ``Python.h`` and ``pyconfig.h`` of the Python
  the module is for (the extension is built per CPython ``major.minor``; ``--ext-suffix``
  names it, e.g. ``.cpython-311-x86_64-linux-gnu.so``);
- ``--archs``: torch's spelling (``12.0``, ``9.0a``), each as ``-gencode`` machine code, no PTX.

It links against empty stand-ins carrying the sonames torch's ``load`` links
(``libc10.so`` ... ``libtorch_python.so``, ``libcudart.so.13``): the module records them as
NEEDED and resolves every symbol from the torch already loaded when exllamav3 imports it, so
the output depends on torch's headers, not on its 1.5 GB of libraries. The result is
``strip --strip-unneeded``: nvcc puts its temp-file id (``tmpxft_<pid>``) into local symbol
names, which would make two builds differ.

Standard library only; one compile per source, ``--jobs`` at a time; each command and its
output go to ``<out>/build.log``; the module is written last (temp + rename).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import hashlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXT = "exllamav3_ext"
NVCC_COMMON = ["-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
               "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__",
               "--expt-relaxed-constexpr"]
NVCC_EXLLAMA = ["-O3", "--use_fast_math", "-Xcudafe", "--diag_suppress=177",
                "-Xcudafe", "--diag_suppress=20012", "--compress-mode=size"]
# The libraries torch's cpp_extension links a CUDA extension with (_prepare_ldflags).
SONAMES = ["libc10.so", "libc10_cuda.so", "libtorch_cpu.so", "libtorch_cuda.so",
           "libtorch.so", "libtorch_python.so"]
CUDART_SONAME = "libcudart.so.13"
RUNNING: set[int] = set()  # process groups of the compiles in flight


def _stop(signum: int, frame: object) -> None:
    """A stopped build stops its compilers too (each runs in its own process group)."""
    for pgid in list(RUNNING):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    raise SystemExit(128 + signum)


def gencode(arch: str) -> list[str]:
    """``12.0`` -> sm_120 machine code; ``9.0a`` -> sm_90a (torch's spelling, no +PTX)."""
    if "+" in arch:
        raise SystemExit(f"--archs: {arch!r}: PTX is not built (machine code only)")
    num = arch.replace(".", "")
    return [f"-gencode=arch=compute_{num},code=sm_{num}"]


def sources(root: Path) -> list[Path]:
    """The translation units exllamav3's ``extension_sources`` takes for a CUDA build:
    every .c/.cpp/.cu under exllamav3_ext/ except rocm/ and hipify output, sorted."""
    base = root / EXT
    out = []
    for path in sorted(base.rglob("*")):
        rel = path.relative_to(base).as_posix()
        name = path.name
        hipified = "_hip." in name or name.endswith(".hip") or name.startswith("hip_")
        if (path.is_file() and name.endswith((".c", ".cpp", ".cu")) and not hipified
                and not rel.startswith("rocm/")):
            out.append(path)
    return out


def stubs(dest: Path, cxx: str) -> None:
    """Empty shared objects with the sonames the module must record as NEEDED."""
    dest.mkdir(parents=True, exist_ok=True)
    empty = dest / "empty.c"
    empty.write_text("")
    for soname in [*SONAMES, CUDART_SONAME]:
        subprocess.run([cxx, "-shared", "-nostdlib", f"-Wl,-soname,{soname}", "-o",
                        str(dest / soname), str(empty)], check=True)
    (dest / "libcudart.so").symlink_to(CUDART_SONAME)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sources", type=Path, required=True)
    ap.add_argument("--cuda-home", type=Path, required=True)
    ap.add_argument("--torch-include", type=Path, required=True)
    ap.add_argument("--python-include", type=Path, action="append", required=True)
    ap.add_argument("--ext-suffix", required=True)
    ap.add_argument("--archs", required=True, help="space-separated, torch's spelling")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--cxx", default="g++")
    ap.add_argument("--only", action="append", default=[],
                    help="build only these sources (relative to exllamav3_ext/): a small check")
    args = ap.parse_args()

    nvcc = args.cuda_home / "bin" / "nvcc"
    units = sources(args.sources)
    if args.only:
        units = [u for u in units if u.relative_to(args.sources / EXT).as_posix() in args.only]
        if len(units) != len(args.only):
            raise SystemExit(f"--only: not all of {args.only} are sources")
    if not units:
        raise SystemExit(f"--sources: no {EXT}/ sources under {args.sources}")
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=args.out))
    log = (args.out / "build.log").open("w")

    includes = [f"-I{args.sources / EXT}"]
    for inc in (args.torch_include, args.torch_include / "torch/csrc/api/include",
                args.cuda_home / "include", *args.python_include):
        includes += ["-isystem", str(inc)]
    defines = [f"-DTORCH_EXTENSION_NAME={EXT}", "-DTORCH_API_INCLUDE_EXTENSION_H"]
    archs = [g for a in args.archs.split() for g in gencode(a)]
    cu_flags = [*defines, *includes, *NVCC_COMMON, *archs, "--compiler-options", "-fPIC",
                *NVCC_EXLLAMA, "-std=c++17", "-ccbin", args.cxx]
    cxx_flags = [*defines, *includes, "-fPIC", "-std=c++17", "-Ofast"]
    env = {"PATH": f"{nvcc.parent}:/usr/bin:/bin", "LC_ALL": "C", "TZ": "UTC",
           "SOURCE_DATE_EPOCH": "0", "TMPDIR": str(work), "HOME": str(work)}

    def compile_one(src: Path) -> tuple[Path, float, int, str, float, int]:
        rel = src.relative_to(args.sources / EXT)
        obj = work / "obj" / (rel.as_posix().replace("/", "__") + ".o")
        obj.parent.mkdir(parents=True, exist_ok=True)
        if src.suffix == ".cu":
            cmd = [str(nvcc), *cu_flags, "-c", str(src), "-o", str(obj)]
        else:
            cmd = [args.cxx, *cxx_flags, "-c", str(src), "-o", str(obj)]
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=env, start_new_session=True)
        RUNNING.add(proc.pid)
        assert proc.stdout is not None
        text = proc.stdout.read()
        # wait4: this compile's own CPU time and peak memory (its cicc, cc1plus, ptxas)
        _, status, usage = os.wait4(proc.pid, 0)
        RUNNING.discard(proc.pid)
        proc.returncode = os.waitstatus_to_exitcode(status)
        return (obj, time.monotonic() - t0, proc.returncode, shlex.join(cmd) + "\n" + text,
                usage.ru_utime + usage.ru_stime, usage.ru_maxrss)

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    t0 = time.monotonic()
    objs: list[Path] = []
    failed: list[Path] = []
    cpu_total, rss_max = 0.0, 0
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for i, (obj, secs, rc, text, cpu, rss) in enumerate(pool.map(compile_one, units), 1):
            cpu_total, rss_max = cpu_total + cpu, max(rss_max, rss)
            log.write(f"[{i}/{len(units)}] {secs:.1f}s wall {cpu:.1f}s cpu {rss / 1024:.0f}MiB "
                      f"rc={rc} {obj.name}\n{text}\n")
            log.flush()
            (objs if rc == 0 else failed).append(obj)
    if failed:
        print(f"{len(failed)} of {len(units)} sources failed, first {failed[0].name}; "
              f"see {args.out / 'build.log'}", file=sys.stderr)
        return 1
    stubs(work / "stubs", args.cxx)
    so = work / f"{EXT}{args.ext_suffix}"
    # --no-as-needed: the stand-ins define no symbols, and the module must still name them
    # (the loader finds torch's symbols in the NEEDED libraries' scope, not the global one)
    link = [args.cxx, "-shared", *sorted(map(str, objs)), f"-L{work / 'stubs'}",
            "-Wl,--no-as-needed", *[f"-l{n[3:-3]}" for n in SONAMES], "-lcudart",
            "-o", str(so)]
    proc = subprocess.run(link, capture_output=True, text=True, env=env, check=False)
    log.write(f"link rc={proc.returncode}\n{shlex.join(link)}\n{proc.stdout}{proc.stderr}\n")
    if proc.returncode != 0:
        print(f"link failed; see {args.out / 'build.log'}", file=sys.stderr)
        return 1
    subprocess.run(["strip", "--strip-unneeded", str(so)], check=True)
    os.replace(so, args.out / so.name)
    shutil.rmtree(work, ignore_errors=True)
    digest = hashlib.sha256((args.out / so.name).read_bytes()).hexdigest()
    summary = (f"built {so.name}: {len(units)} sources, archs {args.archs}, "
               f"{time.monotonic() - t0:.0f} s wall, {cpu_total:.0f} s CPU in the compiles, "
               f"largest compile {rss_max / 1024:.0f} MiB, sha256 {digest}")
    log.write(summary + "\n")
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
