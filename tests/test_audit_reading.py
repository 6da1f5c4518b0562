"""The audit's readers: layers merged as a container sees them, GPU code held to cuobjdump,
and the rules of which code runs on which device."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from frank.audit.cuda import file_reader, list_with_cuobjdump, read_cuda
from frank.audit.layers import TarReader, merge, read_layer
from frank.model.archs import parse_arch, runs_on

NVCC = shutil.which("nvcc")
CUOBJDUMP = os.environ.get("CUOBJDUMP") or ""


def _layer(path: Path, members: list[tuple[str, str, bytes]]) -> Path:
    """A tar of (name, kind, data): kind file, dir, link (data is the target)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif kind == "link":
                info.type = tarfile.SYMTYPE
                info.linkname = data.decode()
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    path.write_bytes(buf.getvalue())
    return path


def test_the_merge_honours_whiteouts_opaque_folders_and_files_over_folders(
        tmp_path: Path) -> None:
    long = "deep/" + "x" * 120 + "/file.txt"  # a PAX path header
    lower = _layer(tmp_path / "0.tar", [
        ("etc", "dir", b""), ("etc/keep", "file", b"keep"), ("etc/gone", "file", b"gone"),
        ("opt/a/one", "file", b"1"), ("opt/a/two", "file", b"2"),
        ("srv/tree/inner", "file", b"inner"), ("lib/old", "file", b"old"),
        (long, "file", b"long"), ("bin/sh", "link", b"dash"),
    ])
    upper = _layer(tmp_path / "1.tar", [
        ("etc/.wh.gone", "file", b""), ("opt/a/.wh..wh..opq", "file", b""),
        ("opt/a/three", "file", b"3"), ("srv/tree", "file", b"now a file"),
        ("lib/old", "file", b"new"), ("lib/.wh.old", "file", b""),  # own layer: kept
    ])
    view = merge([read_layer(0, lower), read_layer(1, upper)])
    assert set(view.visible) >= {"etc/keep", "opt/a/three", "srv/tree", "lib/old", long}
    for hidden in ("etc/gone", "opt/a/one", "opt/a/two", "srv/tree/inner"):
        assert hidden not in view.visible, hidden
    new = view.get("lib/old")
    assert new is not None and new.sha256 == hashlib.sha256(b"new").hexdigest()
    assert view.layer_of("lib/old") == 1 and view.layer_of("etc/keep") == 0
    link = view.get("bin/sh")
    assert link is not None and link.kind == "symlink" and link.link == "dash"
    entry = view.get(long)
    assert entry is not None and view.read(0, entry) == b"long"


def test_under_lists_exactly_what_lies_strictly_below_a_folder(tmp_path: Path) -> None:
    """The binary search over sorted paths neither misses a member nor takes a neighbour
    whose name only starts like the folder's (``pkg-1.0.dist-info-x``, ``pkg-1.0.dist-infoz``),
    and sees paths a second layer adds."""
    lower = _layer(tmp_path / "0.tar", [
        ("site/pkg-1.0.dist-info/RECORD", "file", b"r"),
        ("site/pkg-1.0.dist-info/sub/deep", "file", b"d"),
        ("site/pkg-1.0.dist-info-x/RECORD", "file", b"x"),
        ("site/pkg-1.0.dist-infoz", "file", b"z"), ("site/pkg-1.0.dist-info", "dir", b""),
        ("site/a", "file", b"a"), ("zz/last", "file", b"l"),
    ])
    upper = _layer(tmp_path / "1.tar", [("site/pkg-1.0.dist-info/INSTALLER", "file", b"i")])
    view = merge([read_layer(0, lower), read_layer(1, upper)])
    got = [p for p, _ in view.under("/site/pkg-1.0.dist-info/")]
    assert got == ["site/pkg-1.0.dist-info/INSTALLER", "site/pkg-1.0.dist-info/RECORD",
                   "site/pkg-1.0.dist-info/sub/deep"]
    assert [p for p, _ in view.under("zz")] == ["zz/last"]
    assert list(view.under("nowhere")) == []
    assert {p for p, _ in view.under("site")} == {p for p in view.visible
                                                  if p.startswith("site/")}


def test_a_truncated_layer_is_one_line(tmp_path: Path) -> None:
    from frank.errors import FrankError

    blob = _layer(tmp_path / "0.tar", [("big", "file", b"x" * 5000)])
    blob.write_bytes(blob.read_bytes()[:2048])
    with pytest.raises(FrankError, match="not a readable tar"):
        read_layer(0, blob)


def _fields(entries: list) -> list[tuple]:
    return [(e.path, e.kind, e.size, e.offset, e.mode, e.link, e.sha256, e.head, e.cuda,
             e.cuda_read) for e in entries]


def test_bytes_fed_in_any_pieces_read_as_the_blob_does(tmp_path: Path) -> None:
    """A build feeds the reader its tar in the writer's pieces (a 512-byte header, a
    member's 1 MB chunks, its padding): every split gives what reading the blob gives, the
    same paths, offsets and hashes, PAX long names and links included; a tar cut short
    raises when closed, as the blob read does."""
    import random

    deep = "d/" + "very_long_folder_name/" * 8 + "file.txt"
    blob = _layer(tmp_path / "0.tar", [
        ("usr", "dir", b""), (deep, "file", b"deep\n"), ("usr/x", "file", os.urandom(70_000)),
        ("usr/empty", "file", b""), ("usr/elf", "file", b"\x7fELF" + bytes(600)),
        ("usr/l", "link", ("t/" * 60).encode()), ("usr/.wh.gone", "file", b""),
    ])
    want = _fields(read_layer(0, blob).entries)
    data = blob.read_bytes()
    rng = random.Random(7)
    for sizes in ([1], [511, 513], [7, 4096, 3], [len(data)]):
        reader, at = TarReader(), 0
        while at < len(data):
            step = sizes[rng.randrange(len(sizes))]
            reader.feed(data[at:at + step])
            at += step
        assert _fields(reader.close()) == want, sizes
    short = TarReader()
    short.feed(data[:700])
    with pytest.raises(ValueError, match="middle of a member"):
        short.close()
    assert any(p == deep and s == hashlib.sha256(b"deep\n").hexdigest()
               for p, _, _, _, _, _, s, *_ in want)


@pytest.mark.parametrize(("code", "ptx", "device", "runs"), [
    ("sm_120", False, "sm_120", True), ("sm_120", False, "sm_121", True),
    ("sm_121", False, "sm_120", False), ("sm_90", False, "sm_120", False),
    ("sm_90a", False, "sm_90", True), ("sm_120a", False, "sm_121", False),
    ("sm_120f", False, "sm_121", True), ("sm_100f", False, "sm_120", False),
    ("sm_90", True, "sm_120", True), ("sm_90a", True, "sm_120", False),
    ("sm_121", True, "sm_120", False), ("sm_120f", True, "sm_121", True),
])
def test_which_code_runs_on_which_device(code: str, ptx: bool, device: str,
                                         runs: bool) -> None:
    assert runs_on(parse_arch(code), parse_arch(device), ptx=ptx) is runs


def _nvcc(tmp: Path, out: str, *args: str) -> Path:
    src = tmp / "k.cu"
    src.write_text('extern "C" __global__ void k(float *a) { a[threadIdx.x] *= 2.0f; }\n')
    subprocess.run([str(NVCC), *args, "-o", str(tmp / out), str(src)], check=True,
                   capture_output=True)
    return tmp / out


@pytest.mark.skipif(NVCC is None or not CUOBJDUMP, reason="needs nvcc and CUOBJDUMP")
def test_the_gpu_code_read_from_headers_is_what_cuobjdump_lists(tmp_path: Path) -> None:
    files = [
        _nvcc(tmp_path, "sm90.cubin", "-cubin", "-arch=sm_90"),
        _nvcc(tmp_path, "sm90a.cubin", "-cubin", "-arch=sm_90a"),
        _nvcc(tmp_path, "sm120a.cubin", "-cubin", "-arch=sm_120a"),
        _nvcc(tmp_path, "lib.so", "-shared", "-Xcompiler", "-fPIC",
              "-gencode", "arch=compute_80,code=sm_80",
              "-gencode", "arch=compute_90a,code=sm_90a",
              "-gencode", "arch=compute_120,code=compute_120"),
        _nvcc(tmp_path, "rdc.o", "-c", "-rdc=true", "-Xcompiler", "-fPIC", "-arch=sm_120"),
    ]
    for path in files:
        mine = read_cuda(*file_reader(path))
        assert mine is not None, path
        assert mine == list_with_cuobjdump(path, CUOBJDUMP), path
    lib = read_cuda(*file_reader(files[3]))
    assert lib is not None and lib.sass == {"sm_80", "sm_90a"} and lib.ptx == {"sm_120"}
    # cuobjdump names family SASS without its suffix; the header keeps it
    fam = read_cuda(*file_reader(_nvcc(tmp_path, "f.cubin", "-cubin", "-arch=sm_120f")))
    assert fam is not None and fam.sass == {"sm_120f"}
    assert list_with_cuobjdump(tmp_path / "f.cubin", CUOBJDUMP).sass == {"sm_120"}
    assert read_cuda(*file_reader(Path("/bin/sh").resolve())) is None
