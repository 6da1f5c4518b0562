"""Served's own target facts (parts/vllm-base, parts/exl3-runtime, through stacks/served.lock)
held to a layer that lays out the files served's image holds: today's served fails on the
sparse-MLA decode, FlashInfer's sampling module, the EXL3 extension and the compiler; the
same facts pass once the image carries FlashInfer 0.6.14's SM120 modules built ahead of
time, a compiled exllamav3_ext and gcc/g++. The files are small ELF files with the archs
the real ones have (tests/elf_helpers.py); the layer is a real tar read by the audit's own
reader. The full served image's report is in bench/results/ (it is 9.7 GB: not built in CI).
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from frank.audit.layers import merge, read_layer
from frank.audit.target import TargetAudit
from frank.model.archs import parse_arch
from frank.resolve.lock import read_lock
from tests.elf_helpers import (
    DYNSYM,
    FAMILY,
    PROGBITS,
    SHF_ALLOC,
    STRTAB,
    Section,
    container,
    dynsym,
    elf,
    entry,
)

ROOT = Path(__file__).resolve().parents[1]
SITE = "usr/local/lib/python3.11/dist-packages"
ARCH_A = 0x100000
TRTLLM = "flashinfer_cubin/cubins/158f6fa11ef139a098cfddcdddce73ca99d164ad/fmha/trtllm-gen"
TOKENSPEED = '''class TokenspeedMLAPrefillBackend:
    @classmethod
    def supports_compute_capability(cls, device_capability: "DeviceCapability") -> bool:
        return device_capability.major == 10
'''


def _lib(*archs: tuple[int, int]) -> bytes:
    return elf([Section(".nv_fatbin", PROGBITS, SHF_ALLOC,
                        container(*(entry(a, flags=f) for a, f in archs)))])


EXT = "exllamav3_ext.cpython-311-x86_64-linux-gnu.so"


def _ext(symbol: str, *archs: tuple[int, int]) -> bytes:
    """An extension module: device code for ``archs`` and ``symbol`` exported."""
    table, strings = dynsym([symbol])
    return elf([Section(".nv_fatbin", PROGBITS, SHF_ALLOC,
                        container(*(entry(a, flags=f) for a, f in archs))),
                Section(".dynstr", STRTAB, SHF_ALLOC, strings),
                Section(".dynsym", DYNSYM, SHF_ALLOC, table, link=2, entsize=24)])


def _served_files(fixed: bool, ext: tuple[str, bytes] | None = None
                  ) -> dict[str, tuple[bytes, int]]:
    sm90a, sm100f, sm120f = (90, ARCH_A), (100, FAMILY), (120, FAMILY)
    files = {
        "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so": _lib(sm90a),
        "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": _lib((80, 0)),
        "vllm/_flashmla_C.abi3.so": _lib(sm90a, sm100f),
        "vllm/_flashmla_extension_C.abi3.so": _lib(sm90a, sm100f),
        "vllm/_qutlass_C.abi3.so": _lib(sm100f),
        "vllm/_C_stable_libtorch.abi3.so": _lib(sm90a, sm120f),
        "tokenspeed_mla/objs/cute_dsl_fmha_hd192_sm_100a_x86_64.so": _lib((100, ARCH_A)),
        "tokenspeed_mla/objs/cute_dsl_fmha_hd192_sm_103a_x86_64.so": _lib((103, ARCH_A)),
        "nvidia/cu13/lib/libcufftw.so.12": _lib((75, 0)),
        "nvidia/cu13/bin/nvcc": b"#!/bin/sh\n",
        "vllm/v1/attention/backends/mla/prefill/tokenspeed_mla.py": TOKENSPEED.encode(),
    }
    if not fixed:
        files[f"{TRTLLM}/fmha_sm100a.cubin"] = _lib((100, ARCH_A))
    else:
        for name in ("sparse_mla_sm120", "sampling"):
            files[f"flashinfer/data/aot/{name}/{name}.so"] = _lib(sm120f)
        name, data = ext or (EXT, _ext("PyInit_exllamav3_ext", sm120f))
        if name:
            files[name] = data
    out = {f"{SITE}/{k}": (v, 0o755) for k, v in files.items()}
    if fixed:
        out["usr/bin/gcc-12"] = (b"\x7fELF", 0o755)
        out["usr/bin/g++-12"] = (b"\x7fELF", 0o755)
        out["usr/include/python3.11/Python.h"] = (b"/* */\n", 0o644)
    return out


def _layer(tmp: Path, files: dict[str, tuple[bytes, int]], links: dict[str, str]) -> Path:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, (data, mode) in sorted(files.items()):
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
        for path, target in sorted(links.items()):
            info = tarfile.TarInfo(path)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    blob = tmp / "layer.tar"
    blob.write_bytes(buf.getvalue())
    return blob


def _audit(tmp: Path, fixed: bool, flashinfer: str,  # type: ignore[no-untyped-def]
           ext: tuple[str, bytes] | None = None):
    lock = read_lock(ROOT / "stacks" / "served.lock")
    links = {"usr/bin/gcc": "gcc-12", "usr/bin/g++": "g++-12"} if fixed else {}
    view = merge([read_layer(0, _layer(tmp, _served_files(fixed, ext), links))])
    files = [(p, e.cuda) for p, (_, e) in view.visible.items() if e.cuda is not None]
    versions = {"flashinfer-python": flashinfer, "vllm": "0.24.0"}
    return TargetAudit(view, lock, SITE, versions, parse_arch("sm_120"), files, {},
                       "/usr/local/bin:/usr/bin:/bin").run()


def test_todays_served_fails_on_the_sparse_mla_decode(tmp_path: Path) -> None:
    report, diffs, unused = _audit(tmp_path, fixed=False, flashinfer="0.6.12")
    paths = [d for d in diffs if d.check.startswith("engine path:")]
    assert paths[0].part == "vllm-base"
    assert paths[0].check.startswith(
        "engine path: attention (sparse MLA decode and prefill) via "
        "FLASHINFER_MLA_SPARSE_SM120 (DeepseekV4FlashInferSM120Attention): trtllm-gen FMHA "
        "launcher (flashinfer module fmha_gen")
    cubins = next(k for k in report.path if k.what == "trtllm-gen FMHA kernels")
    assert not cubins.ok and cubins.evidence == "0 of 1 cubins run on sm_120; archs sm_100a"
    assert {k.ref for k in report.path if not k.ok} == {
        "flashinfer module fmha_gen", f"cubins {TRTLLM}", "flashinfer module sampling",
        "exllamav3_ext*.so"}
    tools = {(t.part, t.tool): t for t in report.tools}
    assert not tools[("vllm-base", "gcc")].ok and not tools[("vllm-base", "g++")].ok
    assert tools[("vllm-base", "nvcc")].ok  # the closure's nvcc, under CUDA_HOME's bin
    assert report.first_start.flashinfer_jit == ["fmha_gen", "sampling"]
    assert report.first_start.tool_builds == ["exllamav3_ext*.so"]
    # the declared-unused libraries are all there; the pure rule says no for 12.x
    assert not any(d.check == "declared unused library not in the image" for d in diffs)
    tokenspeed = next(u for u in report.unused if u.path.startswith("tokenspeed_mla"))
    assert tokenspeed.evaluated is False and len(tokenspeed.files) == 2
    assert f"/{SITE}/vllm/_qutlass_C.abi3.so" in unused


def test_served_with_the_sm120_kernels_and_a_compiler_passes(tmp_path: Path) -> None:
    report, diffs, _ = _audit(tmp_path, fixed=True, flashinfer="0.6.14")
    assert diffs == []
    assert all(k.ok for k in report.path) and all(t.ok for t in report.tools)
    assert {k.ref for k in report.path} >= {"flashinfer module sparse_mla_sm120",
                                            "flashinfer module sampling"}
    gcc = next(t for t in report.tools if t.tool == "gcc")
    assert gcc.found == "/usr/bin/gcc-12"
    assert report.first_start.flashinfer_jit == [] and report.first_start.tool_builds == []


def test_a_rule_the_engine_contradicts_is_named(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The image's own tokenspeed rule, edited to select 12.x, fails the declaration."""
    import tests.test_audit_target_served as me

    monkeypatch.setattr(me, "TOKENSPEED", TOKENSPEED.replace("== 10", "in (10, 12)"))
    _, diffs, _ = _audit(tmp_path, fixed=True, flashinfer="0.6.14")
    assert [d.check for d in diffs] == ["declared unused, but the engine's rule selects it"]


SM120F = (120, FAMILY)


@pytest.mark.parametrize(("name", "data", "why"), [
    ("", b"", "no ninja"),  # served without exl3-ext: nothing stands in for the build
    (EXT, _lib(SM120F), "defines no PyInit_exllamav3_ext"),  # a CUDA library, renamed
    (EXT, _ext("PyInit_other", SM120F), "defines no PyInit_exllamav3_ext"),
    (EXT, _ext("PyInit_exllamav3_ext", (90, ARCH_A)), "is not built for sm_120"),
    ("exllamav3_ext.cpython-312-x86_64-linux-gnu.so", _ext("PyInit_exllamav3_ext", SM120F),
     "imports no .cpython-312-x86_64-linux-gnu.so"),  # another Python's build
])
def test_only_the_real_module_stands_in_for_exllamav3s_build(
        tmp_path: Path, name: str, data: bytes, why: str) -> None:
    """Everything else of served fixed (nvcc and g++ are in the image): exllamav3's build
    at first import needs ninja, unless the top of site-packages holds an exllamav3_ext this
    Python imports, with PyInit_exllamav3_ext and sm_120 code; a file that only matches the
    glob is refused by the tool's verdict and the engine path's, the reason named."""
    report, diffs, _ = _audit(tmp_path, fixed=True, flashinfer="0.6.14", ext=(name, data))
    assert {d.part for d in diffs} == {"exl3-runtime"}
    tools = [d for d in diffs if d.check.startswith("run-time tool missing")]
    assert [d.check.split(" calls ")[1].split(" ")[0] for d in tools] == ["ninja"]
    assert why in tools[0].image, tools[0].image
    kernel = next(k for k in report.path if k.backend == "exllamav3_ext")
    assert not kernel.ok
    assert report.first_start.tool_builds == ["exllamav3_ext*.so"]
    if "PyInit" in why:
        assert why in kernel.evidence, kernel.evidence
