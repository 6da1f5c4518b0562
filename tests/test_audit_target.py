"""`frank audit --require-target`: the image held to what the engine runs on its target.

Device code found wherever an ELF keeps it (cuFFT hides its sm_120 kernels in ``.ldata``);
libraries without code for the target pass only when a part declares them unused there;
the engine's declared path to its kernels, the tools it calls at run time, the dead device
bytes and what compiles at first start, each reported with its evidence and failing where
the image cannot run it. The ELF files are made byte by byte (tests/elf_helpers.py), the
cuFFT one is NVIDIA's own wheel, pinned by the served lock.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import zipfile
from pathlib import Path

import pytest

from frank.audit.cuda import has_symbol, list_with_cuobjdump, read_cuda
from frank.audit.purerule import NotPure, evaluate
from frank.model.targets import KernelRef, TargetFacts
from tests.elf_helpers import (
    COMPRESSED,
    DYNSYM,
    FAMILY,
    MAGIC,
    PROGBITS,
    SHF_ALLOC,
    SHF_EXECINSTR,
    SHF_WRITE,
    STRTAB,
    Section,
    container,
    dynsym,
    elf,
    entry,
)
from tests.spine_helpers import copy_repo, frank

CUOBJDUMP = os.environ.get("CUOBJDUMP", "")


def _read(data: bytes):  # type: ignore[no-untyped-def]
    return read_cuda(lambda o, n: data[o:o + n], len(data))


def _hidden_lib(symbol: str = "probe_launch") -> bytes:
    """sm_75 in .nv_fatbin, a compressed sm_120f cubin and sm_80 PTX hidden in .data, an
    sm_90 container in .text (host code: never device code), a stray magic in .data."""
    table, strings = dynsym([symbol])
    return elf([
        Section(".text", PROGBITS, SHF_ALLOC | SHF_EXECINSTR,
                b"\x90" * 64 + container(entry(90))),
        Section(".nv_fatbin", PROGBITS, SHF_ALLOC, container(entry(75))),
        Section(".data", PROGBITS, SHF_ALLOC | SHF_WRITE,
                bytes(100) + container(entry(120, flags=COMPRESSED | FAMILY,
                                             payload=os.urandom(200)),
                                       entry(80, ptx=True))
                + b"junk" + struct.pack("<I", MAGIC) + bytes(80)),
        Section(".dynstr", STRTAB, SHF_ALLOC, strings),
        Section(".dynsym", DYNSYM, SHF_ALLOC, table, link=4, entsize=24),
    ])


def test_a_container_hidden_in_data_is_found_with_its_compressed_entry() -> None:
    code = _read(_hidden_lib())
    assert code is not None
    assert code.sass == {"sm_75", "sm_120f"} and code.ptx == {"sm_80"}
    assert code.hidden == 2  # the two .data entries; .text's container is host code
    assert ("sass", "sm_120f", 200) in code.sizes
    # only .nv_fatbin (what the reader saw before): sm_75 alone, nothing for sm_120
    plain = elf([Section(".nv_fatbin", PROGBITS, SHF_ALLOC, container(entry(75)))])
    assert _read(plain).sass == {"sm_75"}  # type: ignore[union-attr]


def test_a_magic_without_a_container_behind_it_is_no_device_code() -> None:
    junk = struct.pack("<IHHQ", MAGIC, 1, 16, 10 ** 9) + bytes(200)  # body past the end
    assert _read(elf([Section(".data", PROGBITS, SHF_ALLOC | SHF_WRITE, junk)])) is None
    assert _read(elf([Section(".ldata", PROGBITS, SHF_ALLOC | SHF_WRITE,
                              bytes(64) + container(entry(120)))])).sass == {"sm_120"}  # type: ignore[union-attr]


def test_a_defined_dynamic_symbol_is_found() -> None:
    data = _hidden_lib("probe_launch")
    read = lambda o, n: data[o:o + n]  # noqa: E731
    assert has_symbol(read, len(data), "probe_launch")
    assert not has_symbol(read, len(data), "probe")
    assert not has_symbol(read, len(data), "missing_symbol")


@pytest.mark.slow
def test_cufft_keeps_its_sm_120_kernels_outside_nv_fatbin(tmp_path: Path) -> None:
    """NVIDIA's libcufft.so.12 (12.0.0.61, the served lock's): sm_120 SASS in .ldata."""
    from frank.store.fetch import Fetcher, Pinned, mirror_dirs

    wheel = Fetcher(mirrors=mirror_dirs()).fetch(Pinned(
        "https://files.pythonhosted.org/packages/a8/2f/7b57e29836ea8714f81e9898409196f47d772d"
        "5ddedddf1592eadb8ab743/nvidia_cufft-12.0.0.61-py3-none-manylinux2014_x86_64."
        "manylinux_2_17_x86_64.whl",
        "6c44f692dce8fd5ffd3e3df134b6cdb9c2f72d99cf40b62c32dde45eea9ddad3"))
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith("lib/libcufft.so.12"))
        lib = tmp_path / "libcufft.so.12"
        with zf.open(name) as src, lib.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    code = read_cuda(*_file(lib))
    assert code is not None and "sm_120" in code.sass, code
    # 23,983 containers in .ldata: 11,255 SASS and PTX entries (the rest are LTO IR), 420
    # of them sm_120 cubins (compressed, BUILD-FACTS: 4.0 MB stored, 20.1 MB inflated)
    assert code.hidden > 11000
    sm120 = [n for kind, arch, n in code.sizes if arch == "sm_120" and kind == "sass"]
    assert len(sm120) == 420
    if CUOBJDUMP:  # what cuobjdump sees: .nv_fatbin's one sm_75 cubin
        assert "sm_120" not in list_with_cuobjdump(lib, CUOBJDUMP).sass


def _file(path: Path):  # type: ignore[no-untyped-def]
    fd = os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    return (lambda o, n: os.pread(fd, n, o)), size


@pytest.mark.parametrize(("source", "major", "answer"), [
    ("def supports(cap):\n    return cap.major == 10\n", 12, False),
    ("def supports(cap):\n    return cap.major == 10\n", 10, True),
    ("class B:\n    @classmethod\n    def supports(cls, c):\n        '''doc'''\n"
     "        return c.major in (9, 12) and not c.minor > 0\n", 12, True),
    ("def supports(cap):\n    return cap.to_int() >= 100\n", 12, True),
])
def test_a_pure_capability_rule_is_evaluated(source: str, major: int, answer: bool) -> None:
    name = "B.supports" if source.startswith("class") else "supports"
    assert evaluate(source, name, major, 0) is answer


@pytest.mark.parametrize("body", [
    "return current_platform.is_device_capability_family(90)",
    "return __import__('os').system('true') == 0",
    "x = 1\n    return cap.major == x",
    "return cap.major == GLOBAL",
])
def test_a_rule_that_reads_anything_else_is_not_evaluated(body: str) -> None:
    with pytest.raises(NotPure):
        evaluate(f"def supports(cap):\n    {body}\n", "supports", 12, 0)


def test_target_facts_refuse_what_cannot_be_checked() -> None:
    with pytest.raises(ValueError, match="not a code citation"):
        TargetFacts.model_validate({"family": "12.x", "unused": [
            {"path": "a.so", "rule": "somewhere in vllm", "why": "x"}]})
    with pytest.raises(ValueError, match="not a target family"):
        TargetFacts.model_validate({"family": "sm_120"})
    with pytest.raises(ValueError, match="exactly one of"):
        KernelRef.model_validate({"what": "k", "cite": "a.py:f", "library": "a.so",
                                  "cubins": "c"})
    with pytest.raises(ValueError, match=r"no '\.\.'"):
        TargetFacts.model_validate({"family": "12.x", "unused": [
            {"path": "../../etc/passwd", "rule": "a.py:f", "why": "x"}]})


# -- a composed image on an sm_120 target -------------------------------------------------

FACTS = """
[[targets]]
family = "12.x"

[[targets.unused]]
path = "/opt/frank/t/dead100.so"
rule = "engine/select.py:pick_backend"
why = "the sm_100 backend is never picked on 12.x"
{unused_missing}
[[targets.path]]
role = "attention"
backend = "HIDDEN"
cite = "engine/select.py:pick_backend"

[[targets.path.kernels]]
what = "decode"
library = "/opt/frank/t/hidden.so"
symbol = "probe_launch"
cite = "engine/decode.py:run"

[[targets.path]]
role = "moe"
backend = "SM100_ONLY"
cite = "engine/select.py:pick_moe"

[[targets.path.kernels]]
what = "grouped gemm launcher"
flashinfer_module = "fused_moe_100"
cite = "flashinfer/fused_moe/core.py:get_module"

[[targets.path.kernels]]
what = "grouped gemm"
cubins = "/opt/frank/t"
cite = "flashinfer/fused_moe/core.py:load_cubins"

[[targets.tools]]
tool = "gcc"
by = "the launcher build"
cite = "triton/runtime/build.py:_build"
needs = ["/usr/include/python3.11/Python.h"]

[[targets.tools]]
tool = "sh"
by = "a shell the engine spawns"
cite = "engine/run.py:spawn"

[[targets.tools]]
tool = "nvcc"
by = "an extension build at first import"
cite = "ext/ext.py:load"
built = ["/opt/frank/t/hidden.so"]
"""

BINARY = """kind = "binary"
name = "target-libs"
version = "1"
summary = "three libraries: one with hidden sm_120 code, one sm_100 only, one undeclared"
status = "candidate"
path = "parts/target-libs/libs"
archs = ["sm_120f"]
dest = "/opt/frank/t"

[provenance]
credits = ["tests"]
licence = "Apache-2.0"

[revert]
action = "remove"
"""


def _target_repo(tmp: Path, *, declare_extra: bool, unused_missing: bool) -> Path:
    repo = copy_repo(tmp / "repo")
    part = repo / "parts" / "target-libs"
    (part / "libs").mkdir(parents=True)
    (part / "libs" / "hidden.so").write_bytes(_hidden_lib())
    sm100a = container(entry(100, flags=0x100000, payload=b"\x22" * 4096))
    (part / "libs" / "dead100.so").write_bytes(
        elf([Section(".nv_fatbin", PROGBITS, SHF_ALLOC, sm100a)]))
    (part / "libs" / "dead90.so").write_bytes(
        elf([Section(".nv_fatbin", PROGBITS, SHF_ALLOC, container(entry(90)))]))
    missing = ('\n[[targets.unused]]\npath = "/opt/frank/t/not-there.so"\n'
               'rule = "engine/select.py:pick_backend"\nwhy = "a file the image lacks"\n'
               if unused_missing else "")
    extra = ('\n[[targets.unused]]\npath = "/opt/frank/t/dead90.so"\n'
             'rule = "engine/select.py:pick_backend"\nwhy = "FA3 on 9.x only"\n'
             if declare_extra else "")
    (part / "1.toml").write_text(BINARY + FACTS.format(unused_missing=missing + extra))
    (repo / "stacks" / "ontarget.toml").write_text(
        'extends = "smoke-cpu.toml"\n[target]\narch = "sm_120"\ngpus = 1\n'
        '[add]\ntarget-libs = "1"\n')
    result = frank("compose", "stacks/ontarget.toml", cwd=repo)
    assert result.code == 0, result.out + result.err
    return repo


@pytest.fixture(scope="module")
def ontarget(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _target_repo(tmp_path_factory.mktemp("target"), declare_extra=False,
                        unused_missing=True)


def _require(repo: Path) -> tuple[int, list[str], dict]:  # type: ignore[type-arg]
    text = frank("audit", "stacks/ontarget.toml", "--require-target", cwd=repo)
    js = frank("audit", "stacks/ontarget.toml", "--require-target", "--json", cwd=repo)
    assert text.code == js.code, (text.err, js.err)
    return text.code, text.out.splitlines(), json.loads(js.out)


@pytest.mark.slow
def test_every_target_verdict_is_reported_with_its_evidence(ontarget: Path) -> None:
    code, lines, report = _require(ontarget)
    assert code == 1
    checks = [(d["part"], d["path"], d["check"]) for d in report["differences"]]
    # an undeclared library with no sm_120 code fails; the declared one does not
    assert ("target-libs", "/opt/frank/t/dead90.so", "no code runs on the target") in checks
    assert not any(p == "/opt/frank/t/dead100.so" and c == "no code runs on the target"
                   for _, p, c in checks)
    # a declaration naming a file the image does not hold is refused
    assert ("target-libs", "/opt/frank/t/not-there.so",
            "declared unused library not in the image") in checks
    # the moe path fails on its first kernel: a FlashInfer module not built ahead of time
    moe = [d for d in report["differences"] if "engine path: moe" in d["check"]]
    assert len(moe) == 1 and "grouped gemm launcher" in moe[0]["check"]
    assert "not built ahead of time" in moe[0]["image"]
    # the hidden sm_120 code and the symbol carry the attention path
    t = report["target_report"]
    attention = [k for k in t["path"] if k["role"] == "attention"]
    assert attention[0]["ok"] and "sm_120f" in attention[0]["evidence"]
    cubins = next(k for k in t["path"] if k["what"] == "grouped gemm")
    assert cubins["ok"] and cubins["evidence"].startswith("1 of 3 cubins run on sm_120")
    # gcc is not in the test base: named; sh is; nvcc is not needed (its build is there)
    tools = {x["tool"]: x for x in t["tools"]}
    assert not tools["gcc"]["ok"] and tools["sh"]["ok"] and tools["sh"]["found"]
    assert tools["nvcc"]["ok"] and not tools["nvcc"]["needed"]
    assert any(c.startswith("run-time tool missing: the launcher build calls gcc")
               for _, _, c in checks)
    # dead bytes: the sm_100a library's 4096 bytes at least, owned by the part
    dead = {d["owner"]: d for d in t["dead"]}
    assert dead["target-libs"]["bytes"] >= 4096 + 48
    assert dead["target-libs"]["files_all_dead"] == 2
    assert t["first_start"]["flashinfer_jit"] == ["fused_moe_100"]
    # the text names each of them too
    text = "\n".join(lines)
    assert "path: moe via SM100_ONLY: grouped gemm launcher: flashinfer module " \
           "fused_moe_100: NONE" in text
    assert "tool: gcc for the launcher build: MISSING" in text


@pytest.mark.slow
def test_declaring_the_rest_leaves_only_the_path_and_the_tool(tmp_path: Path) -> None:
    repo = _target_repo(tmp_path, declare_extra=True, unused_missing=False)
    code, _, report = _require(repo)
    checks = sorted(d["check"].split(":")[0] for d in report["differences"])
    assert code == 1 and checks == ["engine path", "run-time tool missing"], checks
    # without --require-target the same image passes its audit
    assert frank("audit", "stacks/ontarget.toml", cwd=repo).code == 0
