"""The served base carries the compilers the engine calls at run time, and served's closure
holds one CUDA release.

Triton 3.6 builds its launcher modules from C at first use (``gcc <src>.c -O3 -shared -fPIC
-I<python include> ...``, triton/runtime/build.py) and TileLang compiles with nvcc, which
calls g++: images/bookworm-python-cc.toml pins gcc, g++, libc6-dev and libpython3.11-dev.
The slow test builds that base from its lock and, in a chroot of its layer, compiles a
Python extension the way Triton does and a C++ file the way nvcc's host pass does.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from frank.assemble.base import resolve_base
from frank.errors import FrankError
from frank.image.oci import read_layout
from frank.model.imagefile import load_image_file
from frank.store.blobs import BlobStore

REPO = Path(__file__).resolve().parents[1]
CC_BASE = REPO / "images" / "bookworm-python-cc.toml"
# The one CUDA release the served closure and the kernel builds use (BUILD-FACTS 2026-12-07).
CUDA_13_0 = {"nvidia-cuda-nvcc": "13.0.88", "nvidia-cuda-crt": "13.0.88",
             "nvidia-nvvm": "13.0.88", "nvidia-cuda-cccl": "13.0.85",
             "nvidia-cuda-runtime": "13.0.96"}

# What Triton's driver.c needs of the C toolchain: the C library's headers, dlopen and
# Python's C API, built as a shared module and imported by the image's python3.
TRITON_LIKE_C = r"""
#include <dlfcn.h>
#include <stdbool.h>
#include <stdlib.h>
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *probe(PyObject *self, PyObject *args) {
  void *h = dlopen("libc.so.6", RTLD_LAZY);
  bool ok = h != NULL;
  if (h) dlclose(h);
  return PyLong_FromLong(ok ? 42 : -1);
}
static PyMethodDef methods[] = {{"probe", probe, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "cc_probe", NULL, -1, methods};
PyMODINIT_FUNC PyInit_cc_probe(void) { return PyModule_Create(&mod); }
"""
HOST_CXX = "#include <vector>\n#include <cstdio>\nint main() { std::vector<int> v{1, 2};" \
           " std::printf(\"%d\\n\", v[0] + v[1]); }\n"


def test_served_uses_the_cc_base_and_it_pins_the_compilers() -> None:
    served = tomllib.loads((REPO / "stacks" / "served.toml").read_text())
    assert served["image"]["base"] == "bookworm-python-cc"
    img = load_image_file(CC_BASE)
    assert img.debs is not None
    locked = {p["name"]: p["version"] for p in
              json.loads(CC_BASE.with_suffix(".debs.lock").read_text())["packages"]}
    for name in ("gcc-12", "g++-12", "libc6-dev", "libpython3.11-dev", "binutils"):
        assert name in locked, name
    # the headers are for the interpreter the base runs
    assert locked["libpython3.11-dev"] == locked["python3.11"]


def test_served_closure_is_one_cuda_release() -> None:
    """The compilers the engine calls at run time (nvcc, crt, nvvm, cccl) are the release of
    its cudart, not the 13.2/13.5 mix the closure resolved to before the override."""
    pylock = tomllib.loads((REPO / "stacks" / "pylock.served.toml").read_text())
    got = {p["name"]: p["version"] for p in pylock["packages"] if p["name"] in CUDA_13_0}
    assert got == CUDA_13_0


def _chroot_prefix() -> list[str] | None:
    chroot, unshare = shutil.which("chroot"), shutil.which("unshare")
    if chroot is None:
        return None
    if os.geteuid() == 0:
        return [chroot]
    if unshare is None:
        return None
    return [unshare, "--user", "--map-root-user", chroot]


@pytest.mark.slow
def test_cc_base_compiles_a_python_extension_and_cxx(tmp_path: Path) -> None:
    prefix = _chroot_prefix()
    if prefix is None:
        pytest.skip("no chroot here (needs root or user namespaces)")
    try:
        base = resolve_base(CC_BASE, BlobStore(tmp_path / "cache"), quiet=True)
    except FrankError as exc:
        if "cannot fetch" in str(exc):
            pytest.skip(f"Debian archive not reachable: {exc}")
        raise
    root = tmp_path / "root"
    root.mkdir()
    layer = read_layout(base.layout).layers[0]
    blob = base.layout / "blobs" / "sha256" / layer.digest[7:]
    subprocess.run(["tar", "-xpf", str(blob), "-C", str(root), "--numeric-owner"], check=True)
    (root / "tmp").mkdir(exist_ok=True)
    (root / "tmp" / "cc_probe.c").write_text(TRITON_LIKE_C)
    (root / "tmp" / "host.cc").write_text(HOST_CXX)

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C"}
        return subprocess.run([*prefix, str(root), *argv], capture_output=True, text=True,
                              env=env, check=False)

    # Triton's command line (triton/runtime/build.py), with the include folder it asks
    # sysconfig for (Debian's posix_local scheme is taken as posix_prefix)
    inc = run("python3", "-c", "import sysconfig; print(sysconfig.get_paths("
              "scheme='posix_prefix')['include'])")
    assert inc.returncode == 0, inc.stderr
    suffix = run("python3", "-c", "import sysconfig; print(sysconfig.get_config_var"
                 "('EXT_SUFFIX'))").stdout.strip()
    cc = run("gcc", "/tmp/cc_probe.c", "-O3", "-shared", "-fPIC", "-Wno-psabi", "-o",
             f"/tmp/cc_probe{suffix}", f"-I{inc.stdout.strip()}")
    assert cc.returncode == 0, cc.stderr
    imp = run("python3", "-c", "import sys; sys.path.insert(0, '/tmp'); import cc_probe; "
              "print(cc_probe.probe())")
    assert imp.stdout == "42\n", imp.stderr
    cxx = run("g++", "-std=c++17", "-O2", "-o", "/tmp/host", "/tmp/host.cc")
    assert cxx.returncode == 0, cxx.stderr
    assert run("/tmp/host").stdout == "3\n"
    # a file that is not C fails with the compiler's own words (the check can fail)
    (root / "tmp" / "bad.c").write_text("#include <no_such_header.h>\n")
    bad = run("gcc", "-c", "/tmp/bad.c", "-o", "/tmp/bad.o")
    assert bad.returncode != 0 and "no_such_header.h" in bad.stderr
