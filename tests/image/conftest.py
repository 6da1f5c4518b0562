"""Fixtures for image tests: a tiny base layout, the test base (pinned .debs), a local registry.

The registry is Debian's ``docker-registry`` (distribution v2) on a free loopback port with
its own config and storage, started once per session and stopped at the end.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from frank.assemble.base import resolve_base
from frank.assemble.baselayout import BaseImage, layout_from_rootfs
from frank.store.blobs import BlobStore
from tests.image.image_helpers import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def store(tmp_path: Path) -> BlobStore:
    """A fresh, empty cache for one test."""
    return BlobStore(tmp_path / "cache")


@pytest.fixture(scope="session")
def mini_base(tmp_path_factory: pytest.TempPathFactory) -> BaseImage:
    """A tiny one-layer base (a few files), so most tests need no Debian packages."""
    d = tmp_path_factory.mktemp("mini-base")
    root = d / "rootfs"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "os-release").write_text("ID=frank-mini\n")
    (root / "bin").mkdir()
    (root / "bin" / "tool").write_text("#!/bin/sh\necho tool\n")
    (root / "bin" / "tool").chmod(0o755)
    digest = layout_from_rootfs(root, BlobStore(d / "cache"), d / "layout", epoch=0,
                                created_by="mini base for tests")
    return BaseImage(name="mini", layout=d / "layout", digest=digest)


@pytest.fixture(scope="session")
def test_base() -> BaseImage:
    """The Debian base of images/test-base.toml (pinned .debs), made once per cache."""
    return resolve_base(REPO_ROOT / "images" / "test-base.toml", BlobStore(), quiet=True)


def start_registry(workdir: Path, *, readonly: bool = False,
                   auth: bool = False) -> tuple[subprocess.Popen[bytes], str]:
    """Start docker-registry on a free port; return (process, "127.0.0.1:PORT"). ``auth``:
    htpasswd logins with its path a folder, as Debian's packaged config has it."""
    exe = shutil.which("docker-registry")
    if exe is None:
        pytest.skip("docker-registry not installed (apt-get install docker-registry)")
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    ro = "  maintenance:\n    readonly:\n      enabled: true\n" if readonly else ""
    config = workdir / "config.yml"
    config.write_text(
        "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n"
        f"    rootdirectory: {workdir / 'data'}\n{ro}"
        f"http:\n  addr: 127.0.0.1:{port}\n"
        + (f"auth:\n  htpasswd:\n    realm: basic-realm\n    path: {workdir}\n" if auth else "")
    )
    log = (workdir / "registry.log").open("wb")
    proc = subprocess.Popen([exe, "serve", str(config)], stdout=log, stderr=log,
                            env={**os.environ, "OTEL_TRACES_EXPORTER": "none"})
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1):
                return proc, f"127.0.0.1:{port}"
        except urllib.error.HTTPError as exc:
            if exc.code == 401 and auth:
                return proc, f"127.0.0.1:{port}"
            time.sleep(0.1)
        except (urllib.error.URLError, OSError):
            if proc.poll() is not None:
                break
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"docker-registry did not start; see {workdir / 'registry.log'}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop a process we started, by its own handle."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A running local registry: yields ``127.0.0.1:PORT``."""
    proc, addr = start_registry(tmp_path_factory.mktemp("registry"))
    try:
        yield addr
    finally:
        stop(proc)


@pytest.fixture(scope="session")
def readonly_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A registry in read-only maintenance mode: it answers, and refuses every push."""
    proc, addr = start_registry(tmp_path_factory.mktemp("registry-ro"), readonly=True)
    try:
        yield addr
    finally:
        stop(proc)
