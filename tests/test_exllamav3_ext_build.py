"""exllamav3's extension built ahead of time by builders/exllamav3-ext from pinned inputs.

The whole extension (194 translation units) takes hours on two cores, so CI builds one
small CUDA source (add.cu) the same way, twice, from the pinned inputs bench/
exllamav3_ext_build.py assembles: the module holds sm_120 machine code and no PTX, names
torch's libraries as NEEDED, and two builds are byte-identical (nvcc's ``tmpxft_`` local
symbols stripped). The quick tests hold the builder's source list and arch spelling to
exllamav3's own rules without compiling.
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from frank.audit.cuda import file_reader, read_cuda
from frank.store.blobs import BlobStore
from frank.store.fetch import Fetcher

REPO = Path(__file__).resolve().parents[1]
BUILD = REPO / "builders" / "exllamav3-ext" / "build.py"


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_sources_follow_exllamav3s_cuda_rules(tmp_path: Path) -> None:
    build = _load(BUILD, "exl3_build")
    ext = tmp_path / "exllamav3_ext"
    for rel in ("a.cu", "b.cpp", "h.cuh", "rocm/r.cu", "q/c.cu", "x_hip.cpp", "y.hip",
                "hip_z.cpp"):
        (ext / rel).parent.mkdir(parents=True, exist_ok=True)
        (ext / rel).write_text("")
    names = [p.relative_to(ext).as_posix() for p in build.sources(tmp_path)]
    assert names == ["a.cu", "b.cpp", "q/c.cu"]
    assert build.gencode("12.0") == ["-gencode=arch=compute_120,code=sm_120"]
    assert build.gencode("9.0a") == ["-gencode=arch=compute_90a,code=sm_90a"]
    with pytest.raises(SystemExit, match="PTX is not built"):
        build.gencode("12.0+PTX")


@pytest.mark.slow
def test_one_source_builds_for_sm_120_reproducibly(tmp_path: Path) -> None:
    if shutil.which("g++") is None or shutil.which("dpkg-deb") is None:
        pytest.skip("needs g++ (nvcc's host compiler) and dpkg-deb")
    bench = _load(REPO / "bench" / "exllamav3_ext_build.py", "exl3_bench")
    root = bench.assemble(bench.inputs(), Fetcher(BlobStore()))
    try:
        digests = []
        for out in ("a", "b"):
            cmd = [sys.executable, str(BUILD), "--sources", str(root / "src" / "exllamav3"),
                   "--cuda-home", str(root / "in" / "nvidia" / "cu13"),
                   "--torch-include", str(root / "in" / "torch" / "include"),
                   "--python-include", str(root / "python" / "python3.11"),
                   "--python-include", str(root / "python" / "x86_64-linux-gnu" / "python3.11"),
                   "--ext-suffix", ".cpython-311-x86_64-linux-gnu.so", "--archs", "12.0",
                   "--out", str(tmp_path / out), "--jobs", "1", "--only", "add.cu"]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            assert proc.returncode == 0, (proc.stderr, (tmp_path / out / "build.log")
                                          .read_text()[-3000:])
            so = tmp_path / out / "exllamav3_ext.cpython-311-x86_64-linux-gnu.so"
            digests.append(hashlib.sha256(so.read_bytes()).hexdigest())
        code = read_cuda(*file_reader(so))
        assert code is not None and code.sass == {"sm_120"} and not code.ptx
        needed = subprocess.run(["readelf", "-d", str(so)], capture_output=True, text=True,
                                check=True).stdout
        for lib in ("libc10.so", "libtorch_python.so", "libcudart.so.13"):
            assert f"[{lib}]" in needed
        assert "tmpxft" not in subprocess.run(["nm", "-a", str(so)], capture_output=True,
                                              text=True, check=False).stdout
        assert digests[0] == digests[1]
        # a source the wheel does not have is refused, naming it
        bad = subprocess.run([*cmd[:-1], "no_such.cu"], capture_output=True, text=True,
                             check=False)
        assert bad.returncode != 0 and "no_such.cu" in bad.stderr
    finally:
        shutil.rmtree(root, ignore_errors=True)
