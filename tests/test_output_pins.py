"""Fixed-output pins (issue 53): an ``aot`` or ``extension`` part may pin what its host build
makes (``output_sha256``), as Nix pins a fixed-output derivation. Compose holds a built or
kept output to the pin; release mode takes a kept output into its scratch store only once it
is hashed there in full and is the lock's pin, and builds again otherwise (a forged one is a
finding, quarantined). The outputs here are made-up files at the keys the store keeps them
under: the checks read bytes and keys, not what the compiler made (the nvcc-built check is
tests/test_flashinfer_aot.py's slow ``test_release_takes_the_built_module_...``).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from frank.assemble import aot as aotbuild
from frank.assemble import extension as extbuild
from frank.assemble.plan import BuildPlan, PlanLayer, build_plan
from frank.errors import FrankError
from frank.hashing import sha256_tree
from frank.model.kinds.aot import Aot
from frank.model.kinds.extension import Extension, ext_suffix
from frank.resolve.lock import Lock, read_lock
from frank.store.blobs import BlobStore
from frank.store.fetch import Fetcher

KINDS = {"aot": "flashinfer-aot", "extension": "exl3-ext"}


def _plan(repo: Path) -> tuple[BuildPlan, dict[str, PlanLayer]]:
    plan = build_plan(read_lock(repo / "stacks/served.lock"), repo)
    return plan, {x.kind: x for x in plan.layers if x.kind in KINDS}


def _part(spec: dict[str, Any]) -> Aot | Extension:
    return Aot.model_validate(spec) if spec["kind"] == "aot" else Extension.model_validate(spec)


def _keep(part: Aot | Extension, repo: Path, store: Path, manifest: Path) -> str:
    """Made-up kept outputs where the store keeps the part's build; their digest, computed
    apart from the code under test (sha256_tree of the placed folder; the module's sha256)."""
    if isinstance(part, Aot):
        placed = store.parent / "placed"
        for name, path in aotbuild.kept_paths(part, repo, manifest, store).items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"\x7fELF " + name.encode())
            path.chmod(0o644)
            (placed / name).mkdir(parents=True)
            shutil.copyfile(path, placed / name / path.name)
            (placed / name / path.name).chmod(0o644)
        digest = sha256_tree(placed)
        shutil.rmtree(placed)
        return digest
    folder = extbuild.kept_folder(part, repo, store)
    folder.mkdir(parents=True)
    module = folder / f"{part.module}{ext_suffix(part.python_headers)}"
    module.write_bytes(b"\x7fELF exllamav3_ext")
    sha = hashlib.sha256(module.read_bytes()).hexdigest()
    (folder / "result.json").write_text(json.dumps({"module": module.name, "sha256": sha}))
    return sha


def _no_builds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every compiler run recorded and refused: what a test expects not to happen."""
    ran: list[str] = []

    def build(*args: Any, **kwargs: Any) -> None:
        ran.append("built")
        raise RuntimeError("the compiler ran")

    monkeypatch.setattr(aotbuild, "_build", build)
    monkeypatch.setattr(extbuild, "_build", build)
    return ran


def _place(kind: str, layer: PlanLayer, plan: BuildPlan, repo: Path, staging: Path,
           store: BlobStore) -> None:
    """What compose does with the layer (``assemble_layer``'s host build of it)."""
    from frank.assemble.builder import _build_aot, _build_extension

    go = _build_aot if kind == "aot" else _build_extension
    go(layer, plan, repo, staging, Fetcher(store), staging.parent / "build.log")


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_wrong_pin_fails_compose_naming_the_field(repo: Path, tmp_path: Path, kind: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The right pin: the kept output is placed, nothing is built. A wrong one (a stale pin,
    a build that does not reproduce): one line naming the manifest, the field and both
    digests; nothing placed."""
    ran = _no_builds(monkeypatch)
    plan, layers = _plan(repo)
    layer = layers[kind]
    spec = dict(getattr(layer, kind))
    manifest = repo / str(layer.manifest)
    store = BlobStore(tmp_path / "store")
    digest = _keep(_part(spec), repo, store.root, manifest)
    right = layer.model_copy(update={kind: {**spec, "output_sha256": digest}})
    _place(kind, right, plan, repo, tmp_path / "ok", store)
    assert [p for p in (tmp_path / "ok").rglob("*.so")] and ran == []
    wrong = layer.model_copy(update={kind: {**spec, "output_sha256": "0" * 64}})
    with pytest.raises(FrankError) as err:
        _place(kind, wrong, plan, repo, tmp_path / "bad", store)
    line = err.value.one_line()
    assert err.value.field == "output_sha256" and str(err.value.file).endswith(
        f"parts/{KINDS[kind]}/1.toml"), line
    assert "0" * 64 in line and digest in line and "\n" not in line
    assert not list((tmp_path / "bad").rglob("*.so")) and ran == []


def test_a_kept_output_is_held_to_its_pin_through_the_ledger(
        repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compose's check of a kept output costs a stat once the ledger holds it; an edit that
    restores size and mtime is still read again, and named."""
    import os

    _no_builds(monkeypatch)
    plan, layers = _plan(repo)
    layer = layers["extension"]
    spec = dict(layer.extension or {})
    store = BlobStore(tmp_path / "store")
    digest = _keep(_part(spec), repo, store.root, repo / str(layer.manifest))
    pinned = layer.model_copy(update={"extension": {**spec, "output_sha256": digest}})
    _place("extension", pinned, plan, repo, tmp_path / "a", store)
    store.ledger.save()  # as a compose ends
    hashed = store.ledger.hashed
    _place("extension", pinned, plan, repo, tmp_path / "b", store)
    assert store.ledger.hashed == hashed  # the second check: a stat, no read
    module = next((tmp_path / "store" / "exllamav3-ext").glob("*/*.so"))
    st = module.stat()
    module.write_bytes(module.read_bytes().replace(b"ELF", b"FLE"))  # same size
    os.utime(module, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(FrankError) as err:
        _place("extension", pinned, plan, repo, tmp_path / "c", store)
    assert "is not what its result.json records" in str(err.value)
    # a forger who writes result.json and the ledger to agree is still not the repo's pin
    _forge(_part(spec), repo, repo / str(layer.manifest), store.root)
    with pytest.raises(FrankError) as err:
        _place("extension", pinned, plan, repo, tmp_path / "d", store)
    assert err.value.field == "output_sha256" and digest in str(err.value)


def _pinned_lock(repo: Path, pins: dict[str, str | None]) -> Lock:
    """served's lock with each named part's ``output_sha256`` set (None: none pinned)."""
    lock = read_lock(repo / "stacks/served.lock")
    parts = []
    for p in lock.parts:
        if p.name in pins:
            spec = {k: v for k, v in p.spec.items() if k != "output_sha256"}
            if pins[p.name] is not None:
                spec["output_sha256"] = pins[p.name]
            p = p.model_copy(update={"spec": spec})
        parts.append(p)
    return lock.model_copy(update={"parts": parts})


def _kept(repo: Path, cache: Path) -> dict[str, tuple[Aot | Extension, Path, str]]:
    """Both parts' made-up kept outputs in ``cache``: name -> (part, manifest, digest)."""
    _, layers = _plan(repo)
    out = {}
    for kind, layer in layers.items():
        spec = {k: v for k, v in getattr(layer, kind).items() if k != "output_sha256"}
        part, manifest = _part(spec), repo / str(layer.manifest)
        out[part.name] = (part, manifest, _keep(part, repo, cache, manifest))
    return out


def _build_in(part: Aot | Extension, repo: Path, manifest: Path) -> list[Path]:
    """What the release's own build of the part gets in the scratch store (FRANK_CACHE)."""
    fetcher = Fetcher(BlobStore())
    if isinstance(part, Aot):
        return sorted(aotbuild.build_modules(part, repo, manifest, fetcher).values())
    return [extbuild.build_extension(part, repo, fetcher, manifest=manifest).module]


def test_release_takes_a_kept_output_equal_to_its_pin_without_building(
        repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from frank.audit.release import scratch_cache

    monkeypatch.setenv("FRANK_CACHE", str(tmp_path / "cache"))
    kept = _kept(repo, tmp_path / "cache")
    lock = _pinned_lock(repo, {name: digest for name, (_, _, digest) in kept.items()})
    ran = _no_builds(monkeypatch)
    with scratch_cache(lock, repo) as release:
        assert sorted(release.taken) == sorted(kept) and release.kept == []
        for part, manifest, _ in kept.values():
            got = _build_in(part, repo, manifest)
            assert got and all(p.is_relative_to(release.scratch) for p in got)
            real = [tmp_path / "cache" / p.relative_to(release.scratch) for p in got]
            assert [p.read_bytes() for p in got] == [p.read_bytes() for p in real]
    assert ran == []
    err = capsys.readouterr().err
    assert "building it again" not in err
    for name in kept:
        assert f"release: {name}: its kept output, hashed in full, is its output_sha256: " \
               "taken, not built again" in err


def _forge(part: Aot | Extension, repo: Path, manifest: Path, cache: Path) -> None:
    """A consistent forger: the kept bytes changed, result.json and the ledger recomputed."""
    store = BlobStore(cache)
    if isinstance(part, Aot):
        files = list(aotbuild.kept_paths(part, repo, manifest, cache).values())
    else:
        folder = extbuild.kept_folder(part, repo, cache)
        files = [folder / f"{part.module}{ext_suffix(part.python_headers)}"]
        record = json.loads((folder / "result.json").read_text())
    for path in files:
        path.write_bytes(path.read_bytes() + b" and a backdoor")
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        store.ledger.note(path, sha)
        if not isinstance(part, Aot):
            record["sha256"] = sha
            (path.parent / "result.json").write_text(json.dumps(record))
    store.ledger.save()


def test_release_refuses_a_forged_kept_output_and_builds_again(
        repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from frank.audit.release import compare, scratch_cache

    cache = tmp_path / "cache"
    monkeypatch.setenv("FRANK_CACHE", str(cache))
    kept = _kept(repo, cache)
    lock = _pinned_lock(repo, {name: digest for name, (_, _, digest) in kept.items()})
    for part, manifest, _ in kept.values():
        _forge(part, repo, manifest, cache)
    ran = _no_builds(monkeypatch)
    with scratch_cache(lock, repo) as release:
        assert release.taken == []
        found = {f.what: f.line() for f in compare(release, tmp_path / "no-layout")}
        for name, (part, manifest, digest) in kept.items():
            line = found[f"kept output of {name}"]
            assert f"output_sha256 {digest}" in line and "quarantine" in line, line
            with pytest.raises(RuntimeError, match="the compiler ran"):
                _build_in(part, repo, manifest)  # built again, not taken
    assert len(ran) == len(kept)
    err = capsys.readouterr().err
    for name in kept:
        assert f"release: {name} has a kept output that is not its output_sha256: " \
               "building it again" in err
    # moved aside: the next compose (either mode) builds it again rather than use it
    assert not list((cache / "aot").glob("*/*.so")) and not list(
        (cache / "exllamav3-ext").glob("*/*.so"))
    assert len(list((cache / "quarantine" / "outputs").iterdir())) == 3  # 2 modules + 1


def test_release_builds_an_unpinned_part_again_and_says_so(
        repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from frank.audit.release import scratch_cache

    monkeypatch.setenv("FRANK_CACHE", str(tmp_path / "cache"))
    kept = _kept(repo, tmp_path / "cache")
    lock = _pinned_lock(repo, dict.fromkeys(kept))
    ran = _no_builds(monkeypatch)
    with scratch_cache(lock, repo) as release:
        assert release.taken == [] and release.kept == []
        for part, manifest, _ in kept.values():
            with pytest.raises(RuntimeError, match="the compiler ran"):
                _build_in(part, repo, manifest)
    assert len(ran) == len(kept)
    lines = [x for x in capsys.readouterr().err.splitlines() if "pins no" in x]
    assert sorted(lines) == [f"release: {name} pins no output_sha256: building it again"
                             for name in sorted(kept)]


def test_the_pin_is_in_the_lock_but_in_no_build_key(repo: Path) -> None:
    """Pinning builds nothing again: the modules' and the module's keys stay; the lock
    carries the pin (release mode reads it there)."""
    _, layers = _plan(repo)
    for kind, layer in layers.items():
        spec = dict(getattr(layer, kind))
        assert len(spec.get("output_sha256", "")) == 64  # served's parts are pinned
        pinned, bare = _part(spec), _part({k: v for k, v in spec.items()
                                           if k != "output_sha256"})
        manifest = repo / str(layer.manifest)
        if isinstance(pinned, Aot):
            assert isinstance(bare, Aot)
            assert aotbuild.kept_paths(pinned, repo, manifest, repo) == \
                aotbuild.kept_paths(bare, repo, manifest, repo)
        else:
            assert isinstance(bare, Extension)
            assert extbuild.kept_folder(pinned, repo, repo) == \
                extbuild.kept_folder(bare, repo, repo)


def test_frank_pin_output_writes_the_kept_outputs_digest(
        repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``frank pin exl3-ext@1 --output`` takes the digest of the kept output this machine's
    store holds; without one it says so in one line."""
    from tests.spine_helpers import frank

    monkeypatch.setenv("FRANK_CACHE", str(tmp_path / "cache"))
    manifest = repo / "parts/exl3-ext/1.toml"
    text = manifest.read_text()
    manifest.write_text("\n".join(x for x in text.splitlines()
                                  if not x.startswith("output_sha256")) + "\n")
    none = frank("pin", "exl3-ext@1", "--output", cwd=repo)
    assert none.code == 2 and "no kept output of exl3-ext" in none.err, none.err
    kept = _kept(repo, tmp_path / "cache")
    done = frank("pin", "exl3-ext@1", "--output", cwd=repo)
    assert done.code == 0, done.err
    assert f'output_sha256 = "{kept["exl3-ext"][2]}"' in manifest.read_text()
