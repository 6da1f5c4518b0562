"""An untrusted writer of the cache (issue 53): forgeries made *consistently*, every digest
and record recomputed the way a job sharing a CI cache would, never reach an image that
passes. Each test forges one thing with ``Forger`` (which recomputes layer, config, manifest,
index, base and audit records with frank's own code) and shows compose, audit, run or push
refuse it. docs/trust.md says which mode checks what.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.spine_helpers import copy_repo

STACK = "stacks/smoke-cpu.toml"
TAMPERED = b"TAMPERED"


def frank(*args: str, cwd: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    """The CLI in a fresh process on ``cache`` (never the user's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(FRANK_CACHE=str(cache), COLUMNS="300")
    return subprocess.run([sys.executable, "-m", "frank", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def composed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repo copy with smoke-cpu composed on a cache of its own (copied per test)."""
    top = tmp_path_factory.mktemp("trust")
    repo = copy_repo(top / "repo")
    done = frank("compose", STACK, cwd=repo, cache=top / "cache")
    assert done.returncode == 0, done.stderr
    return top


@pytest.fixture
def world(composed: Path, tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(repo, cache): this test's own copies, free to forge."""
    repo, cache = tmp_path / "repo", tmp_path / "cache"
    shutil.copytree(composed / "repo", repo, symlinks=True)
    shutil.copytree(composed / "cache", cache, symlinks=True,
                    ignore=shutil.ignore_patterns("users.lock", "tmp"))
    # out/'s blobs are hard links into the store in the original; copies are fine here
    yield repo, cache


# --- the forger ------------------------------------------------------------------------------

Members = list[tuple[tarfile.TarInfo, bytes]]


def read_tar(data: bytes) -> Members:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return [(m, tar.extractfile(m).read() if m.isfile() else b"")  # type: ignore[union-attr]
                for m in tar]


def write_tar(members: Members) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            info.size = len(data) if info.isfile() else 0
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return out.getvalue()


def file_member(path: str, data: bytes, mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(path)
    info.mode, info.size, info.mtime = mode, len(data), 315532800
    return info, data


def sha(data: bytes) -> str:
    import hashlib

    return "sha256:" + hashlib.sha256(data).hexdigest()


class Forger:
    """Edits a layout, and the store it shares blobs with, keeping every digest right."""

    def __init__(self, layout: Path, cache: Path | None = None):
        self.layout = layout
        self.cache = cache

    def _blob(self, digest: str) -> Path:
        return self.layout / "blobs/sha256" / digest.split(":")[1]

    def _put(self, data: bytes) -> str:
        digest = sha(data)
        path = self._blob(digest)
        if not path.exists():
            path.write_bytes(data)
        if self.cache is not None:
            from frank.store.blobs import BlobStore

            BlobStore(self.cache).put_bytes(data)
        return digest

    def docs(self) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        index = json.loads((self.layout / "index.json").read_text())
        manifest = json.loads(self._blob(index["manifests"][0]["digest"]).read_bytes())
        config = json.loads(self._blob(manifest["config"]["digest"]).read_bytes())
        return index, manifest, config

    def layer(self, i: int) -> bytes:
        _, manifest, _ = self.docs()
        return self._blob(manifest["layers"][i]["digest"]).read_bytes()

    def rewrite(self, *, layers: dict[int, bytes] | None = None,
                config: Callable[[dict[str, Any]], None] | None = None) -> str:
        """New layer bytes and/or a config edit; config, manifest and index recomputed."""
        index, manifest, cfg = self.docs()
        for i, data in (layers or {}).items():
            digest = self._put(data)
            manifest["layers"][i].update(digest=digest, size=len(data))
            cfg["rootfs"]["diff_ids"][i] = digest
        if config is not None:
            config(cfg)
        raw = json.dumps(cfg, sort_keys=True, separators=(",", ":")).encode()
        manifest["config"].update(digest=self._put(raw), size=len(raw))
        mraw = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
        mdigest = self._put(mraw)
        index["manifests"][0].update(digest=mdigest, size=len(mraw))
        (self.layout / "index.json").write_text(json.dumps(index))
        return mdigest

    def edit_layer(self, i: int, edit: Callable[[Members], Members]) -> str:
        return self.rewrite(layers={i: write_tar(edit(read_tar(self.layer(i))))})

    def forge_audit_record(self) -> None:
        """audit.json beside the layout saying the (new) digest passed."""
        record = self.layout.parent / "audit.json"
        doc = json.loads(record.read_text())
        index, _, _ = self.docs()
        doc.update(digest=index["manifests"][0]["digest"], ok=True, differences=[])
        record.write_text(json.dumps(doc))

    def drop_audit_record(self) -> None:
        (self.layout.parent / "audit.json").unlink(missing_ok=True)


def layer_index(forger: Forger, name: str) -> int:
    """The manifest index of the frank layer whose history says ``name``."""
    _, _, cfg = forger.docs()
    nonempty = [h for h in cfg["history"] if not h.get("empty_layer")]
    return next(i for i, h in enumerate(nonempty) if h.get("created_by") == f"frank: {name}")


def forge_cached_layer(cache: Path, key: str, data: bytes) -> None:
    """The store's layer index says layer ``key`` is ``data`` (both records written)."""
    from frank.image.layer import LAYER_MEDIA_TYPE
    from frank.store.blobs import BlobStore, LayerRecord

    store = BlobStore(cache)
    digest = store.put_bytes(data)
    store.put_layer(key, LayerRecord(digest=digest, diff_id=digest, size=len(data),
                                     media_type=LAYER_MEDIA_TYPE))


def store_key(cache: Path, forger: Forger, i: int) -> str:
    """The store's index key of layer ``i`` (its layer-keys record names blob and key)."""
    _, manifest, _ = forger.docs()
    blob = manifest["layers"][i]["digest"].split(":")[1]
    [record] = (cache / "layer-keys").glob(f"{blob}-*")
    return record.name.split("-", 1)[1]


def out_layout(repo: Path) -> Path:
    return repo / "out/smoke-cpu/image"


def refused(done: subprocess.CompletedProcess[str], *words: str) -> None:
    text = done.stdout + done.stderr
    assert done.returncode != 0, text
    assert "Traceback" not in text, text
    for w in words:
        assert w in text, text


# --- through compose ---------------------------------------------------------------------------

def _site_pyc(repo: Path) -> str:
    plan = json.loads((repo / "out/smoke-cpu/plan.json").read_text())
    site = plan["site_packages"].strip("/")
    return f"{site}/region_cache/__pycache__/__init__.cpython-311.pyc"


def test_compose_refuses_a_cached_layer_that_adds_a_pyc(world: tuple[Path, Path]) -> None:
    """1. A layer in the cache given a ``__pycache__/*.pyc`` (its record recomputed): the
    audit skipped every such path; now no frank layer may hold bytecode."""
    repo, cache = world
    forger = Forger(out_layout(repo))
    i = layer_index(forger, "plugin:region-cache")
    pyc = _site_pyc(repo)
    forge_cached_layer(cache, store_key(cache, forger, i),
                       write_tar([*read_tar(forger.layer(i)), file_member(pyc, TAMPERED)]))
    done = frank("compose", STACK, cwd=repo, cache=cache)
    refused(done, f"/{pyc}", "bytecode")


def test_compose_refuses_whiteouts_hiding_base_files(world: tuple[Path, Path]) -> None:
    """2. A layer of whiteouts hiding /etc/passwd: only a declared removal may hide a file."""
    repo, cache = world
    forger = Forger(out_layout(repo))
    i = layer_index(forger, "frank:lock")
    forge_cached_layer(cache, store_key(cache, forger, i),
                       write_tar([*read_tar(forger.layer(i)), file_member("etc/.wh.passwd", b"")]))
    done = frank("compose", STACK, cwd=repo, cache=cache)
    refused(done, "/etc/passwd", "whiteout")


def test_compose_refuses_a_forged_base_with_its_records_recomputed(
        world: tuple[Path, Path]) -> None:
    """3. The cached base's layer edited, its config, manifest, index and base record
    recomputed: the base is held to its pinned .debs, not to the cached base."""
    from frank.assemble.baselayout import BaseImage, layout_from_layer
    from frank.store.blobs import BlobStore

    repo, cache = world
    [record] = (cache / "bases").glob("*.json")
    base = BaseImage.model_validate_json(record.read_text())
    layout = cache / "bases" / record.stem
    bforger = Forger(layout)
    members = [(m, TAMPERED if m.name.removeprefix("./") == "usr/lib/os-release" else d)
               for m, d in read_tar(bforger.layer(0))]
    data = write_tar(members)
    store = BlobStore(cache)
    digest = store.put_bytes(data)
    _, _, cfg = bforger.docs()
    shutil.rmtree(layout)
    new = layout_from_layer(store, layout, digest, len(data), epoch=0,
                            created_by=cfg["history"][0]["created_by"],
                            architecture=cfg["architecture"],
                            cmd=tuple(cfg["config"].get("Cmd") or ()))
    record.write_text(BaseImage(name=base.name, layout=Path(record.stem),
                                digest=new).model_dump_json())
    done = frank("compose", STACK, cwd=repo, cache=cache)
    refused(done, "base")
    assert "/usr/lib/os-release" in done.stdout + done.stderr


def test_release_finds_kept_step_outputs_forged_consistently(tmp_path: Path) -> None:
    """4. A stage's kept outputs edited with their tree digest recomputed: the default mode
    reuses them (its tree digest guards against mistakes, not a forger); release mode runs
    the stage again in its scratch store, and the comparison names the path and moves the
    forged outputs aside."""
    from frank.assemble import stepcache
    from frank.audit.release import _step_outputs
    from tests.test_safety_tamper import _stage_layout

    layer, layout = _stage_layout(tmp_path)
    real, derived = tmp_path / "cache", tmp_path / "scratch"
    assert stepcache.save(real, layer, layout) and stepcache.save(derived, layer, layout)
    kept = stepcache.cached(real, layer)
    assert kept is not None
    (kept / "opt/out/kept.txt").write_bytes(TAMPERED)
    done = real / "step-outputs" / layer.key / "done.json"
    doc = json.loads(done.read_text())
    doc["tree"] = stepcache.tree_digest(kept)
    done.write_text(json.dumps(doc))
    assert stepcache.cached(real, layer) is not None  # consistent: the default mode's trust
    [finding] = _step_outputs(real, derived)
    assert finding.path == "/opt/out/kept.txt", finding.line()
    assert stepcache.cached(real, layer) is None  # gone: the next build runs the step


@pytest.mark.slow
def test_release_compose_heals_a_forged_layer_record(world: tuple[Path, Path]) -> None:
    """Release mode derives every layer from the pins: a cached layer forged consistently
    is named (layer and first path) in one line, its record dropped, the image written is
    the one the lock makes, and the next plain compose makes that layer again."""
    repo, cache = world
    forger = Forger(out_layout(repo))
    good = forger.docs()[0]["manifests"][0]["digest"]
    i = layer_index(forger, "plugin:region-cache")
    forge_cached_layer(cache, store_key(cache, forger, i), write_tar(
        [(m, TAMPERED if m.name.endswith("region_cache/__init__.py") else d)
         for m, d in read_tar(forger.layer(i))]))
    done = frank("compose", STACK, "--release", cwd=repo, cache=cache)
    assert done.returncode == 1, done.stdout + done.stderr
    [line] = [x for x in done.stderr.splitlines() if x.startswith("release:")]
    assert "layer plugin:region-cache" in line and "region_cache/__init__.py" in line, line
    assert "Traceback" not in done.stderr
    assert Forger(out_layout(repo)).docs()[0]["manifests"][0]["digest"] == good
    again = frank("compose", STACK, "--json", cwd=repo, cache=cache)
    assert again.returncode == 0, again.stdout + again.stderr
    summary = json.loads(again.stdout)
    assert summary["image"]["digest"] == good and summary["image"]["layers_built"] == 1
    clean = frank("compose", STACK, "--release", cwd=repo, cache=cache)
    assert clean.returncode == 0 and "the cache agrees" in clean.stdout, clean.stderr


# --- through run, push, trial ------------------------------------------------------------------

def _run_print(repo: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    return frank("run", STACK, "--engine", "buildah", "--print", "--json", "--hub-cache",
                 str(repo / "hub"), cwd=repo, cache=cache)


def _push(repo: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    return frank("push", "smoke-cpu", "--to", "127.0.0.1:9/forged", cwd=repo, cache=cache)


def _edit_plugin(repo: Path, extra: Members | None = None) -> Forger:
    forger = Forger(out_layout(repo))
    i = layer_index(forger, "plugin:region-cache")

    def edit(members: Members) -> Members:
        out = [(m, TAMPERED if m.name.endswith("region_cache/__init__.py") else d)
               for m, d in members]
        return out + (extra or [])
    forger.edit_layer(i, edit if extra is None else (lambda ms: ms + extra))
    return forger


@pytest.mark.slow
def test_run_and_push_do_not_trust_a_forged_audit_record(world: tuple[Path, Path]) -> None:
    """5. out/'s layer edited, digests recomputed and audit.json forged to say it passed:
    run and push audit the layout against the stack's lock anyway."""
    repo, cache = world
    _edit_plugin(repo).forge_audit_record()
    refused(_run_print(repo, cache), "refusing to run it", "region_cache/__init__.py")
    refused(_push(repo, cache), "refusing to push it", "region_cache/__init__.py")


@pytest.mark.slow
def test_run_and_push_refuse_a_forged_pyc(world: tuple[Path, Path]) -> None:
    """6. A .pyc added to out/'s image (digests recomputed, no record): refused."""
    repo, cache = world
    _edit_plugin(repo, [file_member(_site_pyc(repo), TAMPERED)]).drop_audit_record()
    refused(_run_print(repo, cache), "refusing to run it", "bytecode")
    refused(_push(repo, cache), "refusing to push it", "bytecode")


def test_run_audits_against_the_stacks_lock_not_the_carried_one(
        world: tuple[Path, Path]) -> None:
    """7. The lock inside the image given another ``command`` (its digest field kept):
    run audited the image against that carried lock and would have run the command."""
    repo, cache = world
    forger = Forger(out_layout(repo))
    i = layer_index(forger, "frank:lock")

    def edit(members: Members) -> Members:
        out = []
        for m, d in members:
            if m.name.removeprefix("./") == "etc/frank/frank.lock":
                doc = json.loads(d)
                doc["command"] = ["sh", "-c", "echo TAMPERED"]
                d = json.dumps(doc, indent=2, sort_keys=True).encode() + b"\n"
            out.append((m, d))
        return out
    forger.edit_layer(i, edit)
    forger.drop_audit_record()
    done = _run_print(repo, cache)
    refused(done, "refusing to run it", "/etc/frank/frank.lock")
    assert "echo TAMPERED" not in done.stdout


def _ld_preload(cfg: dict[str, Any]) -> None:
    cfg["config"]["Env"].append("LD_PRELOAD=/tmp/evil.so")


@pytest.mark.slow
def test_config_env_ld_preload_is_refused_everywhere(world: tuple[Path, Path]) -> None:
    """8. Config Env given LD_PRELOAD, digests recomputed: audit, run and push refuse."""
    repo, cache = world
    forger = Forger(out_layout(repo))
    forger.rewrite(config=_ld_preload)
    forger.drop_audit_record()
    audit = frank("audit", STACK, cwd=repo, cache=cache)
    assert audit.returncode == 1, audit.stdout + audit.stderr
    assert "LD_PRELOAD" in audit.stdout
    refused(_run_print(repo, cache), "refusing to run it", "LD_PRELOAD")
    refused(_push(repo, cache), "refusing to push it", "LD_PRELOAD")


@pytest.mark.parametrize("field,value", [
    ("User", "0:0"), ("WorkingDir", "/tmp"), ("Cmd", ["sh"]), ("StopSignal", "SIGKILL"),
    ("ExposedPorts", {"22/tcp": {}}), ("Volumes", {"/etc": {}}),
    ("Labels", {"dev.frank.lock.digest": "x", "extra": "1"})])
def test_every_config_field_is_held_to_the_lock(world: tuple[Path, Path], field: str,
                                                value: object) -> None:
    """8b. Each other config field frank sets (or leaves unset) is held to the lock."""
    repo, cache = world
    forger = Forger(out_layout(repo))

    def edit(cfg: dict[str, Any]) -> None:
        if field == "Labels":
            cfg["config"]["Labels"] = {**cfg["config"]["Labels"], "extra": "1"}
        else:
            cfg["config"][field] = value
    forger.rewrite(config=edit)
    audit = frank("audit", STACK, cwd=repo, cache=cache)
    assert audit.returncode == 1, audit.stdout + audit.stderr
    assert f"config {field}" in audit.stdout


def test_trial_audits_against_the_stacks_lock(world: tuple[Path, Path]) -> None:
    """8c. trial's image check is the same audit against the stack's lock: the forged
    Env with a forged record is refused for an arm."""
    from frank.audit.auditor import AuditFailed, ensure_audited
    from frank.resolve.project import lock_stack

    repo, cache = world
    forger = Forger(out_layout(repo))
    forger.rewrite(config=_ld_preload)
    forger.forge_audit_record()
    os.environ["FRANK_CACHE"], old = str(cache), os.environ.get("FRANK_CACHE")
    cwd = Path.cwd()
    try:
        os.chdir(repo)
        lock = lock_stack(STACK, closure="use").lock
        with pytest.raises(AuditFailed, match="LD_PRELOAD"):
            ensure_audited(out_layout(repo), lock, repo, what="run arm A")
    finally:
        os.chdir(cwd)
        if old is None:
            os.environ.pop("FRANK_CACHE")
        else:
            os.environ["FRANK_CACHE"] = old


# --- the run cache ---------------------------------------------------------------------------

def test_a_pyc_forged_in_the_run_cache_is_not_reused(world: tuple[Path, Path],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """9. A .pyc written into the run cache's pycache (what PYTHONPYCACHEPREFIX points at)
    by someone other than a run of this image is never handed to the container."""
    repo, cache = world
    monkeypatch.setenv("XDG_CONFIG_HOME", str(repo.parent / "config"))
    plan = json.loads(_run_print(repo, cache).stdout)
    run_cache = Path(plan["run_cache"])
    forged = run_cache / "pycache/usr/lib/python3.11/json/__pycache__/__init__.cpython-311.pyc"
    forged.parent.mkdir(parents=True)
    forged.write_bytes(TAMPERED)
    from frank.run.runcache import prepare_pycache

    assert prepare_pycache(run_cache) is False
    assert not forged.exists() and (run_cache / "pycache").is_dir()


@pytest.mark.parametrize("edit", ["none", "edit", "add", "link", "seal copied"])
def test_the_run_caches_bytecode_is_kept_only_under_its_seal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit: str) -> None:
    """What a run compiled is kept for the next (sealed with a key outside the cache); any
    edit after the seal, or a seal made with another key, empties it."""
    from frank.run.runcache import prepare_pycache, seal_pycache

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    run_cache = tmp_path / "run"
    pyc = run_cache / "pycache/usr/lib/python3.11/__pycache__/os.cpython-311.pyc"
    pyc.parent.mkdir(parents=True)
    pyc.write_bytes(b"compiled by the run")
    seal_pycache(run_cache)
    if edit == "edit":
        pyc.write_bytes(TAMPERED)
    elif edit == "add":
        (pyc.parent / "json.cpython-311.pyc").write_bytes(TAMPERED)
    elif edit == "link":
        (pyc.parent / "re.cpython-311.pyc").symlink_to(pyc)
    elif edit == "seal copied":
        monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "other-config"))
    kept = prepare_pycache(run_cache)
    assert kept is (edit == "none")
    assert pyc.exists() is (edit == "none")
    assert not (run_cache / "pycache.seal").exists()  # taken off while a run uses it


@pytest.mark.slow
def test_push_derives_the_image_again_unless_told_to_trust_the_cache(
        world: tuple[Path, Path]) -> None:
    """Release mode in push: a file's mode made setuid in out/'s layer (digests recomputed;
    the audit holds content, not modes) is refused by push, naming the layer and the path;
    with --trust-cache push goes on to the registry (here none: it fails there)."""
    repo, cache = world
    forger = Forger(out_layout(repo))
    i = layer_index(forger, "plugin:region-cache")

    def setuid(members: Members) -> Members:
        for m, _ in members:
            if m.name.endswith("region_cache/__init__.py"):
                m.mode |= 0o4755
        return members
    forger.edit_layer(i, setuid)
    forger.drop_audit_record()
    refused(_push(repo, cache), "refusing to push it", "layer 1 (plugin:region-cache)",
            "region_cache/__init__.py")
    trusted = frank("push", "smoke-cpu", "--to", "127.0.0.1:9/forged", "--trust-cache",
                    cwd=repo, cache=cache)
    assert trusted.returncode != 0 and "refusing" not in trusted.stderr, trusted.stderr


def forge_kept_reading(cache: Path, layout: Path, i: int, suffix: str) -> None:
    """The audit's kept reading of layer ``i`` (``frank.audit.kept``) says the file ending in
    ``suffix`` has other bytes, and the stat ledger vouches for that record and for the
    layout's blob: a reading forged consistently."""
    import hashlib
    import time

    from frank.store.blobs import BlobStore, leave_users
    from frank.store.ledger import coarse_ns

    blob_hex = Forger(layout).docs()[1]["layers"][i]["digest"].split(":")[1]
    record = cache / "audit-layers" / f"{blob_hex}.json"
    doc = json.loads(record.read_bytes())
    if doc["format"] == "frank-audit-kept-1":  # a row per entry: path, ..., sha256, ...
        [row] = [r for r in doc["data"] if r[0].endswith(suffix)]
        row[6] = "0" * 64
    else:  # a column per field: paths, ..., sha256s, ...
        paths, shas = doc["data"][0], doc["data"][6]
        [at] = [i for i, p in enumerate(paths) if p.endswith(suffix)]
        shas[at] = "0" * 64
    raw = json.dumps(doc, separators=(",", ":")).encode()
    record.write_bytes(raw)
    blob = layout / "blobs/sha256" / blob_hex
    while coarse_ns() <= max(record.stat().st_ctime_ns, blob.stat().st_ctime_ns):
        time.sleep(0.002)
    store = BlobStore(cache)
    store.ledger.note(record, hashlib.sha256(raw).hexdigest())
    store.ledger.note(blob, blob_hex)
    store.ledger.save()
    leave_users(cache)


@pytest.mark.slow
def test_release_mode_never_uses_a_kept_reading(world: tuple[Path, Path]) -> None:
    """A kept reading forged consistently (record and ledger) is what the default audit
    sees (it names the file), and what push in release mode never sees: it reads the layer
    itself, passes, derives the image again and goes on to the registry (here none)."""
    repo, cache = world
    layout = out_layout(repo)
    forge_kept_reading(cache, layout, layer_index(Forger(layout), "plugin:region-cache"),
                       "region_cache/__init__.py")
    audit = frank("audit", STACK, cwd=repo, cache=cache)
    refused(audit, "region_cache/__init__.py")
    pushed = _push(repo, cache)
    assert pushed.returncode != 0 and "refusing" not in pushed.stderr, pushed.stderr
    assert "127.0.0.1:9" in pushed.stdout + pushed.stderr


# --- the files' verdict kept across a config-only change (issue 53's loop) ------------------

def _set_env(repo: Path, value: str) -> None:
    path = repo / STACK
    import re

    text = path.read_text()
    new = re.sub(r'VLLM_NO_USAGE_STATS = "\d+"', f'VLLM_NO_USAGE_STATS = "{value}"', text)
    assert new != text or f'"{value}"' in text
    path.write_text(new)


def _verdict_records(cache: Path) -> list[Path]:
    return sorted((cache / "audit-verdicts").glob("*.json"))


def test_an_env_change_keeps_the_files_verdict_and_still_checks_the_config(
        world: tuple[Path, Path]) -> None:
    """An env value changed: same layers, same expectations of the files: the verdict on the
    files is kept (nothing read), the config is held to the lock again: a forged LD_PRELOAD
    on the new image is still refused, and a layer edited consistently is read again."""
    repo, cache = world
    _set_env(repo, "2")
    done = frank("compose", STACK, "--json", cwd=repo, cache=cache)
    assert done.returncode == 0, done.stderr
    first = json.loads(done.stdout)
    assert first["audit"]["ok"] and not first["audit"]["kept"]
    _set_env(repo, "3")  # by now every blob is one the ledger vouches for: a verdict kept
    assert frank("compose", STACK, cwd=repo, cache=cache).returncode == 0
    _set_env(repo, "4")
    done = frank("compose", STACK, "--json", cwd=repo, cache=cache)
    assert done.returncode == 0, done.stderr
    report = json.loads((out_layout(repo).parent / "audit.json").read_text())
    assert report["ok"] and report["cost"]["verdict_kept"], report["cost"]
    assert report["cost"]["files"] > 100 and report["cost"]["kept"] == 0  # nothing read
    _, _, cfg = Forger(out_layout(repo)).docs()
    assert "VLLM_NO_USAGE_STATS=4" in cfg["config"]["Env"]
    # the config of this image forged: its layers' verdict is still kept, and the config is not
    forger = Forger(out_layout(repo))
    forger.rewrite(config=_ld_preload)
    forger.drop_audit_record()
    audit = frank("audit", STACK, "--json", cwd=repo, cache=cache)
    assert audit.returncode == 1, audit.stdout + audit.stderr
    found = json.loads(audit.stdout)
    assert found["cost"]["verdict_kept"]
    assert any(d["check"] == "env LD_PRELOAD" for d in found["differences"]), found
    # a layer edited (digests recomputed): other layers, another key: read and refused
    i = layer_index(forger, "plugin:region-cache")
    forger.edit_layer(i, lambda ms: [(m, TAMPERED if m.name.endswith("__init__.py") else d)
                                     for m, d in ms])
    audit = frank("audit", STACK, "--json", cwd=repo, cache=cache)
    found = json.loads(audit.stdout)
    assert audit.returncode == 1 and not found["cost"]["verdict_kept"]
    assert any(d["path"].endswith("region_cache/__init__.py") for d in found["differences"])


def test_a_verdict_record_edited_is_not_used_and_release_mode_uses_none(
        world: tuple[Path, Path]) -> None:
    """The kept verdict edited in place (size and mtime put back) is not used: the ledger
    sees its ctime. Forged consistently (the ledger rewritten to vouch for it), the default
    audit believes it, as it would a forged kept reading (docs/trust.md); push in release
    mode never reads one."""
    import hashlib
    import time

    from frank.store.blobs import BlobStore, leave_users
    from frank.store.ledger import coarse_ns

    repo, cache = world
    for value in "23":
        _set_env(repo, value)
        assert frank("compose", STACK, cwd=repo, cache=cache).returncode == 0
    [record] = _verdict_records(cache)
    doc = json.loads(record.read_bytes())
    fake = {"part": "forged", "path": "/forged", "check": "a planted difference",
            "lock": "x", "image": "y"}
    doc["data"]["checks"].append(fake)
    raw = json.dumps(doc, separators=(",", ":")).encode()
    st = record.stat()
    record.write_bytes(raw)
    os.utime(record, ns=(st.st_atime_ns, st.st_mtime_ns))
    audit = frank("audit", STACK, "--json", cwd=repo, cache=cache)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    assert not json.loads(audit.stdout)["cost"]["verdict_kept"]  # read, and kept anew
    record.write_bytes(raw)  # now with the ledger forged too
    while coarse_ns() <= record.stat().st_ctime_ns:
        time.sleep(0.002)
    store = BlobStore(cache)
    store.ledger.note(record, hashlib.sha256(raw).hexdigest())
    store.ledger.save()
    leave_users(cache)
    audit = frank("audit", STACK, cwd=repo, cache=cache)
    refused(audit, "a planted difference")
    pushed = _push(repo, cache)
    assert "a planted difference" not in pushed.stdout + pushed.stderr
    assert pushed.returncode != 0 and "refusing" not in pushed.stderr, pushed.stderr
