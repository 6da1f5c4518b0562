"""`frank audit`: a frank-built image passes; images wrong in a consistent way (every digest
recomputed, so `verify` and the engines accept them) are caught, each difference named."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.spine_helpers import copy_repo, frank

SITE = "usr/local/lib/python3.11/dist-packages"
NVCC = shutil.which("nvcc")
KERNEL = 'extern "C" __global__ void probe(float *a) { a[threadIdx.x] += 1.0f; }\n'
PROBE = """kind = "binary"
name = "probe-cubin"
version = "1"
summary = "one cubin, to check that the audit reads the archs it holds"
status = "candidate"
path = "parts/probe-cubin/probe.cubin"
archs = ["sm_120"]
dest = "/opt/frank/probe/probe.cubin"

[provenance]
credits = ["tests"]
licence = "Apache-2.0"

[revert]
action = "remove"
"""

Members = list[tuple[tarfile.TarInfo, bytes]]


def _cubin(folder: Path, arch: str) -> Path:
    (folder / "probe.cu").write_text(KERNEL)
    out = folder / "probe.cubin"
    subprocess.run([str(NVCC), "-cubin", f"-arch={arch}", "-o", str(out),
                    str(folder / "probe.cu")], check=True, capture_output=True)
    (folder / "probe.cu").unlink()
    return out


def _repo(tmp: Path, arch: str | None) -> Path:
    repo = copy_repo(tmp / "repo")
    stack = 'extends = "smoke-cpu.toml"\n'
    if arch is not None:
        part = repo / "parts" / "probe-cubin"
        part.mkdir(parents=True)
        (part / "1.toml").write_text(PROBE)
        _cubin(part, arch)
        stack += '[add]\nprobe-cubin = "1"\n'
    (repo / "stacks" / "audited.toml").write_text(stack)
    return repo


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repo whose stack `audited` (smoke-cpu, plus an sm_120 cubin when nvcc is here) is
    composed: the audit ran at the end of the build and passed."""
    repo = _repo(tmp_path_factory.mktemp("audit"), "sm_120" if NVCC else None)
    result = frank("compose", "stacks/audited.toml", "--json", cwd=repo)
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    assert summary["audit"]["ok"] and summary["audit"]["differences"] == []
    assert (repo / "out" / "audited" / "audit.json").is_file()
    return repo


def _blob(layout: Path, digest: str) -> Path:
    return layout / "blobs" / "sha256" / digest.split(":", 1)[1]


def _put(layout: Path, data: bytes) -> tuple[str, int]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    _blob(layout, digest).write_bytes(data)
    return digest, len(data)


def rewrite(layout: Path, holding: str, edit: Callable[[Members], Members]) -> None:
    """Rewrite the layer that holds a path starting with ``holding`` through ``edit``, then
    recompute every digest above it (diff_id, config, manifest, index): an image wrong in a
    consistent way."""
    index = json.loads((layout / "index.json").read_text())
    manifest = json.loads(_blob(layout, index["manifests"][0]["digest"]).read_bytes())
    config = json.loads(_blob(layout, manifest["config"]["digest"]).read_bytes())
    for i, desc in enumerate(manifest["layers"]):
        with tarfile.open(_blob(layout, desc["digest"])) as tar:
            members = [(m, tar.extractfile(m).read() if m.isfile() else b"")  # type: ignore[union-attr]
                       for m in tar.getmembers()]
        if not any(m.name.startswith(holding) for m, _ in members):
            continue
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for info, data in edit(members):
                info.size = len(data) if info.isfile() else 0
                tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
        digest, size = _put(layout, out.getvalue())
        manifest["layers"][i] = {**desc, "digest": digest, "size": size}
        config["rootfs"]["diff_ids"][i] = digest
        break
    else:
        raise AssertionError(f"no layer holds {holding}")
    cdig, csize = _put(layout, json.dumps(config).encode())
    manifest["config"] = {**manifest["config"], "digest": cdig, "size": csize}
    mdig, msize = _put(layout, json.dumps(manifest).encode())
    index["manifests"][0] = {**index["manifests"][0], "digest": mdig, "size": msize}
    (layout / "index.json").write_text(json.dumps(index))


def _copy(built: Path, tmp_path: Path) -> Path:
    layout = tmp_path / "image"
    shutil.copytree(built / "out" / "audited" / "image", layout)
    return layout


def _audit(repo: Path, target: str) -> tuple[int, list[str], dict]:
    text = frank("audit", target, cwd=repo)
    js = frank("audit", target, "--json", cwd=repo)
    assert text.code == js.code, (text.err, js.err)
    return text.code, text.out.splitlines(), json.loads(js.out) if js.out else {}


@pytest.mark.slow
def test_a_composed_image_passes_and_its_record_is_kept(built: Path) -> None:
    code, lines, report = _audit(built, "stacks/audited.toml")
    assert code == 0, lines
    assert report["ok"] and report["differences"] == []
    assert report["dists"] >= 1 and report["cost"]["files"] > 1000
    record = json.loads((built / "out" / "audited" / "audit.json").read_text())
    assert record["digest"] == report["digest"] and record["ok"]
    if NVCC:
        probe = next(o for o in report["cuda"] if o["owner"] == "probe-cubin")
        assert probe["sass"] == ["sm_120"] and probe["files"] == 1


@pytest.mark.slow
def test_a_changed_file_in_a_rewritten_layer_is_named(built: Path, tmp_path: Path) -> None:
    layout = _copy(built, tmp_path)
    target = f"{SITE}/frank_region_cache/__init__.py"

    def change(members: Members) -> Members:
        return [(m, d + b"# not what the lock says\n" if m.name == target else d)
                for m, d in members]

    rewrite(layout, f"{SITE}/frank_region_cache", change)
    # every blob matches its digest: the run-time blob check cannot see it
    from frank.image.verify import verify_layout

    verify_layout(layout)
    code, lines, report = _audit(built, str(layout))
    assert code == 1
    hit = [x for x in report["differences"] if x["path"] == "/" + target]
    assert hit and hit[0]["part"] == "region-cache" and "differs" in hit[0]["check"]
    assert hit[0]["lock"] != hit[0]["image"]
    assert any(line.startswith(f"region-cache: /{target}: ") for line in lines)


@pytest.mark.slow
def test_layers_the_build_read_as_it_wrote_them_are_what_the_audit_checks(
        built: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """compose hands the audit each streamed layer's entries as the build's tap read them
    (its bytes are not read back): the audit holds exactly those to the lock. Handed the
    layers' true entries it passes without reading them; handed one wrong file hash, it
    names that file: so only a build's own reading may be handed in."""
    from frank.audit.auditor import audit_layout
    from frank.audit.layers import read_layer
    from frank.image.oci import layout_blob_path, resolve_manifest

    monkeypatch.chdir(built)
    layout = built / "out" / "audited" / "image"
    _, _, manifest = resolve_manifest(layout)
    digests = [str(d["digest"]) for d in manifest["layers"]]
    known = {d: read_layer(i, layout_blob_path(layout, d)).entries
             for i, d in enumerate(digests)}
    report = audit_layout(layout, None, built, known=known)
    assert report.ok and report.cost.read_in_build == len(set(digests))
    target = f"{SITE}/frank_region_cache/__init__.py"
    holder = next(d for d, es in known.items() if any(e.path == target for e in es))
    entry = next(e for e in known[holder] if e.path == target)
    entry.sha256 = hashlib.sha256(b"not this file").hexdigest()
    report = audit_layout(layout, None, built, known=known)
    assert not report.ok
    assert [d.path for d in report.differences] == ["/" + target]
    assert audit_layout(layout, None, built).ok  # read from the blobs: the image is fine


@pytest.mark.slow
def test_a_record_rewritten_to_match_is_caught_by_the_pinned_source(built: Path,
                                                                    tmp_path: Path) -> None:
    """The file and its RECORD line both changed: the image agrees with itself, not with
    the package the lock pinned."""
    import base64

    layout = _copy(built, tmp_path)
    target = "frank_region_cache/__init__.py"
    new = b"VERSION = 'tampered'\n"
    line = f"{target},sha256=" + base64.urlsafe_b64encode(
        hashlib.sha256(new).digest()).rstrip(b"=").decode() + f",{len(new)}"

    def change(members: Members) -> Members:
        out = []
        for m, d in members:
            if m.name == f"{SITE}/{target}":
                d = new
            elif m.name.endswith(".dist-info/RECORD") and "region_cache" in m.name:
                d = b"\n".join(line.encode() if x.startswith(target.encode() + b",") else x
                               for x in d.split(b"\n"))
            out.append((m, d))
        return out

    rewrite(layout, f"{SITE}/frank_region_cache", change)
    code, _, report = _audit(built, str(layout))
    assert code == 1
    checks = {(x["path"], x["check"]) for x in report["differences"]}
    assert (f"/{SITE}/{target}", "RECORD rewritten") in checks


@pytest.mark.slow
def test_a_missing_distribution_is_named(built: Path, tmp_path: Path) -> None:
    layout = _copy(built, tmp_path)
    rewrite(layout, f"{SITE}/frank_region_cache",
            lambda ms: [(m, d) for m, d in ms if "region_cache" not in m.name])
    code, _, report = _audit(built, str(layout))
    assert code == 1
    missing = [x for x in report["differences"] if x["check"] == "distribution missing"]
    assert [x["part"] for x in missing] == ["region-cache"]
    assert "frank-region-cache" in missing[0]["lock"] and missing[0]["image"] == "no dist-info"


@pytest.mark.slow
def test_an_extra_distribution_is_named(built: Path, tmp_path: Path) -> None:
    layout = _copy(built, tmp_path)

    def add(members: Members) -> Members:
        extra = []
        for name, data in ((f"{SITE}/sneaky.py", b"print('hi')\n"),
                           (f"{SITE}/sneaky-6.6.dist-info/METADATA",
                            b"Metadata-Version: 2.1\nName: sneaky\nVersion: 6.6\n"),
                           (f"{SITE}/sneaky-6.6.dist-info/RECORD", b"sneaky.py,,\n")):
            info = tarfile.TarInfo(name)
            info.mode = 0o644
            extra.append((info, data))
        return members + extra

    rewrite(layout, f"{SITE}/frank_region_cache", add)
    code, _, report = _audit(built, str(layout))
    assert code == 1
    extra = [x for x in report["differences"] if x["check"] == "distribution not in the lock"]
    assert len(extra) == 1 and extra[0]["image"].startswith("sneaky 6.6")
    assert extra[0]["path"] == f"/{SITE}/sneaky-6.6.dist-info"
    stray = [x for x in report["differences"] if x["path"] == f"/{SITE}/sneaky.py"]
    assert stray and stray[0]["check"] == "file no part declares"


@pytest.mark.slow
def test_run_refuses_an_image_whose_audit_failed(built: Path, tmp_path: Path) -> None:
    layout = _copy(built, tmp_path)
    rewrite(layout, f"{SITE}/frank_region_cache",
            lambda ms: [(m, d) for m, d in ms if "region_cache" not in m.name])
    result = frank("run", str(layout), "--print", "--model-dir", str(tmp_path), cwd=built)
    assert result.code == 1
    assert "refusing to run it: the image's audit failed: region-cache:" in result.err


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_a_cubin_for_the_wrong_arch_fails_compose(tmp_path: Path) -> None:
    repo = _repo(tmp_path, "sm_90")
    result = frank("compose", "stacks/audited.toml", cwd=repo)
    assert result.code == 1
    assert ("audit: probe-cubin: /opt/frank/probe/probe.cubin: declared arch missing: lock "
            "says sm_120; image has sm_90") in result.out
    report = json.loads((repo / "out" / "audited" / "audit.json").read_text())
    assert not report["ok"]
