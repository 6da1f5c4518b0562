"""The compressed forms a push sends: same config and diff_ids, the same bytes for any number
of zstd threads and any cache, the uncompressed digest recoverable, kept blobs checked."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import pytest

from frank.image import compress
from frank.image.compress import image_form, uncompressed_form_digest
from frank.image.oci import resolve_manifest
from tests.oci_helpers import tar_of, write_layout


def layout_with(out: Path, sizes: list[int]) -> Path:
    """A layout with one tar layer per size of half-compressible data."""
    rng = random.Random(42)
    words = [rng.randbytes(rng.randint(3, 12)) for _ in range(4000)]
    layers = [tar_of({f"layer{n}.bin": b" ".join(rng.choice(words)
                                                 for _ in range(size // 8))[:size]})
              for n, size in enumerate(sizes)]
    return write_layout(out, layers, annotations={"dev.frank.lock.digest": "sha256:" + "1" * 64})


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 24 MB: more than one zstd job at level 3, so the worker threads really split it
    return layout_with(tmp_path_factory.mktemp("compress") / "image", [24 << 20, 3 << 20])


@pytest.mark.parametrize("kind", ["zstd", "gzip"])
def test_form_keeps_config_and_diff_ids_and_names_the_uncompressed_digest(
        layout: Path, tmp_path: Path, kind: compress.Compression) -> None:
    digest, _, manifest = resolve_manifest(layout)
    form = image_form(layout, kind, tmp_path / "cache")
    doc = json.loads(form.manifest)
    assert doc["config"] == manifest["config"] and doc["annotations"] == manifest["annotations"]
    assert [x["mediaType"] for x in doc["layers"]] == [compress.MEDIA_TYPES[kind]] * 2
    assert form.compressed_bytes < 0.6 * form.uncompressed_bytes
    for desc, diff_id in zip(doc["layers"], [x["digest"] for x in manifest["layers"]],
                             strict=True):
        assert compress.decompressed_digest(kind, form.blobs[desc["digest"]]) == diff_id
    config = json.loads(form.blobs[manifest["config"]["digest"]].read_bytes())
    assert uncompressed_form_digest(doc, config) == digest != form.digest
    # a size that lies gives another digest: the annotation is part of what is checked
    doc["layers"][0]["annotations"][compress.UNCOMPRESSED_SIZE] = "1"
    assert uncompressed_form_digest(doc, config) not in (None, digest)
    assert uncompressed_form_digest(manifest, config) is None  # not a compressed form


def test_zstd_bytes_are_the_same_for_any_thread_count_and_cache(
        layout: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    digests = set()
    for n in (1, 2, 4):
        monkeypatch.setattr(compress, "threads", lambda n=n: n)
        form = image_form(layout, "zstd", tmp_path / f"cache{n}")
        assert form.layers_compressed == 2
        digests.add(form.digest)
    assert len(digests) == 1
    # libzstd's single-threaded mode writes other bytes: why frank never uses threads=0
    monkeypatch.setattr(compress, "threads", lambda: 0)
    assert image_form(layout, "zstd", tmp_path / "cache0").digest not in digests


def test_a_kept_blob_is_checked_before_it_is_reused(layout: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = image_form(layout, "zstd", cache)
    again = image_form(layout, "zstd", cache)
    assert again.digest == first.digest and again.layers_compressed == 0
    # the kept blob of layer 0 replaced by a valid zstd frame of other bytes, renamed to its
    # own digest and recorded: it hashes right but does not decompress to the diff_id
    import zstandard

    other = zstandard.ZstdCompressor().compress(b"not the layer")
    hexd = hashlib.sha256(other).hexdigest()
    (cache / "blobs" / hexd).write_bytes(other)
    diff0 = resolve_manifest(layout)[2]["layers"][0]["digest"].split(":")[1]
    record = next(p for p in cache.iterdir() if p.name.startswith("zstd"))
    (record / diff0).write_text(f"sha256:{hexd}\n")
    fixed = image_form(layout, "zstd", cache)
    assert fixed.digest == first.digest and fixed.layers_compressed == 1


def test_none_is_the_layout_itself(layout: Path, tmp_path: Path) -> None:
    digest, raw, _ = resolve_manifest(layout)
    form = image_form(layout, "none", tmp_path / "cache")
    assert (form.digest, form.manifest) == (digest, raw)
    assert not (tmp_path / "cache").exists()
