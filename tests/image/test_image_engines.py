"""Real container-engine builds and runs (buildah, chroot isolation, vfs storage)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from frank.assemble.baselayout import BaseImage
from frank.assemble.engines import build_dockerfile, detect, get_engine, run_image
from frank.errors import FrankError
from frank.image.oci import build_image, read_layout
from frank.image.spec import ImageSpec, LayerInput
from frank.store.blobs import BlobStore
from tests.image.image_helpers import EPOCH, key_of, make_sources, make_spec

needs_buildah = pytest.mark.skipif(shutil.which("buildah") is None, reason="buildah missing")

DOCKERFILE = """\
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG SOURCE_DATE_EPOCH
ARG BASE_DIGEST
RUN python3 -c "import sys; v = '%d.%d' % sys.version_info[:2]; \\
    open('/built.txt', 'w').write('epoch=$SOURCE_DATE_EPOCH base=$BASE_DIGEST py=' + v)"
ENTRYPOINT ["/bin/cat", "/built.txt"]
"""


def test_missing_engine_names_what_to_install(monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no engines on this PATH
    store = BlobStore(tmp_path / "c")
    assert detect(store) == []
    with pytest.raises(FrankError, match="apt-get install buildah"):
        get_engine("auto", store)
    with pytest.raises(FrankError, match="apt-get install podman"):
        get_engine("podman", store)


def test_docker_counts_only_with_a_daemon(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "c")
    names = [e.name for e in detect(store)]
    if "docker" not in names:
        with pytest.raises(FrankError, match="Docker daemon"):
            get_engine("docker", store)


@pytest.mark.slow
@needs_buildah
@pytest.mark.parametrize("name", ["buildah", "podman"])
def test_engine_builds_a_run_step(tmp_path: Path, test_base: BaseImage, name: str) -> None:
    if shutil.which(name) is None:
        pytest.skip(f"{name} missing")
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(DOCKERFILE)
    store = BlobStore(tmp_path / "cache")
    engine = get_engine(name, store)
    d1 = build_dockerfile(engine, ctx, tmp_path / "out1", base_layout=test_base.layout,
                          base_digest=test_base.digest, source_date_epoch=EPOCH, store=store)
    info = read_layout(tmp_path / "out1")
    assert info.digest == d1 and info.created == "2023-11-14T22:13:20Z"
    assert len(info.layers) == 2
    assert info.layers[0].digest == read_layout(test_base.layout).layers[0].digest
    assert all(x.media_type.endswith(".tar") for x in info.layers), info.layers
    proc = run_image(tmp_path / "out1", engine=get_engine("buildah", store))
    assert proc.stdout == f"epoch={EPOCH} base={test_base.digest} py=3.11"
    # the same Dockerfile, epoch and base give the same digest again
    d2 = build_dockerfile(engine, ctx, tmp_path / "out2", base_layout=test_base.layout,
                          base_digest=test_base.digest, source_date_epoch=EPOCH, store=store)
    assert d2 == d1


@pytest.mark.slow
@needs_buildah
def test_failed_run_step_leaves_no_output(tmp_path: Path, test_base: BaseImage) -> None:
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text("ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\n"
                                    "RUN echo half > /half && false\n")
    engine = get_engine("buildah", BlobStore(tmp_path / "cache"))
    with pytest.raises(FrankError) as exc:
        build_dockerfile(engine, ctx, tmp_path / "out", base_layout=test_base.layout,
                         base_digest=test_base.digest, source_date_epoch=EPOCH)
    assert "\n" not in exc.value.one_line() and "build" in exc.value.one_line()
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []


@pytest.mark.slow
@needs_buildah
def test_run_entrypoint_of_a_daemonless_image(tmp_path: Path, test_base: BaseImage) -> None:
    """An image from the embedded builder runs for real: its entrypoint reads the lock."""
    src = make_sources(tmp_path / "src")
    reader = tmp_path / "entry.py"
    reader.write_text(
        "import os, sys\n"
        "lock = open('/etc/frank/frank.lock').read()\n"
        "print('stack=' + os.environ['FRANK_STACK'])\n"
        "print('args=' + ' '.join(sys.argv[1:]))\n"
        "print(lock, end='')\n"
        "sys.exit(3 if '--fail' in sys.argv else 0)\n")
    spec = make_spec(test_base, src)
    spec = ImageSpec(**{**spec.__dict__,
                        "layers": (*spec.layers, LayerInput("entrypoint", key_of("entry"),
                                                            ((reader, "/opt/frank/entry.py"),))),
                        "entrypoint": ["python3", "/opt/frank/entry.py"], "cmd": ["--serve"]})
    out = tmp_path / "out"
    build_image(spec, BlobStore(tmp_path / "cache"), out)
    engine = get_engine("buildah", BlobStore(tmp_path / "cache"))
    proc = run_image(out, ["--print"], engine=engine)
    lines = proc.stdout.splitlines()
    assert lines[:2] == ["stack=demo", "args=--print"]
    assert "\n".join(lines[2:]) + "\n" == src["lock"].read_text()
    assert run_image(out, engine=engine).stdout.splitlines()[1] == "args=--serve"
    with pytest.raises(FrankError, match="exited 3"):
        run_image(out, ["--fail"], engine=engine)
    assert run_image(out, ["--fail"], engine=engine, check=False).returncode == 3
