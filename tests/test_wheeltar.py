"""Wheels streamed into a layer tar give the staging route's bytes (issue 41).

The wheels are made here, with what real wheels carry that installer treats specially:
entry points, a ``#!python`` script, .data folders, a stray ``.pyc`` and ``__pycache__``
file, an executable file, a stored and a deflated member, a path long enough for a PAX
header, a RECORD line without a hash and one with base64 padding, and two wheels writing
one path (nvidia-cutlass-dsl's two libs wheels share a ``.pth``).
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import tempfile
import zipfile
from pathlib import Path

import pytest

from frank.assemble.baselayout import layout_from_rootfs
from frank.assemble.install import install_wheels
from frank.assemble.pipeline import build_missing
from frank.assemble.plan import PlanLayer, WheelRef
from frank.assemble.wheeltar import StreamRefused, plan_wheels, write_wheel_tar
from frank.audit.layers import TarReader, read_layer
from frank.image.layer import build_layer, collect, index_key, indexed, write_tar
from frank.image.oci import build_image
from frank.image.spec import ImageSpec, LayerInput
from frank.store.blobs import BlobStore
from frank.store.fetch import Fetcher, Pinned

SITE = "/usr/local/lib/python3.11/dist-packages"
EPOCH = 315532800
LONG = "alpha/" + "deep_" * 24 + "module.py"  # > 100 bytes once under SITE


def _record_hash(data: bytes, padded: bool = False) -> str:
    value = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode()
    return "sha256=" + (value if padded else value.rstrip("="))


def make_wheel(folder: Path, name: str, version: str, files: dict[str, tuple[bytes, int]],
               *, lie: str | None = None, unhashed: str | None = None,
               entry_points: str = "") -> Path:
    """A wheel of ``files`` (path -> (bytes, mode)); ``lie`` names a member whose RECORD
    hash is wrong, ``unhashed`` one whose RECORD line has no hash."""
    dist = f"{name}-{version}.dist-info"
    meta = {
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                         "Tag: py3-none-any\n",
    }
    if entry_points:
        meta[f"{dist}/entry_points.txt"] = entry_points
    members = {**files, **{k: (v.encode(), 0o644) for k, v in meta.items()}}
    lines = []
    for i, (path, (data, _)) in enumerate(sorted(members.items())):
        h = "" if path == unhashed else _record_hash(data, padded=i % 2 == 0)
        if path == lie:
            h = _record_hash(data + b"x")
        lines.append(f"{path},{h},{'' if not h else len(data)}")
    lines.append(f"{dist}/RECORD,,")
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for i, (member, (data, mode)) in enumerate(sorted(members.items())):
            info = zipfile.ZipInfo(member, (2020, 1, 1, 0, 0, 0))
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED if i % 2 else zipfile.ZIP_STORED
            zf.writestr(info, data)
        zf.writestr(f"{dist}/RECORD", "\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, Path]]:
    folder = tmp_path_factory.mktemp("wheels")
    big = os.urandom(300_000) + b"\0" * 3_000_000  # more than one 1 MB read, compressible
    alpha = make_wheel(folder, "alpha", "1.0", {
        "alpha/__init__.py": (b"def main():\n    return 0\n", 0o644),
        "alpha/tool.sh": (b"#!/bin/sh\necho hi\n", 0o755),
        "alpha/big.bin": (big, 0o644),
        "alpha/stray.pyc": (b"\0\0\0\0", 0o644),
        "alpha/__pycache__/x.cpython-311.pyc": (b"\0", 0o644),
        LONG: (b"x = 1\n", 0o644),
        "alpha-1.0.data/scripts/run": (b"#!python\nimport alpha\n", 0o755),
        "alpha-1.0.data/scripts/plain": (b"#!/bin/sh\ntrue\n", 0o644),
        "alpha-1.0.data/data/share/alpha/x.txt": (b"data\n", 0o644),
        "alpha-1.0.data/headers/alpha.h": (b"int a;\n", 0o644),
        "shared.pth": (b"alpha\n", 0o644),
    }, unhashed="alpha/__init__.py", entry_points="[console_scripts]\nalpha = alpha:main\n")
    beta = make_wheel(folder, "beta", "2.0", {
        "beta/__init__.py": (b"", 0o644),
        "shared.pth": (b"beta\n", 0o755),
    })
    return [(alpha.name, alpha), (beta.name, beta)]


def staged_bytes(wheels: list[tuple[str, Path]], key: str | None = None) -> bytes:
    """What the staging route makes: installer into a tree, the tree collected and tarred."""
    out = io.BytesIO()
    with tempfile.TemporaryDirectory() as tmp:
        install_wheels(wheels, Path(tmp), SITE)
        write_tar(collect([(Path(tmp), "/")]), EPOCH, out, key=key)
    return out.getvalue()


def streamed_bytes(wheels: list[tuple[str, Path]], tmp: Path, key: str | None = None) -> bytes:
    out = tmp / "streamed.tar"
    with out.open("wb") as f:
        write_wheel_tar(plan_wheels(wheels, SITE), EPOCH, f, key=key)
    return out.read_bytes()


def test_streamed_tar_is_the_staged_tar(wheels: list[tuple[str, Path]], tmp_path: Path) -> None:
    streamed = streamed_bytes(wheels, tmp_path)
    assert streamed == staged_bytes(wheels)
    key = "ab" * 32  # with the key its first member names, the two routes still agree
    assert streamed_bytes(wheels, tmp_path, key) == staged_bytes(wheels, key) != streamed
    names = {m for m in plan_wheels(wheels, SITE)}
    assert "usr/local/bin/alpha" in names and "usr/local/bin/run" in names
    assert f"{SITE.lstrip('/')}/{LONG}" in names
    # the order matters too: beta's .pth replaces alpha's, and keeps alpha's mode bits
    assert streamed_bytes(wheels[::-1], tmp_path) == staged_bytes(wheels[::-1])
    assert streamed_bytes(wheels[::-1], tmp_path) != streamed


def _audit_of(tar: Path, wheel: Path, name: str) -> list[tuple[str, str]]:
    """(path, check) of every difference the audit finds between a layer and the pinned
    wheel's RECORD."""
    from frank.audit.checks import Checker
    from frank.audit.expect import Expected, WantDist, wheel_record
    from frank.audit.layers import merge

    view = merge([read_layer(0, tar)])
    want = Expected(site=SITE.strip("/"),
                    dists={name: WantDist(name, "1.0", "p", wheel_record(wheel))})
    diffs, _, _ = Checker(view, want, 0).run()
    return [(d.path, d.check) for d in diffs]


def test_a_record_that_lies_is_written_as_claimed_and_the_audit_names_the_file(
        tmp_path: Path) -> None:
    """The tar pass no longer hashes each file against its RECORD claim (a second sha256
    of every byte): a wheel whose RECORD lies streams, and the audit, which holds the image
    to the pinned wheel's RECORD, names the file. An honest wheel passes the same audit."""
    files = {"liar/__init__.py": (b"x = 1\n", 0o644), "liar/ok.py": (b"y = 2\n", 0o644)}
    (tmp_path / "l").mkdir()
    (tmp_path / "h").mkdir()
    liar = make_wheel(tmp_path / "l", "liar", "1.0", files, lie="liar/__init__.py")
    honest = make_wheel(tmp_path / "h", "liar", "1.0", files)
    for wheel in (liar, honest):
        with (tmp_path / f"{wheel.parent.name}.tar").open("wb") as f:
            write_wheel_tar(plan_wheels([(wheel.name, wheel)], SITE), EPOCH, f)
    path = f"/{SITE.strip('/')}/liar/__init__.py"
    assert _audit_of(tmp_path / "l.tar", liar, "liar") == [(path, "file of liar differs")]
    assert _audit_of(tmp_path / "h.tar", honest, "liar") == []


def test_a_member_that_is_not_its_zip_size_is_refused(wheels: list[tuple[str, Path]],
                                                     tmp_path: Path) -> None:
    members = plan_wheels(wheels, SITE)
    big = next(m for arc, m in members.items() if arc.endswith("alpha/big.bin"))
    big.size += 1  # as a zip whose directory says more than its data holds
    with pytest.raises(StreamRefused, match="bytes its zip says"), \
            (tmp_path / "t.tar").open("wb") as f:
        write_wheel_tar(members, EPOCH, f)


def _without_record(wheel: Path, folder: Path) -> Path:
    """The wheel with its RECORD left out: installer refuses it, by either route."""
    out = folder / wheel.name
    with zipfile.ZipFile(wheel) as zin, zipfile.ZipFile(out, "w") as zout:
        for info in zin.infolist():
            if not info.filename.endswith(".dist-info/RECORD"):
                zout.writestr(info, zin.read(info))
    return out


def test_pipeline_streams_and_hands_a_refused_layer_to_staging(
        tmp_path: Path, wheels: list[tuple[str, Path]]) -> None:
    """A wheel layer streamed (its blob and index entry made); then a layer installer
    refuses, handed to the staging route, whose own error is what is raised. (Two calls:
    in one, which result comes back first is up to the workers.)"""
    (tmp_path / "bad").mkdir()
    bad = _without_record(make_wheel(tmp_path / "bad", "bad", "1.0",
                                     {"bad/__init__.py": (b"", 0o644)}), tmp_path)
    store = BlobStore(tmp_path / "cache")
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    refs = {}
    for name, path in [*wheels, (bad.name, bad)]:
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        (mirror / sha).write_bytes(path.read_bytes())
        refs[name] = WheelRef(name=name.split("-")[0], version="1", filename=name,
                              url=f"https://unreachable.invalid/{name}", sha256=sha,
                              size=path.stat().st_size)

    def layer(i: int, names: list[str]) -> tuple[PlanLayer, LayerInput]:
        x = PlanLayer(index=i, name=f"python:l{i}", part=None, kind="python", key=f"k{i}",
                      inputs={}, files=[], generated=[], pip_install=[], run=[], why="",
                      wheels=[refs[n] for n in names])
        return x, LayerInput(name=x.name, key=f"{i:064x}", entries=((store.tmp_dir, "/"),))

    missing = [layer(1, [n for n, _ in wheels]), layer(2, [bad.name])]
    fetcher = Fetcher(store, [mirror])
    staged: list[str] = []

    def stage(x: PlanLayer, spec: LayerInput) -> str:
        staged.append(x.name)
        with tempfile.TemporaryDirectory(dir=store.tmp_dir) as tmp:
            install_wheels([(w.filename, fetcher.fetch(Pinned(w.url, w.sha256)))
                            for w in x.wheels], Path(tmp), SITE)
            rec, _ = build_layer(store, LayerInput(name=x.name, key=spec.key,
                                                   entries=((Path(tmp), "/"),)), EPOCH)
        return rec.digest

    notes: list[str] = []
    made = build_missing(missing[:1], site=SITE, epoch=EPOCH, fetcher=fetcher, stage=stage,
                         note=notes.append, tap=TarReader)
    assert made.streamed == ["python:l1"] and staged == []
    key1 = index_key(missing[0][1], EPOCH)
    rec1 = indexed(store, key1)  # the streamed blob names its key: a hit for the next build
    assert rec1 is not None and rec1.digest in made.fresh
    assert store.path(rec1.digest).read_bytes() == staged_bytes(wheels, key1)
    # the tap saw the bytes the blob holds: the entries the audit would read back from it
    tapped = made.tapped[rec1.digest]
    assert [(e.path, e.offset, e.size, e.sha256) for e in tapped] == \
        [(e.path, e.offset, e.size, e.sha256)
         for e in read_layer(0, store.path(rec1.digest)).entries]
    assert any(e.path.endswith("alpha/big.bin") and e.size == 3_300_000 for e in tapped)
    with pytest.raises(Exception, match="RECORD"):
        build_missing(missing[1:], site=SITE, epoch=EPOCH, fetcher=fetcher, stage=stage,
                      note=notes.append)
    assert staged == ["python:l2"]
    assert any(n.startswith("layer 2 python:l2: not streamed") for n in notes), notes


def test_layout_links_the_store_blob_and_hashes_what_it_did_not_write(tmp_path: Path) -> None:
    """The out/ layout shares the store's inode (no third copy of every byte); a blob this
    process did not write is still hashed on its way out."""
    store = BlobStore(tmp_path / "cache")
    (tmp_path / "rootfs" / "etc").mkdir(parents=True)
    (tmp_path / "rootfs" / "etc" / "os-release").write_text("ID=frank-mini\n")
    base_digest = layout_from_rootfs(tmp_path / "rootfs", store, tmp_path / "base", epoch=0,
                                     created_by="mini")
    src = tmp_path / "tree"
    (src / "opt").mkdir(parents=True)
    (src / "opt" / "f").write_bytes(b"payload" * 1000)
    spec_layer = LayerInput(name="l", key="a" * 64, entries=((src, "/"),))
    rec, built = build_layer(store, spec_layer, EPOCH)
    assert built
    spec = ImageSpec(base_layout=tmp_path / "base", base_digest=base_digest,
                     layers=(spec_layer,), env={}, entrypoint=[], cmd=[], labels={},
                     annotations={}, source_date_epoch=EPOCH)
    out = tmp_path / "out" / "image"
    build_image(spec, store, out)
    blob = out / "blobs" / "sha256" / rec.digest.split(":")[1]
    assert blob.stat().st_ino == store.path(rec.digest).stat().st_ino
    assert oct(blob.stat().st_mode & 0o777) == "0o444" and blob.stat().st_mtime == EPOCH
    hashes = store.stats.full_hashes
    assert store.verified_path(rec.digest) == store.path(rec.digest)
    assert store.stats.full_hashes == hashes  # its ledger entry was carried: no re-hash
    # another output, the blob not fresh this time: a wrong byte in the store (same size,
    # mtime set back) is caught before it reaches the layout: the write moved its ctime, so
    # the stat ledger no longer vouches for it and it is hashed
    path = store.path(rec.digest)
    data = bytearray(path.read_bytes())
    data[-2000] ^= 1
    path.write_bytes(bytes(data))
    os.utime(path, (EPOCH, EPOCH))  # as a layout's blob has it: the link route is taken
    with pytest.raises(Exception, match="does not match its digest"):
        build_image(spec, store, tmp_path / "out2" / "image")
    assert not (tmp_path / "out2" / "image").exists()
