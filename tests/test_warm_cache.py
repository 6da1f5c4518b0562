"""Warm caches as artifacts (frank.run.warmcache, warmuse, ship.warmremote, gc): no engine.

What must hold: the same folder packs to the same digest on any machine; an artifact is
used only for its image digest and exactly this device (an artifact whose device identity
is edited, consistently or not, is refused); a corrupted or truncated layer is refused in
one line and nothing of it stays; a killed `frank warm` leaves no index entry and no temp
file; `frank gc` keeps the warm caches of kept images and collects the others; a registry
round trip (push as referrers, pull by digest) gives back the same artifact.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import replace
from pathlib import Path

import pytest
import zstandard

from frank.image.oci import canonical_json
from frank.run import warmcache, warmuse
from frank.run.device import Device, Gpu, cpu_identity
from frank.store.blobs import BlobStore, sha256_bytes

IMAGE = "sha256:" + "ab" * 32
OTHER_IMAGE = "sha256:" + "cd" * 32
SUBJECT = {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": IMAGE,
           "size": 1234}
CPUINFO = ("processor : 0\nmodel name : Intel(R) Xeon(R) Processor\n"
           "flags : fpu sse4_2 avx avx2 fma avx512f avx512bw amx_tile pdpe1gb\n")


def cache_folder(root: Path) -> Path:
    """A folder shaped like an engine's caches: Inductor code, a .so, a link, nested dirs."""
    (root / "inductor" / "fxgraph" / "ab").mkdir(parents=True)
    (root / "inductor" / "fxgraph" / "ab" / "entry").write_bytes(b"graph" * 1000)
    (root / "vllm" / "torch_compile_cache" / "1f2e").mkdir(parents=True)
    so = root / "vllm" / "torch_compile_cache" / "1f2e" / "kernel.so"
    so.write_bytes(os.urandom(4096))
    so.chmod(0o755)
    (root / "vllm" / "latest").symlink_to("torch_compile_cache/1f2e")
    (root / "home").mkdir()
    return root


@pytest.fixture
def store(tmp_path: Path) -> BlobStore:
    return BlobStore(tmp_path / "store")


@pytest.fixture
def device() -> Device:
    return cpu_identity(CPUINFO)


def test_device_identity_keeps_only_the_isa_flags() -> None:
    dev = cpu_identity(CPUINFO)
    assert dev.cpu_model == "Intel(R) Xeon(R) Processor"
    assert dev.isa == ("amx_tile", "avx", "avx2", "avx512bw", "avx512f", "fma", "sse4_2")
    assert Device.from_json(json.loads(dev.canonical())) == dev
    gpu = Device("gpu", gpus=(Gpu("NVIDIA GeForce RTX 5090", "12.0", "580.65", "13.0"),) * 2)
    assert gpu.describe() == "NVIDIA GeForce RTX 5090 (sm_120, driver 580.65, CUDA 13.0) x2"
    assert "isa" not in gpu.as_json() and Device.from_json(gpu.as_json()) == gpu
    assert len({dev.key, gpu.key, replace(dev, isa=dev.isa[1:]).key}) == 3


def test_pack_is_deterministic(tmp_path: Path, store: BlobStore) -> None:
    a = cache_folder(tmp_path / "a")
    b = cache_folder(tmp_path / "b")
    for src, dst in [(a / "vllm/torch_compile_cache/1f2e/kernel.so",
                      b / "vllm/torch_compile_cache/1f2e/kernel.so")]:
        dst.write_bytes(src.read_bytes())
    os.utime(b / "inductor" / "fxgraph" / "ab" / "entry", (1, 1))
    (b / "inductor" / "fxgraph" / "ab" / "entry").chmod(0o600)
    (b / "home" / ".sock-like-link").symlink_to("/etc/passwd")  # points out: left out
    da, _, na = warmcache.pack(store, a)
    db, _, nb = warmcache.pack(store, b)
    assert da == db and na == nb == 10
    raw = zstandard.ZstdDecompressor().stream_reader(store.path(da).open("rb"))
    with tarfile.open(fileobj=raw, mode="r|") as tar:
        members = [(m.name, m.mtime, m.uid, m.mode) for m in tar]
    assert [m[0] for m in members][:3] == ["home", "inductor", "vllm"]
    assert dict((m[0], m[3]) for m in members)["inductor/fxgraph/ab/entry"] == 0o644
    assert {m[1] for m in members} == {0} and {m[2] for m in members} == {0}


def test_round_trip_and_the_ready_note(tmp_path: Path, store: BlobStore,
                                       device: Device) -> None:
    folder = cache_folder(tmp_path / "cache")
    art = warmcache.make(store, folder, subject=SUBJECT, image=IMAGE, device=device)
    assert warmcache.listed(store.root, IMAGE) == {device.key: art.digest}
    chosen = warmcache.choose(store, IMAGE, device)
    assert chosen == art
    doc = json.loads(store.path(art.digest).read_bytes())
    assert doc["artifactType"] == warmcache.ARTIFACT_TYPE and doc["subject"]["digest"] == IMAGE
    warmcache.unpack(store, art, tmp_path / "out")
    so = "vllm/torch_compile_cache/1f2e/kernel.so"
    assert (tmp_path / "out" / so).read_bytes() == (folder / so).read_bytes()
    assert os.readlink(tmp_path / "out" / "vllm" / "latest") == "torch_compile_cache/1f2e"
    with warmuse.attached(store, IMAGE, 0, cold=False) as use:
        if use.artifact is None:  # this machine's CPU is not the fixture's: nothing used
            assert use.note.startswith("no warm cache: only for another device")
        else:
            assert use.host is not None and (use.host / so).is_file()
    with warmuse.attached(store, OTHER_IMAGE, 0, cold=False) as use:
        assert use.host is None and use.note == ("no warm cache: none found for this image "
                                                 "(make one with `frank warm`)")
    with warmuse.attached(store, IMAGE, 0, cold=True) as use:
        assert use.host is not None and [p.name for p in use.host.rglob("*")] == ["home", ".cache"]
        assert use.env["TORCHINDUCTOR_CACHE_DIR"] == "/frank/warm/inductor"
        assert use.note.startswith("no warm cache (--no-warm-cache")


def test_this_machine_uses_its_own_artifact(tmp_path: Path, store: BlobStore) -> None:
    here = cpu_identity()
    folder = cache_folder(tmp_path / "cache")
    art = warmcache.make(store, folder, subject=SUBJECT, image=IMAGE, device=here)
    with warmuse.attached(store, IMAGE, 0, cold=False) as use:
        assert use.artifact == art and use.host is not None
        assert use.note.startswith(f"warm cache {art.digest} (made on {here.describe()}")
        assert use.mode in ("overlay", "copy")
        (use.host / "inductor" / "new-entry").write_text("added by the engine")
        lower = use.host.parent / "lower"
        assert not (lower / "inductor" / "new-entry").exists() or use.mode == "copy"
    assert not use.host.exists()  # unmounted and removed after the run


def _forge_device(store: BlobStore, art: warmcache.Artifact, other: Device, *,
                  consistent: bool) -> str:
    """The artifact's manifest with another device identity; ``consistent``: its digest
    recomputed and the index entry moved, as a forger who can write the store would."""
    doc = art.doc
    doc["annotations"][warmcache.DEVICE_ANNOTATION] = other.canonical()
    raw = canonical_json(doc)
    if not consistent:
        path = store.path(art.digest)
        path.chmod(0o644)
        path.write_bytes(raw)
        return art.digest
    digest = store.put_bytes(raw)
    entry = warmcache.index_dir(store.root) / IMAGE.split(":")[1] / art.device.key
    entry.write_text(digest + "\n")
    return digest


def test_an_edited_device_identity_is_never_used(tmp_path: Path, store: BlobStore,
                                                 device: Device) -> None:
    art = warmcache.make(store, cache_folder(tmp_path / "c"), subject=SUBJECT, image=IMAGE,
                         device=device)
    other = replace(device, isa=(*device.isa, "avx512_fp16"))
    _forge_device(store, art, other, consistent=True)
    with pytest.raises(warmcache.WarmRefused, match="made on another device"):
        warmcache.choose(store, IMAGE, device)
    # the artifact of another device under its own key: not used here, said so
    with pytest.raises(warmcache.WarmRefused, match="only for another device"):
        warmcache.choose(store, IMAGE, other)
    art2 = warmcache.make(store, cache_folder(tmp_path / "d"), subject=SUBJECT, image=IMAGE,
                          device=device)
    _forge_device(store, art2, other, consistent=False)
    with pytest.raises(warmcache.WarmRefused, match="does not match its digest"):
        warmcache.choose(store, IMAGE, device)


def test_another_image_is_never_used(tmp_path: Path, store: BlobStore, device: Device) -> None:
    art = warmcache.make(store, cache_folder(tmp_path / "c"), subject=SUBJECT, image=IMAGE,
                         device=device)
    entry = warmcache.index_dir(store.root) / OTHER_IMAGE.split(":")[1] / device.key
    entry.parent.mkdir(parents=True)
    entry.write_text(art.digest)  # the index names it under another image
    with pytest.raises(warmcache.WarmRefused, match=f"is for image {IMAGE}"):
        warmcache.choose(store, OTHER_IMAGE, device)


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_layer_is_refused_in_one_line(tmp_path: Path, store: BlobStore,
                                                device: Device, damage: str) -> None:
    art = warmcache.make(store, cache_folder(tmp_path / "c"), subject=SUBJECT, image=IMAGE,
                         device=device)
    path = store.path(art.layer)
    data = bytearray(path.read_bytes())
    path.chmod(0o644)
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    else:
        path.write_bytes(bytes(data[: len(data) // 2]))
    dest = tmp_path / "out"
    with pytest.raises(warmcache.WarmRefused) as caught:
        warmcache.unpack(store, warmcache.choose(store, IMAGE, device), dest)
    line = str(caught.value)
    assert "\n" not in line and art.digest in line
    assert ("corrupt or cut short" in line) or ("does not match its digest" in line)
    assert not dest.exists()
    here = replace(device)
    with warmuse.attached(store, IMAGE, 0, cold=False) as use:  # the engine starts cold
        assert use.host is None and use.note.startswith("no warm cache")
        del here


def _bad_layer(store: BlobStore, members: list[tarfile.TarInfo]) -> str:
    import io

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for m in members:
            tar.addfile(m, io.BytesIO(b"x" * m.size) if m.isreg() else None)
    return store.put_bytes(zstandard.ZstdCompressor().compress(buf.getvalue()))


@pytest.mark.parametrize("member", ["../escape", "/abs", "link-out", "fifo"])
def test_a_member_outside_the_folder_is_refused(tmp_path: Path, store: BlobStore,
                                                device: Device, member: str) -> None:
    m = tarfile.TarInfo(member)
    if member == "link-out":
        m.type, m.linkname = tarfile.SYMTYPE, "../../etc/passwd"
    elif member == "fifo":
        m.type = tarfile.FIFOTYPE
    else:
        m.size = 1
    layer = _bad_layer(store, [m])
    art = warmcache.make(store, cache_folder(tmp_path / "c"), subject=SUBJECT, image=IMAGE,
                         device=device)
    forged = replace(art, layer=layer, layer_size=store.path(layer).stat().st_size)
    with pytest.raises(warmcache.WarmRefused, match=r"outside the folder|out of the folder|"
                       r"neither a file"):
        warmcache.unpack(store, forged, tmp_path / "out")
    assert not (tmp_path / "out").exists() and not (tmp_path / "escape").exists()


KILLED = """
import sys, time
from pathlib import Path
from frank.run import warmcache
from frank.run.device import cpu_identity
from frank.store.blobs import BlobStore
real = warmcache.write_tar
def slow(folder, out):
    out.write(b"x" * (1 << 20))
    print("packing", flush=True)
    time.sleep(60)
    return real(folder, out)
warmcache.write_tar = slow
warmcache.make(BlobStore(Path(sys.argv[1])), Path(sys.argv[2]),
               subject={"mediaType": "m", "digest": sys.argv[3], "size": 1},
               image=sys.argv[3], device=cpu_identity())
"""


def test_a_killed_warm_leaves_nothing_half_written(tmp_path: Path) -> None:
    folder = cache_folder(tmp_path / "c")
    root = tmp_path / "store"
    proc = subprocess.Popen([sys.executable, "-c", KILLED, str(root), str(folder), IMAGE],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "packing"
    assert any((root / "tmp").iterdir())  # the blob being written
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not warmcache.index_dir(root).exists() or not any(
        warmcache.index_dir(root).rglob("*"))
    BlobStore(root)  # the next user of the store removes what the killed one left
    assert not any((root / "tmp").iterdir())
    assert not any((root / "blobs" / "sha256").iterdir())


def test_gc_collects_the_warm_caches_of_images_no_longer_kept(tmp_path: Path,
                                                              device: Device) -> None:
    from frank.ship.gc import collect

    root = tmp_path / "store"
    store = BlobStore(root)
    kept = warmcache.make(store, cache_folder(tmp_path / "a"), subject=SUBJECT, image=IMAGE,
                          device=device)
    gone_subject = dict(SUBJECT, digest=OTHER_IMAGE)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "only-here").write_text("of the image no longer kept")
    gone = warmcache.make(store, tmp_path / "b", subject=gone_subject, image=OTHER_IMAGE,
                          device=device)
    # a repo whose out/ holds the kept image (its manifest blob)
    repo = tmp_path / "repo"
    blobs = repo / "out" / "kept" / "image" / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    (blobs / IMAGE.split(":")[1]).write_text("{}")
    del store
    from frank.store.blobs import leave_users

    leave_users(root)
    old = time.time() - 30 * 86400
    for p in (root / "blobs" / "sha256").iterdir():
        os.utime(p, (old, old), follow_symlinks=False)
    done = collect(root, repo, keep_days=7, wait=5)
    assert done.removed.get("warm caches") == 1
    assert not (warmcache.index_dir(root) / OTHER_IMAGE.split(":")[1]).exists()
    have = {p.name for p in (root / "blobs" / "sha256").iterdir()}
    for digest in (kept.digest, kept.layer, sha256_bytes(warmcache.EMPTY_BLOB)):
        assert digest.split(":")[1] in have
    assert gone.layer.split(":")[1] not in have and gone.digest.split(":")[1] not in have


def test_a_trial_arm_never_mixes_cold_and_warm_starts(tmp_path: Path) -> None:
    from frank.errors import FrankError
    from frank.trial.results import StartRecord
    from frank.trial.run import check_same_warm

    def rec(start: int, arm: str, warm: str | None) -> StartRecord:
        return StartRecord(start=start, block=0, arm=arm, digest="sha256:" + "0" * 64,
                           image=IMAGE, trial="t", status="ok", warm_cache=warm)

    art = "sha256:" + "ef" * 32
    before = [rec(1, "A", art), rec(2, "B", "none: none found for this image")]
    check_same_warm(rec(3, "A", art), before, tmp_path / "results.jsonl")
    check_same_warm(rec(4, "B", "none: only for another device"), before, tmp_path / "r")
    with pytest.raises(FrankError, match="must not mix cold and warm"):
        check_same_warm(rec(5, "A", "none: none found for this image"), before, tmp_path / "r")
    with pytest.raises(FrankError, match="must not mix cold and warm"):
        check_same_warm(rec(6, "B", art), before, tmp_path / "r")


def test_registry_round_trip_push_pull_verify(tmp_path: Path, device: Device) -> None:
    """Pushed as a referrer of the pushed manifest (docker-registry has no referrers API:
    the sha256-<hex> tag lists it), pulled into an empty store by digest for this device
    only, checked by `verify`; a layer changed in the registry is refused."""
    from frank.ship import warmremote
    from frank.ship.attest import VerifyFailed
    from tests.image.conftest import start_registry, stop

    proc, where = start_registry(tmp_path / "registry")
    try:
        repo = f"{where}/warm/test"
        store = BlobStore(tmp_path / "a")
        art = warmcache.make(store, cache_folder(tmp_path / "c"), subject=SUBJECT,
                             image=IMAGE, device=device)
        pushed_subject = dict(SUBJECT, digest="sha256:" + "99" * 32)  # a compressed form
        pushed = warmremote.push(store, repo, IMAGE, pushed_subject)
        assert [(p.device, p.scheme) for p in pushed] == [(device.key, "tag")]
        other = replace(device, cpu_model="Another CPU")
        empty = BlobStore(tmp_path / "b")
        assert warmremote.pull(empty, repo, pushed_subject["digest"], IMAGE, other) is None
        got = warmremote.pull(empty, repo, pushed_subject["digest"], IMAGE, device)
        assert got is not None and got.layer == art.layer and got.image == IMAGE
        assert warmcache.choose(empty, IMAGE, device).digest == got.digest
        checked = warmremote.verify(repo, pushed_subject["digest"], IMAGE)
        assert [c.layer for c in checked] == [art.layer]
        with pytest.raises(VerifyFailed, match="is for image"):
            warmremote.verify(repo, pushed_subject["digest"], OTHER_IMAGE)
    finally:
        stop(proc)
