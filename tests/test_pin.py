"""`frank pin`: tags, branches and releases become content pins, from local services."""

from __future__ import annotations

import hashlib
import json
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.http_helpers import serve_folder
from tests.image.conftest import start_registry, stop
from tests.spine_helpers import frank

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@x", "PATH": "/usr/bin:/bin"}


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, env=GIT_ENV, check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.fixture
def upstream(tmp_path: Path) -> tuple[str, str, str]:
    """A local git repo with a tag v1.0 and a newer main: (url, tag commit, main commit)."""
    src = tmp_path / "upstream"
    src.mkdir()
    git("init", "-q", "-b", "main", cwd=src)
    (src / "f").write_text("1")
    git("add", "f", cwd=src)
    git("commit", "-qm", "one", cwd=src)
    git("tag", "-a", "v1.0", "-m", "release", cwd=src)
    tagged = git("rev-parse", "HEAD", cwd=src)
    (src / "f").write_text("2")
    git("commit", "-qam", "two", cwd=src)
    return f"file://{src}", tagged, git("rev-parse", "HEAD", cwd=src)


def test_pin_engine_commit_from_a_tag(repo: Path, upstream: tuple[str, str, str]) -> None:
    url, tagged, _ = upstream
    manifest = repo / "parts/vllm-base/v0.24.0.toml"
    text = manifest.read_text().replace("https://github.com/vllm-project/vllm", url)
    manifest.write_text(text)
    result = frank("pin", "vllm-base@v0.24.0", "--ref", "v1.0", cwd=repo)
    assert result.code == 0, result.err
    new = manifest.read_text()
    assert f'commit = "{tagged}"' in new  # the peeled tag's commit, not the tag object
    assert new.startswith("#:schema ../../schemas/part-engine.json\n# vLLM at the v0.24.0 release")


def test_pin_patch_source_commit_from_a_branch(repo: Path,
                                               upstream: tuple[str, str, str]) -> None:
    url, _, head = upstream
    manifest = repo / "parts/mhc-overlap/moet-6cefd6fe.toml"
    manifest.write_text(manifest.read_text().replace(
        "https://github.com/kacper-daftcode/vLLM-Moet\"\nsource_commit", f"{url}\"\nsource_commit"
    ))
    assert frank("pin", "mhc-overlap", "--ref", "main", cwd=repo).code == 0
    assert f'source_commit = "{head}"' in manifest.read_text()
    bad = frank("pin", "mhc-overlap", "--ref", "no-such-branch", cwd=repo)
    assert bad.code == 2 and "has no tag or branch 'no-such-branch'" in bad.err


def test_pin_hub_branch_from_local_cache(repo: Path, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    revision = hashlib.sha1(b"tiny").hexdigest()
    refs = tmp_path / "hub/models--sfxnz--DeepSeek-V4.1-Flash-EXL3/refs"
    refs.mkdir(parents=True)
    (refs / "main").write_text(revision)
    manifest = repo / "parts/exl3-pack/2bpw-982b7045.toml"
    manifest.write_text(manifest.read_text().replace(
        'revision = "982b70452f399814f56b46272fd30394ae10d58c"', 'revision = "main"'))
    assert frank("lock", "stacks/served.toml", cwd=repo).code == 2  # a branch is refused
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = frank("pin", "exl3-pack", cwd=repo)
    assert result.code == 0, result.err
    assert f'revision = "{revision}"' in manifest.read_text()
    assert "revision: main -> " + revision in result.out
    missing = frank("pin", "exl3-pack", "--ref", "other-branch", cwd=repo)
    assert missing.code == 2 and "not in the hub cache" in missing.err


@pytest.fixture
def local_index(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A PEP 503 index on 127.0.0.1 with one wheel of exllamav3 1.6.5: (url, sha256)."""
    root = tmp_path / "index"
    wheel = root / "files" / "exllamav3-1.6.5-py3-none-any.whl"
    wheel.parent.mkdir(parents=True)
    wheel.write_bytes(b"not really a wheel, but bytes with a hash")
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    page = root / "simple" / "exllamav3" / "index.html"
    page.parent.mkdir(parents=True)
    page.write_text(f'<a href="../../files/{wheel.name}#sha256={sha}">{wheel.name}</a>\n'
                    '<a href="../../files/exllamav3-1.6.4-py3-none-any.whl#sha256='
                    + "0" * 64 + '">old</a>\n')

    with serve_folder(root) as url:
        yield f"{url}/simple", sha


def test_pin_package_wheel_from_local_index(repo: Path, local_index: tuple[str, str]) -> None:
    index, sha = local_index
    manifest = repo / "parts/exl3-runtime/1.6.5.toml"
    result = frank("pin", "exl3-runtime", "--index", index, cwd=repo)
    assert result.code == 0, result.err
    text = manifest.read_text()
    assert f'sha256 = "{sha}"' in text
    assert f'url = "{index.removesuffix("/simple")}/files/exllamav3-1.6.5-py3-none-any.whl"' \
        in text
    missing = frank("pin", "exl3-runtime", "--index", index, "--ref", "9.9.9", cwd=repo)
    assert missing.code == 2 and "has no wheel of exllamav3 9.9.9" in missing.err


def _push_tiny_image(registry: str, repo: str, tag: str) -> str:
    """Upload a config blob and a manifest through the registry API; return its digest."""
    config = b"{}"
    cdigest = "sha256:" + hashlib.sha256(config).hexdigest()
    start = urllib.request.Request(f"http://{registry}/v2/{repo}/blobs/uploads/", method="POST")
    with urllib.request.urlopen(start) as resp:
        location = resp.headers["Location"]
    sep = "&" if "?" in location else "?"
    put = urllib.request.Request(f"{location}{sep}digest={cdigest}", data=config, method="PUT",
                                 headers={"Content-Type": "application/octet-stream"})
    urllib.request.urlopen(put).close()
    manifest = json.dumps({"schemaVersion": 2,
                           "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                      "digest": cdigest, "size": len(config)},
                           "layers": []}).encode()
    req = urllib.request.Request(
        f"http://{registry}/v2/{repo}/manifests/{tag}", data=manifest, method="PUT",
        headers={"Content-Type": "application/vnd.oci.image.manifest.v1+json"})
    urllib.request.urlopen(req).close()
    return "sha256:" + hashlib.sha256(manifest).hexdigest()


def test_pin_image_tag_from_local_registry(repo: Path, tmp_path: Path) -> None:
    proc, registry = start_registry(tmp_path / "registry")
    try:
        digest = _push_tiny_image(registry, "frank/base", "bookworm")
        (repo / "images/local.toml").write_text(
            "# a base from the local registry\n"
            f'name = "local"\nref = "{registry}/frank/base:bookworm"\n')
        result = frank("pin", "--image", "local", cwd=repo)
        assert result.code == 0, result.err
        text = (repo / "images/local.toml").read_text()
        assert f'ref = "{registry}/frank/base@{digest}"' in text
        assert text.startswith("# a base from the local registry")
        (repo / "images/gone.toml").write_text(f'ref = "{registry}/frank/none:x"\n')
        refused = frank("pin", "--image", "gone", cwd=repo)
        assert refused.code == 2 and "refused frank/none:x: HTTP 404" in refused.err
    finally:
        stop(proc)
    down = frank("pin", "--image", "local", "--ref", f"{registry}/frank/base:bookworm", cwd=repo)
    assert down.code == 2 and "is unreachable" in down.err


def test_pin_refuses_kinds_without_references(repo: Path) -> None:
    result = frank("pin", "cpu-experts-sched", cwd=repo)
    assert result.code == 2 and "a env part has no external reference to pin" in result.err
