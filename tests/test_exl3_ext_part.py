"""parts/exl3-ext: exllamav3's extension as an ``extension`` part (frank.model.kinds.extension,
frank.assemble.extension), checked without compiling: every field is in the inputs the lock
records or in the build's key, a changed input changes the key, a wrong field is one line.
The build itself (one source, ``--only``) is tests/test_exllamav3_ext_build.py's slow test;
the whole module is bench/exllamav3_ext_build.py's (about an hour on 2 cores).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from frank.assemble.extension import build_key, inputs, torch_archs
from frank.errors import FrankError
from frank.model.kinds import PART_ADAPTER
from frank.model.kinds.base import PartContext
from frank.model.kinds.extension import Extension, ext_suffix
from tests.spine_helpers import frank

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "parts" / "exl3-ext" / "1.toml"
PY = "libpython3.11-dev"
SUFFIX = ".cpython-311-x86_64-linux-gnu.so"


def _raw() -> dict[str, Any]:
    return tomllib.loads(MANIFEST.read_text(encoding="utf-8"))


def _part(raw: dict[str, Any] | None = None) -> Extension:
    part = PART_ADAPTER.validate_python(raw or _raw())
    assert isinstance(part, Extension)
    return part


def _key(part: Extension, root: Path = ROOT, **over: Any) -> str:
    args: dict[str, Any] = {"archs": torch_archs(list(part.archs)), "only": [],
                            "python": [part.python_headers.package],
                            "suffix": ext_suffix(part.python_headers)}
    return build_key(part, root, **{**args, **over})


def test_the_lock_records_every_pinned_input() -> None:
    part = _part()
    got = part.inputs(PartContext(root=ROOT, manifest=MANIFEST))
    raw = _raw()
    pins = [raw["wheel"], *raw["toolchain"], *raw["headers"], raw["python_headers"]]
    assert {p["url"]: p["sha256"] for p in pins}.items() <= got.items()
    assert "builders/exllamav3-ext/" in got and len(got) == len(pins) + 1
    # the build's labels: the distribution, each wheel's name, the .deb's package
    labels = inputs(part)
    assert labels["exllamav3"].take == "exllamav3/" and labels["torch"].take == "include"
    assert labels["nvidia-cuda-nvcc"].take == "nvidia/" and labels[PY].take == "deb"
    assert ext_suffix(part.python_headers) == SUFFIX


def _swap(raw: dict[str, Any], table: str, index: int | None) -> dict[str, Any]:
    """``raw`` with one pinned input's sha256 changed."""
    item = raw[table] if index is None else raw[table][index]
    item["sha256"] = "0" * 64
    return raw


@pytest.mark.parametrize("change", [
    lambda r: _swap(r, "wheel", None), lambda r: _swap(r, "toolchain", 0),
    lambda r: _swap(r, "headers", 0), lambda r: _swap(r, "headers", 4),
    lambda r: _swap(r, "python_headers", None), lambda r: {**r, "archs": ["9.0a", "12.0"]},
])
def test_a_changed_input_changes_the_key(change: Any) -> None:
    assert _key(_part(change(_raw()))) != _key(_part())


def test_the_builder_sources_and_python_are_in_the_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    part = _part()
    base = _key(part)
    assert _key(part) == base  # stable
    assert _key(part, only=["add.cu"]) != base
    assert _key(part, python=["a" * 64]) != base
    import frank.assemble.extension as extension

    monkeypatch.setattr(extension, "ROOT", tmp_path / "fixed")  # nvcc writes paths in
    assert _key(part) != base
    monkeypatch.undo()
    assert _key(part, suffix=".cpython-312-x86_64-linux-gnu.so") != base
    builder = tmp_path / "builders" / "exllamav3-ext"
    builder.mkdir(parents=True)
    source = (ROOT / "builders/exllamav3-ext/build.py").read_bytes()
    (builder / "build.py").write_bytes(source)
    same = _key(part, tmp_path)
    (builder / "build.py").write_bytes(source + b"\n# changed\n")
    assert _key(part, tmp_path) != same


@pytest.mark.parametrize(("raw_change", "field"), [
    (lambda r: {**r, "jobs": 4}, "jobs"),
    (lambda r: {**r, "module": "exllamav3-ext"}, "module"),
    (lambda r: {**r, "python_headers": {**r["python_headers"], "sha256": "xyz"}},
     "python_headers.sha256"),
])
def test_a_wrong_field_is_refused(raw_change: Any, field: str) -> None:
    with pytest.raises(Exception) as err:
        _part(raw_change(_raw()))
    assert field.split(".")[-1] in str(err.value)


def test_a_mixed_toolchain_or_odd_headers_deb_is_one_line_at_lock_time() -> None:
    raw = _raw()
    crt = raw["toolchain"][1]
    crt["url"] = crt["url"].replace("nvidia_cuda_crt-13.0.88", "nvidia_cuda_crt-13.5.37")
    with pytest.raises(FrankError) as err:
        _part(raw).inputs(PartContext(root=ROOT, manifest=MANIFEST))
    assert err.value.field == "toolchain" and "nvidia-cuda-crt 13.5.37 is CUDA 13.5" \
        in str(err.value)
    raw = _raw()
    raw["python_headers"]["url"] = raw["python_headers"]["url"].replace(
        "libpython3.11-dev", "libpython3.11-stdlib")
    with pytest.raises(FrankError) as err:
        _part(raw).inputs(PartContext(root=ROOT, manifest=MANIFEST))
    assert err.value.field == "python_headers.url"


def test_the_cli_names_the_file_and_the_field_in_one_line(repo: Path) -> None:
    manifest = repo / "parts/exl3-ext/1.toml"
    manifest.write_text(manifest.read_text().replace('archs = ["12.0"]',
                                                     'archs = ["12.0"]\njobs = 4'))
    out = frank("show", "exl3-ext@1", cwd=repo)
    assert out.code == 2, (out.out, out.err)
    assert out.err.strip().splitlines() == [
        "frank: error: parts/exl3-ext/1.toml: jobs: unknown field"]


def _served_with_the_part(repo: Path) -> None:
    served = repo / "stacks/served.toml"
    text = served.read_text()
    if 'exl3-ext = "1"' not in text:
        served.write_text(text.replace('flashinfer-aot = "1"\n',
                                       'flashinfer-aot = "1"\nexl3-ext = "1"\n'))
    out = frank("lock", "served", cwd=repo)
    assert out.code == 0, out.err


@pytest.mark.parametrize(("field", "change"), [
    ("wheel", lambda s: s["wheel"].update(sha256="1" * 64)),
    ("headers", lambda s: s["headers"][0].update(sha256="1" * 64)),  # not the closure's torch
    ("python_headers", lambda s: s["python_headers"].update(url=s["python_headers"]["url"]
                                                            .replace("3.11", "3.12"))),
])
def test_the_build_refuses_what_the_image_would_not_match(repo: Path, tmp_path: Path,
                                                          field: str, change: Any) -> None:
    """Sources or torch headers other than the closure's, or another Python's headers: the
    layer is refused before anything is fetched or built, naming the field."""
    import copy

    from frank.assemble.builder import _build_extension
    from frank.assemble.plan import build_plan
    from frank.resolve.lock import read_lock
    from frank.store.blobs import BlobStore
    from frank.store.fetch import Fetcher

    _served_with_the_part(repo)
    plan = build_plan(read_lock(repo / "stacks/served.lock"), repo)
    layer = next(x for x in plan.layers if x.extension is not None)
    assert layer.name == "extension:exl3-ext" and layer.part == "exl3-ext"
    assert layer.extension is not None
    spec = copy.deepcopy(layer.extension)
    change(spec)
    bad = layer.model_copy(update={"extension": spec})
    with pytest.raises(FrankError) as err:
        _build_extension(bad, plan, repo, tmp_path, Fetcher(BlobStore(tmp_path / "store")),
                         tmp_path / "log")
    assert err.value.field == field, str(err.value)
    assert not (tmp_path / "store" / "exllamav3-ext").exists()


def test_a_kept_module_is_used_only_if_it_is_what_its_record_says(tmp_path: Path) -> None:
    """The same key builds nothing: the kept module is returned, after its sha256 is held
    to its result.json (a file changed in the cache is named, never placed)."""
    import hashlib
    import json

    from frank.assemble.extension import build_extension
    from frank.store.blobs import BlobStore
    from frank.store.fetch import Fetcher

    raw = _raw()
    del raw["output_sha256"]  # the made-up module is not what the pin says (test_output_pins)
    part = _part(raw)
    kept = tmp_path / "store" / "exllamav3-ext" / _key(part)
    kept.mkdir(parents=True)
    module = kept / f"exllamav3_ext{SUFFIX}"
    module.write_bytes(b"\x7fELF module")
    (kept / "result.json").write_text(json.dumps({
        "module": module.name, "sha256": hashlib.sha256(module.read_bytes()).hexdigest()}))
    fetcher = Fetcher(BlobStore(tmp_path / "store"))
    assert build_extension(part, ROOT, fetcher).module == module  # kept: nothing fetched
    assert not (tmp_path / "store" / "blobs" / "sha256").exists() or not any(
        (tmp_path / "store" / "blobs" / "sha256").iterdir())
    module.write_bytes(b"\x7fELF other")
    with pytest.raises(FrankError) as err:
        build_extension(part, ROOT, fetcher)
    assert "is not what its result.json records" in str(err.value)
