"""frank.assemble.kernel compiles rs8 on the host with its pinned toolchain (no GPU needed).

The toolchain wheels (about 110 MB from PyPI) are fetched once per machine into the
default frank cache and handed to each test's own cache as a mirror folder, so the
download happens once, through the fetcher, and every test still starts from an empty
cache of its own.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from frank.assemble import kernel as kernelbuild
from frank.errors import FrankError
from frank.hashing import sha256_file
from frank.model.catalog import load_manifest
from frank.model.kinds import PART_ADAPTER
from frank.model.kinds.base import PartContext
from frank.model.kinds.engine import PinnedWheel
from frank.model.kinds.kernel import Kernel
from frank.model.tomlio import read_toml
from frank.store.blobs import BlobStore
from frank.store.fetch import Fetcher, Pinned

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "parts" / "rs8" / "1.toml"
LIB = Path("build") / "librs8.so"

needs_cxx = pytest.mark.skipif(shutil.which("g++") is None, reason="no host g++ for nvcc")


def _rs8() -> Kernel:
    part = load_manifest(MANIFEST, ROOT).part
    assert isinstance(part, Kernel)
    return part


@pytest.fixture(scope="module")
def wheels() -> Path:
    """The toolchain wheels in the default store (downloaded the first time only): a
    mirror folder, since the store names its blobs by sha256 as a mirror does."""
    store = BlobStore()
    toolchain = _rs8().toolchain or []
    Fetcher(store).fetch_all([Pinned(str(w.url), w.sha256) for w in toolchain])
    return store.blob_dir


def _fetcher(cache: Path, wheels: Path) -> Fetcher:
    return Fetcher(BlobStore(cache), [wheels])


@pytest.fixture(scope="module")
def built(wheels: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """rs8 compiled twice, into two separate caches."""
    if shutil.which("g++") is None:
        pytest.skip("no host g++ for nvcc")
    caches = tmp_path_factory.mktemp("caches")
    return (kernelbuild.compile_kernel(_rs8(), ROOT, MANIFEST, _fetcher(caches / "a", wheels)),
            kernelbuild.compile_kernel(_rs8(), ROOT, MANIFEST, _fetcher(caches / "b", wheels)))


def _cuobjdump(tree: Path) -> str:
    """CUOBJDUMP if set, else the toolchain's own (the same wheel scripts/setup installs)."""
    if os.environ.get("CUOBJDUMP"):
        return os.environ["CUOBJDUMP"]
    found = sorted(tree.parents[1].glob("toolchains/*/nvidia/*/bin/cuobjdump"))
    assert found, "the toolchain has no cuobjdump"
    return str(found[0])


@pytest.mark.slow
def test_rs8_compiles_for_sm120_and_sm90a(built: tuple[Path, Path]) -> None:
    tree = built[0]
    lib = tree / LIB
    # the plugin package carries the library, so a wheel built from python/ holds it
    assert sha256_file(tree / "python" / "rs8_vllm" / "librs8.so") == sha256_file(lib)
    elfs = subprocess.run([_cuobjdump(tree), "--list-elf", str(lib)], capture_output=True,
                          text=True, check=True).stdout
    assert "sm_120" in elfs and "sm_90a" in elfs, elfs
    # cudart is linked in statically: the host code loads and runs without a GPU
    cdll = ctypes.CDLL(str(lib))
    cdll.rs8_block_keys.restype = ctypes.c_int
    cdll.rs8_block_keys.argtypes = [ctypes.c_int, ctypes.c_int]
    assert cdll.rs8_block_keys(512, 16) > 0 and cdll.rs8_block_keys(512, 2) == 0


@pytest.mark.slow
def test_two_caches_give_byte_identical_libraries(built: tuple[Path, Path]) -> None:
    if kernelbuild.isolation() is None:
        pytest.skip("no mount namespace here: builds see their real paths, which nvcc embeds")
    a, b = built
    assert a != b and a.name == b.name  # separate caches, one key
    assert sha256_file(a / LIB) == sha256_file(b / LIB)


@pytest.mark.slow
def test_second_call_is_a_cache_hit(built: tuple[Path, Path], wheels: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    def no(*args: object, **kwargs: object) -> None:
        raise AssertionError("a cache hit must not fetch, unpack or build")

    monkeypatch.setattr(kernelbuild, "unpack_toolchain", no)
    monkeypatch.setattr(kernelbuild, "_run_build", no)
    fetcher = _fetcher(built[0].parents[1], wheels)
    assert kernelbuild.compile_kernel(_rs8(), ROOT, MANIFEST, fetcher) == built[0]


@pytest.mark.slow
@needs_cxx
def test_broken_source_is_one_line_naming_the_log(tmp_path: Path, wheels: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "kernels" / "rs8", repo / "kernels" / "rs8",
                    ignore=shutil.ignore_patterns("build", "__pycache__", "*.so"))
    cu = repo / "kernels" / "rs8" / "rs8_topk.cu"
    cu.write_text(cu.read_text() + "\nint rs8_broken = ;\n")
    with pytest.raises(FrankError) as caught:
        kernelbuild.compile_kernel(_rs8(), repo, MANIFEST, _fetcher(tmp_path / "cache", wheels))
    err = caught.value
    line = err.one_line()
    assert "\n" not in line and err.field == "build"
    assert "kernels/rs8/rs8_topk.cu(" in line and "error" in line, line  # nvcc's own line
    log = Path(line.rsplit("full log: ", 1)[1])
    assert log.is_file() and "rs8_broken" in log.read_text()
    assert [p for p in log.parent.iterdir() if p.is_dir()] == []  # nothing cached or left


@needs_cxx
def test_toolchain_wheel_with_a_wrong_sha256_is_refused(tmp_path: Path) -> None:
    wrong = "0" * 64
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / wrong).write_bytes(b"not the pinned wheel")
    first = (_rs8().toolchain or [])[0]
    kernel = _rs8().model_copy(update={"toolchain": [
        PinnedWheel(url=first.url, sha256=wrong)]})
    with pytest.raises(FrankError) as caught:
        kernelbuild.compile_kernel(kernel, ROOT, MANIFEST,
                                   Fetcher(BlobStore(tmp_path / "cache"), [mirror]))
    assert caught.value.field == "toolchain" and wrong in caught.value.one_line()
    assert not (tmp_path / "cache" / "toolchains").exists()


@needs_cxx
def test_toolchain_without_nvcc_is_refused(tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    wheel = tmp_path / "empty-1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("empty/__init__.py", "")
    sha = sha256_file(wheel)
    shutil.copy(wheel, mirror / sha)
    kernel = _rs8().model_copy(update={"toolchain": [
        PinnedWheel(url="https://example.invalid/empty-1-py3-none-any.whl", sha256=sha)]})
    with pytest.raises(FrankError) as caught:
        kernelbuild.compile_kernel(kernel, ROOT, MANIFEST,
                                   Fetcher(BlobStore(tmp_path / "cache"), [mirror]))
    assert caught.value.field == "toolchain" and "nvcc" in caught.value.one_line()


def test_lock_inputs_cover_every_toolchain_wheel() -> None:
    rs8 = _rs8()
    inputs = rs8.inputs(PartContext(ROOT, MANIFEST))
    assert rs8.toolchain and all(inputs[str(w.url)] == w.sha256 for w in rs8.toolchain)


def test_candidate_kernel_without_toolchain_is_refused() -> None:
    raw = read_toml(MANIFEST)
    del raw["toolchain"]
    with pytest.raises(ValueError, match="toolchain is required"):
        PART_ADAPTER.validate_python(raw)
