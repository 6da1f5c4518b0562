"""Issue 54 item 7: an official base pinned by digest, without a path to its registry.

A small engine image (one distribution) is pushed to the session's docker-registry on
127.0.0.1 and saved from it with skopeo (``oci-archive:``), as a user would on a machine
that reaches the registry. The repo pins it under a registry that cannot be reached: its
contents are refused in one line naming the host and what to do; ``frank image import``
of the saved file is checked against the pin and filed exactly as a pull files it; every
later read is offline; a file that does not hold the pin, a changed blob and a classic
``docker save`` archive are refused in one line.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from frank.errors import FrankError
from frank.image.inventory import inventory_for
from frank.image.remote import pull_pinned, push_layout
from frank.store.blobs import BlobStore
from tests.image.image_helpers import free_port
from tests.oci_helpers import tar_of, write_layout
from tests.spine_helpers import frank

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("skopeo") is None, reason="skopeo not installed")]

SITE = "usr/lib/python3/dist-packages"
RECORD = b"eng/__init__.py,,\neng-1.0.dist-info/METADATA,,\neng-1.0.dist-info/RECORD,,\n"


@pytest.fixture(scope="module")
def saved(registry: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """(the saved oci-archive, the pinned digest, the registry repo it was pushed to)."""
    top = tmp_path_factory.mktemp("import")
    layer = tar_of({f"{SITE}/eng/__init__.py": b"ENG = 1\n",
                    f"{SITE}/eng-1.0.dist-info/METADATA": b"Name: eng\nVersion: 1.0\n",
                    f"{SITE}/eng-1.0.dist-info/RECORD": RECORD})
    layout = write_layout(top / "engine", [layer])
    repo = f"{registry}/vendor/engine"
    digest = push_layout(layout, repo, ["v1"]).digest
    archive = top / "engine.tar"
    subprocess.run(["skopeo", "copy", "--quiet", "--preserve-digests",
                    "--src-tls-verify=false", f"docker://{repo}@{digest}",
                    f"oci-archive:{archive}"], check=True)
    return archive, digest, repo


def _repo(tmp_path: Path, ref: str) -> Path:
    root = tmp_path / "repo"
    (root / "images").mkdir(parents=True)
    (root / "parts").mkdir()
    (root / "stacks").mkdir()
    (root / "images/vendor-engine.toml").write_text(
        f'name = "vendor-engine"\ndescription = "an official engine image"\nref = "{ref}"\n')
    return root


def test_an_unreachable_registry_is_one_line_naming_the_host_and_the_way_out(
        saved: tuple[Path, str, str], tmp_path: Path) -> None:
    _, digest, _ = saved
    host = f"127.0.0.1:{free_port()}"  # nothing listens there
    root = _repo(tmp_path, f"{host}/vendor/engine@{digest}")
    with pytest.raises(FrankError) as info:
        inventory_for(root / "images/vendor-engine.toml", BlobStore(tmp_path / "cache"))
    line = info.value.one_line()
    assert f"the registry {host} cannot be reached" in line, line
    assert "frank image import FILE" in line and "Error parsing image name" not in line


def test_an_imported_image_is_used_as_if_pulled_and_never_asks_the_registry(
        saved: tuple[Path, str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from frank.image.inventory import pulled_layout

    archive, digest, repo = saved
    host = f"127.0.0.1:{free_port()}"
    root = _repo(tmp_path, f"{host}/vendor/engine@{digest}")
    monkeypatch.setenv("FRANK_CACHE", str(tmp_path / "cache"))
    done = frank("image", "import", str(archive), "--json", cwd=root)
    assert done.code == 0, done.err
    assert [x["file"] for x in json.loads(done.out)["imported"]] == ["images/vendor-engine.toml"]
    store = BlobStore(tmp_path / "cache")
    # exactly what a pull of the same pin files: the same layout, the same record
    pulled = tmp_path / "pulled"
    pull_pinned(repo, digest, pulled)
    mine = pulled_layout(store, digest)
    assert (mine / "index.json").read_bytes() == (pulled / "index.json").read_bytes()
    assert sorted(p.name for p in (mine / "blobs/sha256").iterdir()) == \
        sorted(p.name for p in (pulled / "blobs/sha256").iterdir())
    assert mine.with_name(mine.name + ".pinned").read_text() == \
        pulled.with_name("pulled.pinned").read_text()
    # offline from here on: the registry named in the pin does not exist
    inventory = inventory_for(root / "images/vendor-engine.toml", store, offline=True)
    assert inventory.versions() == {"eng": "1.0"}


def test_a_file_without_the_pinned_image_or_with_a_changed_blob_is_refused(
        saved: tuple[Path, str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from frank.image.inventory import pulled_layout

    archive, digest, _ = saved
    monkeypatch.setenv("FRANK_CACHE", str(tmp_path / "cache"))
    root = _repo(tmp_path, f"127.0.0.1:{free_port()}/vendor/engine@{digest}")
    other = write_layout(tmp_path / "other", [tar_of({"x": b"y"})])
    line = frank("image", "import", str(other), cwd=root).err.strip()
    assert "holds none of the pinned images: images/vendor-engine.toml" in line, line
    # the same archive with one layer byte changed
    out = tmp_path / "changed.tar"
    with tarfile.open(archive) as src, tarfile.open(out, "w") as dst:
        for member in src:
            data = src.extractfile(member).read() if member.isfile() else b""  # type: ignore[union-attr]
            if member.isfile() and member.size > 1000:  # the layer: the largest blob
                data = data[:-1] + bytes([data[-1] ^ 1])
            dst.addfile(member, io.BytesIO(data) if member.isfile() else None)
    result = frank("image", "import", str(out), cwd=root)
    assert result.code == 2 and "do not match" in result.err, result.err
    assert not pulled_layout(BlobStore(tmp_path / "cache"), digest).exists()


def test_a_classic_docker_save_is_refused_saying_how_to_save_one(
        saved: tuple[Path, str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, digest, _ = saved
    monkeypatch.setenv("FRANK_CACHE", str(tmp_path / "cache"))
    root = _repo(tmp_path, f"127.0.0.1:{free_port()}/vendor/engine@{digest}")
    classic = tmp_path / "classic.tar"
    with tarfile.open(classic, "w") as tar:
        data = b'[{"Config": "c.json", "Layers": ["l/layer.tar"]}]'
        info = tarfile.TarInfo("manifest.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    result = frank("image", "import", str(classic), cwd=root)
    assert result.code == 2 and len(result.err.strip().splitlines()) == 1, result.err
    assert "keeps no registry manifest" in result.err and "oci-archive" in result.err
