"""exllamav3's extension built ahead of time by builders/exllamav3-ext from pinned inputs.

The whole extension (194 translation units) takes about an hour on two cores, so CI builds
one small CUDA source (add.cu) the same way (frank.assemble.extension with ``only``, from the
inputs parts/exl3-ext pins), twice: the module holds sm_120 machine code and no PTX, names
torch's libraries as NEEDED, is kept by key, and two builds are byte-identical (nvcc's
``tmpxft_`` local symbols stripped). The quick tests hold the builder's source list and
arch spelling to exllamav3's own rules without compiling.
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
def test_one_source_builds_for_sm_120_reproducibly(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``--only`` path of frank.assemble.extension (what bench/exllamav3_ext_build.py and a
    compose of exl3-ext run), from parts/exl3-ext's pinned inputs in the test store: built
    once, kept by key (the second call builds nothing), built again from scratch to the
    same bytes; a source the wheel lacks fails naming it and the log."""
    if shutil.which("g++") is None or shutil.which("dpkg-deb") is None:
        pytest.skip("needs g++ (nvcc's host compiler) and dpkg-deb")
    from frank.assemble import extension
    from frank.errors import FrankError

    # a fixed root of this test's own: never the one a real build may be using
    monkeypatch.setattr(extension, "ROOT", tmp_path / "fixed")
    part = _load(REPO / "bench" / "exllamav3_ext_build.py", "exl3_bench").part()
    fetcher = Fetcher(BlobStore())

    def build(only: str) -> extension.Built:
        return extension.build_extension(part, REPO, fetcher, only=[only], jobs=1)

    first = build("add.cu")
    so = first.module
    assert so.name == "exllamav3_ext.cpython-311-x86_64-linux-gnu.so"
    digest = hashlib.sha256(so.read_bytes()).hexdigest()
    assert first.result["sha256"] == digest and first.result["sources"] == 1
    kept = (so.stat().st_mtime_ns, first.result["date"])
    again = build("add.cu")  # the same key: kept, nothing built or unpacked
    assert again.folder == first.folder and not (tmp_path / "fixed").exists()
    assert (again.module.stat().st_mtime_ns, again.result["date"]) == kept
    code = read_cuda(*file_reader(so))
    assert code is not None and code.sass == {"sm_120"} and not code.ptx
    needed = subprocess.run(["readelf", "-d", str(so)], capture_output=True, text=True,
                            check=True).stdout
    for lib in ("libc10.so", "libtorch_python.so", "libcudart.so.13"):
        assert f"[{lib}]" in needed
    assert "tmpxft" not in subprocess.run(["nm", "-a", str(so)], capture_output=True,
                                          text=True, check=False).stdout
    shutil.rmtree(first.folder)  # from scratch: the same bytes
    assert build("add.cu").result["sha256"] == digest
    # a source the wheel does not have is refused, naming it and the kept log
    with pytest.raises(FrankError) as err:
        build("no_such.cu")
    assert "no_such.cu" in str(err.value) and "full log: " in str(err.value)
