"""Docker as an engine, through the docker SDK, against a real daemon started for this session.

What is checked on the daemon itself: an image frank loads gets the layout's config digest
as its id (a layout whose config lies about a layer's diff_id is refused by the daemon, and
a blob changed after the manifest was read stops the stream); the lock's GPUs become a device
request on the container; and served-cpu, built by frank, runs under `frank run --engine
docker` end to end: a chat completion with the patch's header, then SIGTERM, a clean exit
and no container left. `--builder docker` builds a post-install step offline with the legacy
builder, twice from empty daemon storage to one digest, refuses a step that needs the network
up front, and refuses an export whose bytes are not the image the daemon named (and a base
edited in the daemon's storage, loaded anew by the next build). Slow: one
daemon start (a few seconds), one compose of served-cpu
(its layers come from the session's cache when test_served_cpu built them first), one load
and one engine start; the whole file took 337 s on the shared 2-core machine under a load
average of about 12 (2026-12-02), less on a quiet one; 365 s on 2026-12-03 (load about 4, a
cold cache), of which the three `--builder docker` tests 75 s (then three builds of the step;
four since, one refused: 70 s on their own with the daemon's start, load about 4).
"""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from frank.errors import FrankError
from frank.image.oci import resolve_manifest
from tests.docker_daemon import dockerd, why_not
from tests.fixtures.local_hub import publish
from tests.fixtures.tiny_model import build_tiny_model
from tests.oci_helpers import tar_of, write_layout
from tests.spine_helpers import copy_repo, frank
from tests.vllm_server import free_port

pytestmark = [pytest.mark.slow]

STACK = "stacks/docker-cpu.toml"
TAMPERED = "TAMPERED"


@pytest.fixture(scope="module")
def docker_host() -> Iterator[str]:
    """A daemon of this module: its data root (2.2 GB of served-cpu) goes when it ends."""
    why = why_not()
    if why:
        pytest.skip(why)
    with dockerd() as host:
        yield host


@pytest.fixture
def client(docker_host: str) -> Iterator[Any]:
    import docker

    c = docker.DockerClient(base_url=docker_host, timeout=600)
    yield c
    c.close()


def tiny_layout(out: Path, *, diff_id: str | None = None) -> Path:
    """A one-layer layout (frank's form); ``diff_id`` makes its config lie about the layer."""
    return write_layout(out, [tar_of({"hello.txt": b"hello\n" * 1000})],
                        diff_ids=[diff_id] if diff_id else None)


def config_digest(layout: Path) -> str:
    return str(resolve_manifest(layout)[2]["config"]["digest"])


def test_a_loaded_image_has_the_config_digest_as_its_id(client: Any, tmp_path: Path) -> None:
    from frank.assemble.dockerapi import load_layout

    layout = tiny_layout(tmp_path / "ok")
    loaded = load_layout(client, layout, "frank-test:tiny", reuse=False)
    assert loaded.id == config_digest(layout) == client.images.get("frank-test:tiny").id
    assert not loaded.reused
    again = load_layout(client, layout, "frank-test:tiny")
    assert again.reused and again.id == loaded.id


def test_the_daemon_refuses_a_config_that_lies_about_a_layer(client: Any,
                                                             tmp_path: Path) -> None:
    from frank.assemble.dockerapi import load_layout

    layout = tiny_layout(tmp_path / "lie", diff_id="sha256:" + "0" * 64)
    with pytest.raises(FrankError, match="invalid diffID for layer 0"):
        load_layout(client, layout, "frank-test:lie", reuse=False)


def test_a_layer_changed_after_the_manifest_was_read_stops_the_load(client: Any,
                                                                    tmp_path: Path) -> None:
    from frank.image.dockerarchive import docker_archive

    layout = tiny_layout(tmp_path / "edit")
    stream = docker_archive(layout, "frank-test:edit")
    head = next(stream)  # the manifest is read and checked; now a layer is edited
    layer = next(p for p in (layout / "blobs" / "sha256").iterdir() if p.stat().st_size > 1000)
    data = bytearray(layer.read_bytes())
    data[600] ^= 1
    layer.write_bytes(bytes(data))
    with pytest.raises(FrankError, match="changed while it was sent"):
        client.api.load_image(itertools.chain([head], stream))
    assert not [i for i in client.images.list() if "frank-test:edit" in i.tags]


def test_the_locks_gpus_become_a_device_request(client: Any, tmp_path: Path) -> None:
    """Made, not started: this daemon has no NVIDIA runtime (and this machine no GPU)."""
    from frank.assemble.dockerapi import load_layout
    from frank.run.dockerrun import DockerSpec, create_kwargs

    loaded = load_layout(client, tiny_layout(tmp_path / "gpu"), "frank-test:gpu")
    spec = DockerSpec(command=["--x"], network="none", port=8000, shm_size="2g", gpus=2)
    kw = create_kwargs(spec, name="frank-test-gpu", env={"A": "1"},
                       mounts=[(str(tmp_path), "/data", True)])
    ctr = client.containers.create(loaded.ref, **kw)
    try:
        host = client.api.inspect_container(ctr.id)["HostConfig"]
        [req] = host["DeviceRequests"]
        assert (req["Count"], req["Capabilities"], req["Driver"]) == (2, [["gpu"]], "")
        assert host["ShmSize"] == 2 << 30 and host["NetworkMode"] == "none"
        assert host["Init"] is True
        assert host["Mounts"][0]["ReadOnly"] is True
    finally:
        ctr.remove(force=True)
    no_gpu = create_kwargs(DockerSpec(command=[], network="host", port=1), name="x", env={},
                           mounts=[])
    assert "device_requests" not in no_gpu


def test_the_daemons_copy_is_checked_and_killed_runs_containers_go(
        client: Any, docker_host: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """(Issue 44 items 1 and 13, one test: the daemon is shared.) The daemon reuses an image
    it holds by id without reading its layers again: a file edited in its storage is found
    in the container's root before it starts, and the image loaded again from the layout;
    the daemon's own files and the mount points are no difference. And a run's container
    whose run was killed (its owner label names a pid gone, on this machine) is removed;
    one of a live run, or of another machine, stays."""
    from frank.run.dockerrun import DockerSpec, checked_container, create_kwargs, remove, root_tree
    from frank.run.enginecopy import expected_tree

    layout = tiny_layout(tmp_path / "edited")
    digest = resolve_manifest(layout)[0]
    kw = create_kwargs(DockerSpec(command=["/hello.txt"], network="none", port=1),
                       name="frank-test-edited", env={}, mounts=[(str(tmp_path), "/data", True)])
    checked_container(client, layout, digest, "frank-test:edited", kw).remove(force=True)
    assert "imported it again" not in capfd.readouterr().err  # untouched: nothing differs
    root = Path(docker_host.removeprefix("unix://")).parent / "root"
    [stored] = [p for p in root.glob("overlay2/*/diff/hello.txt")]
    stored.write_text(TAMPERED)
    ctr = checked_container(client, layout, digest, "frank-test:edited", kw)
    try:
        assert "/hello.txt has other content); imported it again" in capfd.readouterr().err
        assert root_tree(client, ctr)["/hello.txt"] == expected_tree(layout, digest)["/hello.txt"]
        assert [p.read_text()[:6] for p in root.glob("overlay2/*/diff/hello.txt")] == ["hello\n"]
    finally:
        ctr.remove(force=True)
    from frank.run.dockerrun import OWNER_LABEL, owner, reap

    gone_pid = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True).stdout.strip()
    here = owner().rpartition("/")[0]
    owners = {"frank-run-dead0000d0c4": f"{here}/{gone_pid}", "frank-run-a11e0000d0c4": owner(),
              "frank-run-e15e0000d0c4": f"another-boot/pid:[1]/{gone_pid}"}
    for name, who in owners.items():
        client.containers.create("frank-test:edited", ["/hello.txt"], name=name,
                                 labels={OWNER_LABEL: who})
    try:
        assert reap(client) == ["frank-run-dead0000d0c4"]
        assert {c.name for c in client.containers.list(all=True)} >= \
            {"frank-run-a11e0000d0c4", "frank-run-e15e0000d0c4"}
    finally:
        for name in owners:
            remove(client, name)


# ----------------------------------------------------------------------------------------------
# served-cpu end to end


@pytest.fixture(scope="module")
def served_repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, Path]:
    port = free_port()
    root = copy_repo(tmp_path_factory.mktemp("docker-cpu") / "repo")
    (root / STACK).write_text(f'extends = "served-cpu.toml"\n[flags]\nport = {port}\n')
    assert frank("lock", STACK, cwd=root).code == 0
    out = subprocess.run([sys.executable, "-m", "frank", "compose", STACK, "--json"], cwd=root,
                         capture_output=True, text=True, timeout=1200)  # cold: wheels fetched
    assert out.returncode == 0, out.stderr
    base = tmp_path_factory.mktemp("docker-cpu-hub")
    publish(build_tiny_model(base / "model"), base / "hub", "frank-test/tiny-llama")
    return root, port, base / "hub"


def chat(port: int) -> tuple[dict[str, Any], dict[str, str]]:
    body = {"model": "tiny-llama", "max_tokens": 4,
            "messages": [{"role": "user", "content": "say hi"}]}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read()), {k.lower(): v for k, v in resp.headers.items()}


def test_served_cpu_runs_under_docker_end_to_end(served_repo: tuple[Path, int, Path],
                                                 docker_host: str, client: Any,
                                                 tmp_path: Path) -> None:
    import os

    root, port, hub = served_repo
    log = tmp_path / "run.log"
    env = {**os.environ, "DOCKER_HOST": docker_host}
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "frank", "run", STACK, "--engine",
                                 "docker", "--hub-cache", str(hub), "--wait-ready", "400"],
                                cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 460
        while "frank: ready: docker-cpu" not in log.read_text(errors="replace"):
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(1)
        reply, headers = chat(port)
        assert reply["choices"][0]["message"]["content"]
        assert headers["x-frank-patch"] == "patch-header/1"  # the patched engine is what runs
        # the container runs the image the daemon holds under the layout's config digest
        layout = root / "out" / "docker-cpu" / "image"
        ctrs = client.containers.list(filters={"label": "dev.frank.image"})
        assert len(ctrs) == 1
        ctr = ctrs[0]
        assert ctr.attrs["Image"] == config_digest(layout)
        host = ctr.attrs["HostConfig"]
        assert host["NetworkMode"] == "host" and host["ShmSize"] == 1 << 30
        assert {m["Destination"]: m["RW"] for m in ctr.attrs["Mounts"]}["/frank/hub"] is False
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text(errors="replace")[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text(errors="replace")
    # one ready line, the image and the lock each labelled (the launcher's own is not passed on)
    [ready] = [ln for ln in text.splitlines() if "frank: ready:" in ln]
    assert f"image {resolve_manifest(layout)[0]} lock sha256:" in ready
    assert "frank: weights verified: tiny-llama" in text
    assert "shutdown" in text.lower()  # the engine saw the SIGTERM and shut down itself
    assert client.containers.list(all=True, filters={"label": "dev.frank.image"}) == []


# ----------------------------------------------------------------------------------------------
# --builder docker: offline steps through the legacy builder


def _compose_step(repo: Path, out: Path) -> tuple[str, str]:
    """`frank compose` of the step stack with --builder docker: (image digest, build log)."""
    from frank.image.oci import layout_manifests

    done = frank("compose", "stacks/docker-step.toml", "--builder", "docker", "--out", str(out),
                 cwd=repo)
    assert done.code == 0, done.err
    return str(layout_manifests(out / "image")[0]["digest"]), (out / "build.log").read_text()


def test_builder_docker_builds_an_offline_step_reproducibly(
        docker_host: str, client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The post-install step of tests/test_issue31_recipes.py, built by the daemon's legacy
    builder: its layer holds what the step made, offline, every file at the step's stamp. The
    same step built again, from empty daemon storage and with the step run again, is the same
    image; so is the build that takes the step's kept outputs instead of running it, once a
    base edited in the daemon's storage has been refused and loaded again."""
    import shutil
    import uuid

    from frank.store.blobs import BlobStore
    from tests.test_issue31_recipes import GEN, gen_step, layer_files

    monkeypatch.setenv("DOCKER_HOST", docker_host)
    repo = copy_repo(tmp_path / "repo")
    # a key of this run's own: no outputs kept by another test's build of the same step
    gen_step(repo, "docker-step", GEN + f"# {uuid.uuid4().hex}\n")
    assert frank("lock", "stacks/docker-step.toml", cwd=repo).code == 0
    first, log = _compose_step(repo, tmp_path / "out1")
    assert "docker build (legacy builder, through the SDK" in log and "--mount" not in log
    assert "outputs kept for key" in log
    layers = layer_files(tmp_path / "out1/image")
    [made] = [x for x in layers if "opt/frank/gen/archs.txt" in x]
    assert made["opt/frank/gen/archs.txt"] == b"12.0f\n"
    assert made["opt/frank/gen/network.txt"] == b"offline\n"  # network none
    assert not any("scratch-not-kept" in n or "opt/frank/steps" in n for x in layers for n in x)
    # every entry the build added carries the step's stamp, as buildah's --timestamp does
    import re
    import tarfile

    from frank.image.oci import layout_blob_path, resolve_manifest

    stamp = int(re.findall(r"file times in the built layers: (\d+)", log)[-1])
    _, _, manifest = resolve_manifest(tmp_path / "out1/image")
    for desc in manifest["layers"][1:]:
        with tarfile.open(layout_blob_path(tmp_path / "out1/image", desc["digest"])) as tar:
            assert {(m.mtime, m.uname, m.gname) for m in tar} == {(stamp, "", "")}
    assert client.images.list(name="frank-build-*") == []  # what the build made is gone
    # again, from empty daemon storage, the step run again
    for image in client.images.list(all=True):
        client.images.remove(image.id, force=True)
    [key] = re.findall(r"step:gen-step: outputs kept for key (\w+)", log)
    [kept] = (BlobStore().root / "step-outputs").glob(f"{key}*")
    shutil.rmtree(kept)
    again, log = _compose_step(repo, tmp_path / "out2")
    assert "not run again" not in log and "Step 1/" in log
    assert again == first
    # a base edited in the daemon's storage (a build reuses the daemon's copy) is caught when
    # the result is read back; that copy goes, so the next build loads the pinned one again
    [edited] = (Path(docker_host.removeprefix("unix://")).parent / "root").glob(
        "overlay2/*/diff/etc/debian_version")
    edited.write_bytes(bytes([edited.read_bytes()[0] ^ 1]) + edited.read_bytes()[1:])
    refused = frank("compose", "stacks/docker-step.toml", "--builder", "docker", "--out",
                    str(tmp_path / "out3"), cwd=repo)
    assert refused.code == 2 and len(refused.err.strip().splitlines()) == 1, refused.err
    assert 'file integrity checksum failed for "etc/debian_version"' in refused.err
    assert "the daemon's copy of the base goes too: build again" in refused.err
    assert not (tmp_path / "out3/image").exists()
    # and with the step's outputs kept: the same image (the daemon's own hash of what a
    # COPY took, which differs for a stage and the context, is left out of the history)
    kept_too, log = _compose_step(repo, tmp_path / "out4")
    assert "its stage's outputs were kept" in log
    assert kept_too == first


def test_builder_docker_refuses_a_network_step_before_any_work(
        docker_host: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step that needs the network would need build secrets, which the legacy builder lacks:
    one line naming --builder and what to use, before a source is fetched or a base made."""
    from frank.assemble.engines import build_dockerfile, get_engine
    from frank.store.blobs import BlobStore
    from tests.test_issue31_recipes import child, source_part

    monkeypatch.setenv("DOCKER_HOST", docker_host)
    repo = copy_repo(tmp_path / "repo")
    source_part(repo, repo / "sources" / "never-fetched", "0" * 40)  # a source build: network
    child(repo, "srcbuild", {"demo-src": "1"})
    assert frank("lock", "stacks/srcbuild.toml", cwd=repo).code == 0
    out = tmp_path / "out"
    failed = frank("compose", "stacks/srcbuild.toml", "--builder", "docker", "--out", str(out),
                   cwd=repo)
    assert failed.code == 2 and len(failed.err.strip().splitlines()) == 1, failed.err
    assert failed.err.startswith("frank: error: --builder: docker builds only steps that need "
                                 "no network, and package:demo-src needs it")
    assert "use --builder buildah or podman" in failed.err
    log = out / "build.log"
    assert not log.exists() or "$ git fetch" not in log.read_text()
    assert not (out / "image").exists()
    # the engine call itself refuses a networked build the same way
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "Dockerfile").write_text("FROM scratch\n")
    with pytest.raises(FrankError, match="docker builds only steps that need no network") as exc:
        build_dockerfile(get_engine("docker", BlobStore(tmp_path / "cache")), tmp_path / "ctx",
                         tmp_path / "out", base_layout=tmp_path / "nowhere",
                         base_digest="sha256:" + "0" * 64, source_date_epoch=0)
    assert exc.value.field == "--builder"


def test_a_docker_export_that_is_not_the_image_is_refused(client: Any, tmp_path: Path) -> None:
    """What the daemon hands back is hashed as it is read: a layer whose bytes differ from its
    diff_id, or a config that is not the image the daemon named, never reaches the store as
    the image."""
    from frank.assemble.dockerapi import load_layout
    from frank.assemble.dockerbuild import read_export
    from frank.store.blobs import BlobStore

    loaded = load_layout(client, tiny_layout(tmp_path / "tiny"), "frank-test:export")
    store = BlobStore(tmp_path / "cache")
    config, layers = read_export(client.api.get_image("frank-test:export"), loaded.id, store,
                                 "export")
    assert config == loaded.id and len(layers) == 1 and store.has(layers[0])

    def flipped(chunks: Iterator[bytes]) -> Iterator[bytes]:
        done = False
        for chunk in chunks:
            at = chunk.find(b"hello\nhello\n")
            if at >= 0 and not done:
                chunk, done = chunk[:at] + b"J" + chunk[at + 1:], True
            yield chunk
        assert done

    with pytest.raises(FrankError, match=r"layer 0 the Docker daemon exported hashes to "
                                         r"sha256:\w+, its config says " + layers[0]):
        read_export(flipped(client.api.get_image("frank-test:export")), loaded.id, store,
                    "export")
    other = "sha256:" + "1" * 64
    with pytest.raises(FrankError, match=f"hashes to {config}, not the id it reports "
                                         f"for the image \\({other}\\)"):
        read_export(client.api.get_image("frank-test:export"), other, store, "export")
