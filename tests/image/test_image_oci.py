"""The daemonless OCI builder: reproducible digests, layer reuse, clean failures."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from frank.assemble.baselayout import BaseImage
from frank.errors import FrankError
from frank.image.oci import build_image, read_layout, resolve_manifest
from frank.image.remote import read_image
from frank.image.spec import ImageSpec
from frank.store.blobs import BlobStore, sha256_file
from tests.image.image_helpers import EPOCH, make_sources, make_spec

_SUBPROCESS_BUILD = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from tests.image.image_helpers import make_sources, make_spec
from frank.assemble.base import BaseImage
from frank.image.oci import build_image
from frank.store.blobs import BlobStore, sha256_file
base = BaseImage(name="b", layout=Path(sys.argv[2]), digest=sys.argv[3])
src = make_sources(Path(sys.argv[4]))
print(build_image(make_spec(base, src), BlobStore(Path(sys.argv[5])), Path(sys.argv[6])))
"""


def _tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_two_clean_builds_are_identical(tmp_path: Path, mini_base: BaseImage) -> None:
    """Two directories, two caches, two times, another process with another TZ and umask."""
    src1 = make_sources(tmp_path / "one" / "src")
    d1 = build_image(make_spec(mini_base, src1), BlobStore(tmp_path / "one" / "cache"),
                     tmp_path / "one" / "out")
    time.sleep(1.1)
    env = {**os.environ, "TZ": "Asia/Tokyo", "LC_ALL": "C"}
    proc = subprocess.run(
        ["sh", "-c", 'umask 077 && exec "$@"', "sh", sys.executable, "-c", _SUBPROCESS_BUILD,
         str(Path(__file__).parents[2]), str(mini_base.layout), mini_base.digest,
         str(tmp_path / "two" / "src"), str(tmp_path / "two" / "cache"),
         str(tmp_path / "two" / "out")],
        capture_output=True, text=True, env=env, cwd=tmp_path, check=True)
    d2 = proc.stdout.strip()
    assert d1 == d2
    a, b = _tree_bytes(tmp_path / "one" / "out"), _tree_bytes(tmp_path / "two" / "out")
    assert a.keys() == b.keys() and a == b
    if shutil.which("diffoscope"):
        r = subprocess.run(["diffoscope", "--no-progress", str(tmp_path / "one" / "out"),
                            str(tmp_path / "two" / "out")], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout[-2000:]


@pytest.mark.skipif(not os.environ.get("FRANK_ALT_PYTHONS"),
                    reason="set FRANK_ALT_PYTHONS=/path/python3.12:/path/python3.13 "
                    "(each with pydantic and rich) to compare interpreters")
def test_other_interpreters_agree(tmp_path: Path, mini_base: BaseImage) -> None:
    """tarfile and json are ours only through the stdlib: other Pythons must agree."""
    src = make_sources(tmp_path / "ref" / "src")
    want = build_image(make_spec(mini_base, src), BlobStore(tmp_path / "ref" / "cache"),
                       tmp_path / "ref" / "out")
    repo = Path(__file__).parents[2]
    for i, exe in enumerate(os.environ["FRANK_ALT_PYTHONS"].split(":")):
        d = tmp_path / f"alt{i}"
        proc = subprocess.run(
            [exe, "-c", _SUBPROCESS_BUILD, str(repo), str(mini_base.layout), mini_base.digest,
             str(d / "src"), str(d / "cache"), str(d / "out")],
            capture_output=True, text=True, check=True,
            env={**os.environ, "PYTHONPATH": str(repo / "src")})
        assert proc.stdout.strip() == want, exe
        assert _tree_bytes(d / "out") == _tree_bytes(tmp_path / "ref" / "out")


def test_digest_depends_on_epoch(tmp_path: Path, mini_base: BaseImage,
                                 store: BlobStore) -> None:
    src = make_sources(tmp_path / "src")
    d1 = build_image(make_spec(mini_base, src), store, tmp_path / "a")
    d2 = build_image(make_spec(mini_base, src, epoch=EPOCH + 1), store, tmp_path / "b")
    assert d1 != d2


def test_config_and_manifest_content(tmp_path: Path, mini_base: BaseImage,
                                     store: BlobStore) -> None:
    src = make_sources(tmp_path / "src")
    spec = make_spec(mini_base, src)
    digest = build_image(spec, store, tmp_path / "out", ref_name="demo")
    info = read_layout(tmp_path / "out")
    assert info.digest == digest
    assert info.created == "2023-11-14T22:13:20Z"
    assert info.annotations["org.opencontainers.image.created"] == info.created
    assert info.annotations["org.opencontainers.image.base.digest"] == mini_base.digest
    assert info.annotations["dev.frank.lock.digest"] == spec.annotations["dev.frank.lock.digest"]
    assert "FRANK_STACK=demo" in info.env and any(e.startswith("PATH=") for e in info.env)
    assert info.entrypoint == ["/bin/sh", "-c"] and info.cmd == ["cat /etc/frank/frank.lock"]
    assert info.labels == {"dev.frank.stack": "demo"}
    assert [x.created_by for x in info.layers][1:] == [
        "frank: part:region-cache", "frank: part:table", "frank: part:kernel", "frank: lock"]
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    assert index["manifests"][0]["annotations"] == {"org.opencontainers.image.ref.name": "demo"}
    # the tools that will consume it agree it is a valid layout
    if shutil.which("skopeo"):
        out = subprocess.run(["skopeo", "inspect", f"oci:{tmp_path / 'out'}:demo"],
                             capture_output=True, text=True, check=True).stdout
        assert json.loads(out)["Digest"] == digest


def test_one_layer_change_rebuilds_only_that_layer(tmp_path: Path, mini_base: BaseImage,
                                                   store: BlobStore) -> None:
    src = make_sources(tmp_path / "src")
    d1 = build_image(make_spec(mini_base, src), store, tmp_path / "out")
    m1 = read_layout(tmp_path / "out")
    assert store.stats.layer_misses == 4
    mtimes = {p.name: p.stat().st_mtime_ns for p in store.blob_dir.iterdir()}
    time.sleep(0.05)
    src = make_sources(tmp_path / "src", kernel_text="kernel v2")
    store.stats.layer_misses = store.stats.layer_hits = 0
    d2 = build_image(make_spec(mini_base, src, kernel_key="v2"), store, tmp_path / "out")
    m2 = read_layout(tmp_path / "out")
    assert d1 != d2
    assert (store.stats.layer_misses, store.stats.layer_hits) == (1, 3)
    changed = [i for i, (a, b) in enumerate(zip(m1.layers, m2.layers, strict=True))
               if a.digest != b.digest]
    assert changed == [3], "only the kernel layer (index 3, after the base) differs"
    for layer in m1.layers:  # every old blob was reused, not rewritten
        name = layer.digest.split(":")[1]
        assert store.path(layer.digest).stat().st_mtime_ns == mtimes[name]


def test_noop_rebuild_reuses_everything(tmp_path: Path, mini_base: BaseImage,
                                        store: BlobStore) -> None:
    src = make_sources(tmp_path / "src")
    spec = make_spec(mini_base, src)
    d1 = build_image(spec, store, tmp_path / "out")
    written = store.stats.blobs_written
    d2 = build_image(spec, store, tmp_path / "out")
    assert d1 == d2 and store.stats.blobs_written == written
    assert store.stats.layer_hits == 4


def test_tampered_cached_layer_is_caught(tmp_path: Path, mini_base: BaseImage,
                                         store: BlobStore) -> None:
    src = make_sources(tmp_path / "src")
    spec = make_spec(mini_base, src)
    d1 = build_image(spec, store, tmp_path / "out")
    before = _tree_bytes(tmp_path / "out")
    blob = store.path(read_layout(tmp_path / "out").layers[2].digest)
    data = bytearray(blob.read_bytes())
    data[600] ^= 0xFF
    blob.write_bytes(bytes(data))
    with pytest.raises(FrankError) as exc:
        build_image(spec, store, tmp_path / "out")
    assert str(blob) in exc.value.one_line() and "\n" not in exc.value.one_line()
    # the previous output's files are all still there, none rewritten (its blobs are links
    # to the store's since issue 41, so the tampered bytes show there too: run re-hashes it)
    assert _tree_bytes(tmp_path / "out").keys() == before.keys()
    assert not blob.exists(), "the bad blob was moved aside"
    # the next build re-tars the layer and gets the same image back
    assert build_image(spec, store, tmp_path / "out") == d1


def test_tampered_output_layout_is_caught(tmp_path: Path, mini_base: BaseImage,
                                          store: BlobStore) -> None:
    build_image(make_spec(mini_base, make_sources(tmp_path / "src")), store, tmp_path / "out")
    blob = tmp_path / "out" / "blobs" / "sha256" / read_layout(tmp_path / "out").layers[1] \
        .digest.split(":")[1]
    blob.write_bytes(blob.read_bytes()[:-1] + b"X")
    with pytest.raises(FrankError, match="does not match its digest"):
        read_layout(tmp_path / "out")


@pytest.mark.parametrize("damage", ["bad-index-json", "missing-manifest", "manifest-mismatch",
                                    "missing-layer", "no-oci-layout", "bad-config-json"])
def test_corrupt_base_layout_is_one_line(tmp_path: Path, mini_base: BaseImage,
                                         damage: str) -> None:
    base = tmp_path / "base"
    shutil.copytree(mini_base.layout, base)
    _, _, manifest = resolve_manifest(base)
    mblob = base / "blobs" / "sha256" / mini_base.digest.split(":")[1]
    if damage == "bad-index-json":
        (base / "index.json").write_text("{not json")
    elif damage == "missing-manifest":
        mblob.unlink()
    elif damage == "manifest-mismatch":
        mblob.write_bytes(mblob.read_bytes() + b" ")
    elif damage == "missing-layer":
        (base / "blobs" / "sha256" / manifest["layers"][0]["digest"].split(":")[1]).unlink()
    elif damage == "no-oci-layout":
        (base / "oci-layout").unlink()
    elif damage == "bad-config-json":
        cfg = base / "blobs" / "sha256" / manifest["config"]["digest"].split(":")[1]
        cfg.write_text("{")
    spec = ImageSpec(base_layout=base, base_digest=mini_base.digest, layers=(),
                     source_date_epoch=EPOCH)
    store = BlobStore(tmp_path / "cache")
    with pytest.raises(FrankError) as exc:
        build_image(spec, store, tmp_path / "out")
    assert "\n" not in exc.value.one_line()
    assert "corrupt OCI layout" in exc.value.one_line() or "digest" in exc.value.one_line()
    assert not (tmp_path / "out").exists()
    with pytest.raises(FrankError):
        read_image(base)


def test_wrong_base_digest_refused(tmp_path: Path, mini_base: BaseImage,
                                   store: BlobStore) -> None:
    spec = ImageSpec(base_layout=mini_base.layout, base_digest="sha256:" + "0" * 64,
                     layers=(), source_date_epoch=EPOCH)
    with pytest.raises(FrankError, match="missing"):
        build_image(spec, store, tmp_path / "out")
    bad = ImageSpec(base_layout=mini_base.layout, base_digest="latest", layers=(),
                    source_date_epoch=EPOCH)
    with pytest.raises(FrankError, match="not a sha256 digest"):
        build_image(bad, store, tmp_path / "out")


def test_failed_build_leaves_previous_output(tmp_path: Path, mini_base: BaseImage,
                                             store: BlobStore) -> None:
    src = make_sources(tmp_path / "src")
    build_image(make_spec(mini_base, src), store, tmp_path / "out")
    before = _tree_bytes(tmp_path / "out")
    shutil.rmtree(src["kernel"])
    with pytest.raises(FrankError, match="does not exist"):
        build_image(make_spec(mini_base, src, kernel_key="v9"), store, tmp_path / "out")
    assert _tree_bytes(tmp_path / "out") == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "out", "src"]
    assert list(store.tmp_dir.iterdir()) == []


def test_output_over_a_non_layout_dir_refused(tmp_path: Path, mini_base: BaseImage,
                                              store: BlobStore) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "precious.txt").write_text("keep me")
    spec = ImageSpec(base_layout=mini_base.layout, base_digest=mini_base.digest, layers=(),
                     source_date_epoch=EPOCH)
    with pytest.raises(FrankError, match="not an OCI layout"):
        build_image(spec, store, tmp_path / "out")
    assert (tmp_path / "out" / "precious.txt").read_text() == "keep me"


def _gzip_copy(src: Path, dst: Path, *, corrupt: bool = False) -> None:
    """A copy of a layout whose layers are gzipped (as engines export them)."""
    import gzip

    from frank.image.oci import canonical_json

    shutil.copytree(src, dst)
    _, _, manifest = resolve_manifest(dst)
    blobs = dst / "blobs" / "sha256"
    for layer in manifest["layers"]:
        data = (blobs / layer["digest"].split(":")[1]).read_bytes()
        if corrupt:
            data = data[:-1] + b"!"
        gz = gzip.compress(data, mtime=0)
        digest = "sha256:" + __import__("hashlib").sha256(gz).hexdigest()
        (blobs / digest.split(":")[1]).write_bytes(gz)
        layer.update(mediaType="application/vnd.oci.image.layer.v1.tar+gzip", digest=digest,
                     size=len(gz))
    raw = canonical_json(manifest)
    mdig = "sha256:" + __import__("hashlib").sha256(raw).hexdigest()
    (blobs / mdig.split(":")[1]).write_bytes(raw)
    (dst / "index.json").write_bytes(canonical_json({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": mdig,
         "size": len(raw)}]}))


def test_normalize_undoes_engine_compression(tmp_path: Path, mini_base: BaseImage,
                                             store: BlobStore) -> None:
    from frank.image.oci import normalize_layout

    _gzip_copy(mini_base.layout, tmp_path / "gz")
    assert resolve_manifest(tmp_path / "gz")[0] != mini_base.digest
    assert normalize_layout(tmp_path / "gz", store, tmp_path / "out") == mini_base.digest
    _gzip_copy(mini_base.layout, tmp_path / "bad", corrupt=True)
    with pytest.raises(FrankError, match="decompresses to"):
        normalize_layout(tmp_path / "bad", BlobStore(tmp_path / "fresh"), tmp_path / "out2")
    assert not (tmp_path / "out2").exists()


def test_noop_keeps_a_current_output_and_repairs_a_touched_one(
        tmp_path: Path, mini_base: BaseImage, store: BlobStore) -> None:
    spec = make_spec(mini_base, make_sources(tmp_path / "src"))
    out = tmp_path / "out"
    build_image(spec, store, out)
    good = _tree_bytes(out)
    blob = out / "blobs" / "sha256" / read_layout(out).layers[2].digest.split(":")[1]
    ino = blob.stat().st_ino
    build_image(spec, store, out)
    assert blob.stat().st_ino == ino, "a current output is left alone"
    with blob.open("r+b") as f:
        f.write(b"\0")
    build_image(spec, store, out)
    assert _tree_bytes(out) == good, "a modified output is rewritten"
    (out / "blobs" / "sha256" / "extra").write_text("x")
    build_image(spec, store, out)
    assert _tree_bytes(out) == good
    blob.unlink()
    build_image(spec, store, out)
    assert _tree_bytes(out) == good


def test_concurrent_builds_into_one_output(tmp_path: Path, mini_base: BaseImage) -> None:
    """Three processes, one cache, one output: all agree and the output is whole."""
    repo = Path(__file__).parents[2]
    procs = [subprocess.Popen(
        [sys.executable, "-c", _SUBPROCESS_BUILD, str(repo), str(mini_base.layout),
         mini_base.digest, str(tmp_path / f"src{i}"), str(tmp_path / "cache"),
         str(tmp_path / "out")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(3)]
    results = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e for _, e in results]
    digests = {o.strip() for o, _ in results}
    assert len(digests) == 1
    assert read_layout(tmp_path / "out").digest == digests.pop()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


@pytest.mark.skipif(shutil.which("umoci") is None, reason="umoci missing")
def test_umoci_unpacks_the_layout(tmp_path: Path, mini_base: BaseImage,
                                  store: BlobStore) -> None:
    """An independent OCI implementation reads our layout and finds the files we put in."""
    src = make_sources(tmp_path / "src")
    build_image(make_spec(mini_base, src), store, tmp_path / "out", ref_name="demo")
    subprocess.run(["umoci", "unpack", "--image", f"{tmp_path / 'out'}:demo",
                    str(tmp_path / "bundle")], check=True, capture_output=True)
    rootfs = tmp_path / "bundle" / "rootfs"
    assert (rootfs / "etc" / "frank" / "frank.lock").read_text() == src["lock"].read_text()
    assert (rootfs / "etc" / "os-release").read_text() == "ID=frank-mini\n"
    pkg = rootfs / "opt" / "frank" / "plugins" / "region_cache"
    assert (pkg / "__init__.py").stat().st_mode & 0o777 == 0o644
    assert not (pkg / "__pycache__").exists()
    config = json.loads((tmp_path / "bundle" / "config.json").read_text())
    assert config["process"]["args"] == ["/bin/sh", "-c", "cat /etc/frank/frank.lock"]
    assert "FRANK_STACK=demo" in config["process"]["env"]


def test_a_one_part_change_links_the_unchanged_blobs_of_the_output(
        tmp_path: Path, mini_base: BaseImage, store: BlobStore) -> None:
    src = make_sources(tmp_path / "src")
    out = tmp_path / "out"
    build_image(make_spec(mini_base, src), store, out)
    table = read_layout(out).layers[2].digest  # the data layer: unchanged below
    blob = out / "blobs" / "sha256" / table.split(":")[1]
    inode = blob.stat().st_ino
    src2 = make_sources(tmp_path / "src2", kernel_text="kernel v2")
    build_image(make_spec(mini_base, src2, kernel_key="v2"), store, out)
    assert blob.stat().st_ino == inode  # linked from the previous output, not copied again
    # a blob edited in the output is not reused: the next output gets a verified copy
    data = bytearray(blob.read_bytes())
    data[10] ^= 0xFF
    blob.write_bytes(bytes(data))
    build_image(make_spec(mini_base, src), store, out)
    assert sha256_file(blob) == table
