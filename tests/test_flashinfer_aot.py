"""Issue 52: FlashInfer modules built ahead of time by frank (an ``aot`` part), and one CUDA
release per kernel build, checked when the stack is locked.

The slow tests build ONE small module (``silu_and_mul`` for 12.0f, about 10 s of nvcc plus
unpacking the pinned wheels) into two empty caches, from the wheels parts/flashinfer-aot/1
pins (fetched once into the test store, then handed to each cache as a mirror folder), and
check the file holds sm_120 code and is byte-identical in both. The served set is built by
bench/flashinfer_aot_bench.py, not here.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from frank.assemble import aot as aotbuild
from frank.assemble import kernel as kernelbuild
from frank.errors import FrankError
from frank.hashing import sha256_file
from frank.model.cuda import check_one_release
from frank.model.kinds import PART_ADAPTER
from frank.model.kinds.aot import Aot
from frank.store.blobs import BlobStore
from frank.store.fetch import Fetcher, Pinned
from tests.spine_helpers import frank

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "parts" / "flashinfer-aot" / "1.toml"
SMALL = "builders/flashinfer-aot/gpu-proof.toml"

# the served closure's compiler wheels before this issue (stacks/pylock.served.toml)
SERVED_MIX = [
    "nvidia_cuda_nvcc-13.2.86-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
    "nvidia_cuda_crt-13.5.37-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
    "nvidia_nvvm-13.2.86-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
    "nvidia_cuda_runtime-13.0.96-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
]
CUOBJDUMP = Pinned(
    "https://files.pythonhosted.org/packages/64/46/cfeb5d8aa044ff448484f6cdf5c0b829a764071f01"
    "114717e787b7298a24/nvidia_cuda_cuobjdump-13.2.78-py3-none-manylinux2014_x86_64."
    "manylinux_2_17_x86_64.whl",
    "394087411405b846bf43aa52ca2ff603bbe18b3b8a1257cda0903e23c17bdbf3")


def _part(**changes: object) -> Aot:
    raw = tomllib.loads(MANIFEST.read_text())
    raw.update(changes)
    part = PART_ADAPTER.validate_python(raw)
    assert isinstance(part, Aot)
    return part


# -- one CUDA release ----------------------------------------------------------------------

def test_the_served_mix_is_refused_naming_the_odd_package() -> None:
    with pytest.raises(FrankError) as err:
        check_one_release(SERVED_MIX, file=MANIFEST, field="toolchain")
    assert "nvidia-cuda-crt 13.5.37 is CUDA 13.5, but nvidia-cuda-nvcc 13.2.86 is CUDA 13.2" \
        in str(err.value)
    # one release passes; headers-only libraries and cuobjdump follow their own numbering
    ok = [n.replace("13.5.37", "13.2.86").replace("13.0.96", "13.2.75") for n in SERVED_MIX]
    assert check_one_release([*ok, "nvidia_cublas-13.1.0.3-py3-none-any.whl",
                              "nvidia_cuda_cuobjdump-13.0.85-py3-none-any.whl"],
                             file=MANIFEST, field="toolchain") == "13.2"


def test_lock_refuses_a_mixed_toolchain_in_one_line(repo: Path) -> None:
    """The served mix put into the aot part: `frank lock` (offline: the toolchain is no
    part of the Python closure) exits 2 naming the manifest, the field and the package."""
    manifest = repo / "parts/flashinfer-aot/1.toml"
    text = manifest.read_text()
    assert "nvidia_cuda_crt-13.0.88" in text
    manifest.write_text(text.replace("nvidia_cuda_crt-13.0.88", "nvidia_cuda_crt-13.5.37"))
    before = (repo / "stacks/served.lock").read_bytes()
    out = frank("lock", "served", cwd=repo)
    assert out.code == 2, out.err
    assert out.err.strip() == (
        "frank: error: parts/flashinfer-aot/1.toml: toolchain: nvidia-cuda-crt 13.5.37 is "
        "CUDA 13.5, but nvidia-cuda-nvcc 13.0.88 is CUDA 13.0: a kernel build's compiler "
        "wheels must be one CUDA release")
    assert (repo / "stacks/served.lock").read_bytes() == before


def test_a_kernel_part_is_held_to_one_release_too(repo: Path) -> None:
    manifest = repo / "parts/rs8/1.toml"
    manifest.write_text(manifest.read_text().replace("nvidia_nvvm-13.0.88", "nvidia_nvvm-13.2.86"))
    out = frank("lock", "candidate", cwd=repo)
    assert out.code == 2 and len(out.err.strip().splitlines()) == 1, out.err
    assert "parts/rs8/1.toml: toolchain: nvidia-nvvm 13.2.86 is CUDA 13.2" in out.err


# -- bad input -------------------------------------------------------------------------------

@pytest.mark.parametrize(("modules", "why"), [
    ('[[module]]\nname = "norm"\ngenerator = "flashinfer.jit.norm:gen_norm_module"\n'
     '[[module]]\nname = "norm"\ngenerator = "flashinfer.jit.norm:gen_norm_module"\n',
     "module 'norm' is listed twice"),
    ('[[module]]\nname = "../x"\ngenerator = "flashinfer.jit.norm:gen_norm_module"\n',
     "module[0].name '../x' is not a module name (letters, digits, '_')"),
    ('[[module]]\nname = "norm"\ngenerator = "os.system"\n',
     "module[0].generator 'os.system' is not 'package.module:function'"),
    ('[[module]]\nname = "norm"\n', "module[0].generator: Field required"),
    ("", "no [[module]] to build"),
])
def test_a_bad_module_list_is_one_line(repo: Path, modules: str, why: str) -> None:
    (repo / "builders/flashinfer-aot/served.toml").write_text(modules)
    out = frank("lock", "served", cwd=repo)
    assert out.code == 2, out.err
    assert out.err.strip().splitlines() == [
        f"frank: error: parts/flashinfer-aot/1.toml: modules: "
        f"builders/flashinfer-aot/served.toml: {why}"]


def test_an_unknown_field_is_refused(repo: Path) -> None:
    manifest = repo / "parts/flashinfer-aot/1.toml"
    manifest.write_text(manifest.read_text().replace('dest = "flashinfer/data/aot"',
                                                     'dest = "flashinfer/data/aot"\njobs = 4'))
    out = frank("lock", "served", cwd=repo)
    assert out.code == 2 and "jobs" in out.err and len(out.err.strip().splitlines()) == 1


def test_the_keys_are_per_module() -> None:
    """A module's key covers its own entry, not the list around it: adding a module to the
    input rebuilds nothing already built; the archs are part of every key."""
    part = _part(modules=SMALL)
    mods, keys = aotbuild.module_keys(part, ROOT, MANIFEST, isolated=True)
    assert [m.name for m in mods] == ["norm", "silu_and_mul"] and len(set(keys.values())) == 2
    _, served = aotbuild.module_keys(_part(), ROOT, MANIFEST, isolated=True)
    assert set(served) == {"sparse_mla_sm120", "sampling"}
    _, other_arch = aotbuild.module_keys(_part(modules=SMALL, archs=["9.0a", "12.0f"]), ROOT,
                                         MANIFEST, isolated=True)
    assert other_arch["norm"] != keys["norm"]


# -- one small module, built twice --------------------------------------------------------

@pytest.fixture(scope="module")
def wheels() -> Path:
    """The part's wheels in the test store (fetched the first time only): a mirror folder."""
    store = BlobStore()
    Fetcher(store).fetch_all([p for _, p in aotbuild._pins(_part())] + [CUOBJDUMP])
    return store.blob_dir


@pytest.fixture(scope="module")
def small(repo_dir: Path) -> Aot:
    # served's pin is of served's modules: this part builds one other module
    return _part(modules="builders/flashinfer-aot/ci.toml", output_sha256=None)


@pytest.fixture(scope="module")
def repo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repo's builder folder with an input of one module (silu_and_mul)."""
    root = tmp_path_factory.mktemp("aot-repo")
    shutil.copytree(ROOT / "builders", root / "builders")
    (root / "builders/flashinfer-aot/ci.toml").write_text(
        '[[module]]\nname = "silu_and_mul"\n'
        'generator = "flashinfer.jit.activation:gen_act_and_mul_module"\nargs = ["silu"]\n')
    return root


@pytest.fixture(scope="module")
def built(wheels: Path, small: Aot, repo_dir: Path,
          tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    if shutil.which("g++") is None:
        pytest.skip("no host g++ for nvcc")
    caches = tmp_path_factory.mktemp("caches")
    a = aotbuild.build_modules(small, repo_dir, MANIFEST,
                               Fetcher(BlobStore(caches / "a"), [wheels]))
    b = aotbuild.build_modules(small, repo_dir, MANIFEST,
                               Fetcher(BlobStore(caches / "b"), [wheels]))
    return a["silu_and_mul"], b["silu_and_mul"], caches


@pytest.mark.slow
def test_silu_and_mul_holds_sm120_code(built: tuple[Path, Path, Path], wheels: Path,
                                       tmp_path: Path) -> None:
    so = built[0]
    assert so.name == "silu_and_mul.so"
    kernelbuild._unzip(wheels / CUOBJDUMP.sha256, tmp_path, CUOBJDUMP.url, MANIFEST)
    cuobjdump = next(tmp_path.glob("nvidia/*/bin/cuobjdump"))
    elfs = subprocess.run([str(cuobjdump), "--list-elf", str(so)], capture_output=True,
                          text=True, check=True).stdout
    assert "sm_120" in elfs and "sm_90" not in elfs, elfs
    # stripped: no nvcc temp-file names left in the symbol table
    assert b"tmpxft_" not in so.read_bytes()
    needed = subprocess.run(["readelf", "-d", str(so)], capture_output=True, text=True,
                            check=True).stdout
    assert "libcudart.so.13" in needed and "libcuda.so]" not in needed


@pytest.mark.slow
def test_two_empty_caches_give_one_file(built: tuple[Path, Path, Path]) -> None:
    if kernelbuild.isolation() is None:
        pytest.skip("no mount namespace here: builds see their real paths, which nvcc embeds")
    a, b, _ = built
    assert a != b and a.parent.name == b.parent.name  # two caches, one key
    assert sha256_file(a) == sha256_file(b)


@pytest.mark.slow
def test_unchanged_builds_nothing(built: tuple[Path, Path, Path], small: Aot, repo_dir: Path,
                                  wheels: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    caches = built[2]
    runs = (caches / "a" / "aot" / "runs.jsonl").read_text().splitlines()
    assert [json.loads(r)["built"].keys() for r in runs] == [{"silu_and_mul": 0}.keys()]

    def no(*args: object, **kwargs: object) -> None:
        raise AssertionError("a kept module must not be fetched, unpacked or built")

    monkeypatch.setattr(aotbuild, "unpack", no)
    monkeypatch.setattr(aotbuild, "_run_build", no)
    again = aotbuild.build_modules(small, repo_dir, MANIFEST,
                                   Fetcher(BlobStore(caches / "a"), [wheels]))
    assert again["silu_and_mul"] == built[0]
    assert len((caches / "a" / "aot" / "runs.jsonl").read_text().splitlines()) == 1


@pytest.mark.slow
def test_release_takes_the_built_module_by_its_pin_and_refuses_it_forged(
        built: tuple[Path, Path, Path], small: Aot, repo_dir: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Output pins (tests/test_output_pins.py) on a module nvcc made: a release build takes
    it by the lock's output_sha256 without unpacking or running the toolchain; with one bit
    of its machine code flipped it is a finding and built again."""
    from frank.audit.release import scratch_cache
    from frank.resolve.lock import read_lock

    cache = tmp_path / "cache"  # the module nvcc built, in a cache of this test's own
    shutil.copytree(built[2] / "a" / "aot", cache / "aot")
    pin = aotbuild.output_digest({"silu_and_mul": built[0]}, sha256_file)
    served = read_lock(ROOT / "stacks" / "served.lock")
    locked = next(p for p in served.parts if p.kind == "aot")
    spec = {**locked.spec, "modules": small.modules, "output_sha256": pin}
    lock = served.model_copy(update={"parts": [locked.model_copy(update={"spec": spec})]})
    part = Aot.model_validate(spec)
    monkeypatch.setenv("FRANK_CACHE", str(cache))

    def no(*args: object, **kwargs: object) -> None:
        raise AssertionError("the toolchain was unpacked or run")

    monkeypatch.setattr(aotbuild, "unpack", no)
    monkeypatch.setattr(aotbuild, "_run_build", no)
    with scratch_cache(lock, repo_dir) as release:
        assert release.taken == ["flashinfer-aot"] and release.kept == []
        got = aotbuild.build_modules(part, repo_dir, MANIFEST, Fetcher(BlobStore()))
        assert got["silu_and_mul"].is_relative_to(release.scratch)
        assert sha256_file(got["silu_and_mul"]) == sha256_file(built[0])
    kept = cache / "aot" / built[0].parent.name / "silu_and_mul.so"
    data = bytearray(kept.read_bytes())
    data[len(data) // 2] ^= 1
    kept.write_bytes(bytes(data))
    with scratch_cache(lock, repo_dir) as release:
        assert release.taken == []
        assert [f.what for f in release.kept] == ["kept output of flashinfer-aot"]
        with pytest.raises(AssertionError, match="toolchain was unpacked"):
            aotbuild.build_modules(part, repo_dir, MANIFEST, Fetcher(BlobStore()))
    assert not kept.exists()  # moved to quarantine/: the next compose builds it again
