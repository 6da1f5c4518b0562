"""``frank image import``: a base image brought on a file, used exactly as if pulled.

A machine with no path to the registry gets the pinned base from one that has: an OCI
layout folder, or a tar of one (``skopeo copy --preserve-digests docker://REF@DIGEST
oci-archive:FILE``, or ``docker save`` of Docker 25+, whose archive is also an OCI layout;
without --preserve-digests skopeo may rewrite the manifest, and the pin no longer matches).
The source is trusted
for nothing: the pinned digest must be one of its blobs, that blob's bytes must hash to it
(an image index is followed to this machine's platform, as a pull does), and every blob the
image names is hashed on the way in. The result is filed where a pull of that digest puts
it (``<cache>/bases/<hex>`` and its ``.pinned`` record), so every later command finds it
and never asks the registry. A ``docker save`` archive without ``index.json`` (the classic
image store before Docker 25) keeps no registry manifest, so no pin can be checked against
it: refused, saying how to save one that can.
"""

from __future__ import annotations

import json
import shutil
import tarfile
import tempfile
from pathlib import Path

from frank.errors import FrankError
from frank.hashing import sha256_file
from frank.image.oci import OCI_INDEX, canonical_json

_LISTS = ("manifests",)


def digests_in(source: Path, work: Path) -> Path:
    """The OCI layout ``source`` is, or holds (a tar is unpacked into ``work``: only its
    ``oci-layout``, ``index.json`` and ``blobs/sha256/<hex>`` members, regular files)."""
    if source.is_dir():
        if not (source / "blobs" / "sha256").is_dir():
            raise FrankError("not an OCI layout (no blobs/sha256 folder)", file=source)
        return source
    try:
        with tarfile.open(source) as tar:
            names = set()
            for member in tar:
                name = member.name.removeprefix("./")
                names.add(name)
                parts = name.split("/")
                wanted = name in ("oci-layout", "index.json") or (
                    len(parts) == 3 and parts[:2] == ["blobs", "sha256"]
                    and len(parts[2]) == 64 and all(c in "0123456789abcdef" for c in parts[2]))
                if not wanted or not member.isfile():
                    continue
                dest = work / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                src = tar.extractfile(member)
                assert src is not None
                with dest.open("wb") as out:
                    shutil.copyfileobj(src, out, 1 << 20)
    except (OSError, tarfile.TarError) as exc:
        raise FrankError(f"not a readable tar or OCI layout ({exc})", file=source) from None
    if not (work / "blobs" / "sha256").is_dir():
        said = (" (a docker save of the classic image store: it keeps no registry manifest, "
                "so the pin cannot be checked; save it with `skopeo copy --preserve-digests "
                "docker://REF@DIGEST oci-archive:FILE`, or from Docker 25+ with the "
                "containerd image store)"
                if "manifest.json" in names else "")
        raise FrankError(f"holds no OCI layout (no blobs/sha256){said}", file=source)
    return work


def _blob(layout: Path, digest: str, what: str) -> Path:
    path = layout / "blobs" / "sha256" / digest.split(":", 1)[1]
    if not path.is_file():
        raise FrankError(f"{what} {digest} is not in it", file=layout)
    if f"sha256:{sha256_file(path)}" != digest:
        raise FrankError(f"{what} {digest}: its bytes do not match the digest", file=layout)
    return path


def import_pinned(layout: Path, source: Path, digest: str, out_layout: Path) -> str:
    """File the image ``digest`` pins from ``layout`` (unpacked from ``source``) as the
    pulled layout ``out_layout``; returns the platform manifest's digest."""
    from frank.image.oci import _go_arch
    from frank.image.remote import file_pinned

    raw = _blob(layout, digest, "the pinned image").read_bytes()
    doc = json.loads(raw)
    target = digest
    if "manifests" in doc and "layers" not in doc:
        arch = _go_arch()
        entry = next((d for d in doc["manifests"] if (d.get("platform") or {}).get("os")
                      == "linux" and (d.get("platform") or {}).get("architecture") == arch),
                     None)
        if entry is None:
            raise FrankError(f"the pinned image index {digest} has no linux/{arch} image",
                             file=source)
        target = str(entry["digest"])
        raw = _blob(layout, target, "the platform image").read_bytes()
        doc = json.loads(raw)
    wanted = [target, str(doc["config"]["digest"]), *(str(x["digest"]) for x in doc["layers"])]
    out_layout.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_layout.name}.tmp-", dir=out_layout.parent))
    try:
        blobs = tmp / "layout" / "blobs" / "sha256"
        blobs.mkdir(parents=True)
        for d in dict.fromkeys(wanted):
            shutil.copyfile(_blob(layout, d, "a blob of the image"), blobs / d.split(":")[1])
        (tmp / "layout" / "oci-layout").write_bytes(
            canonical_json({"imageLayoutVersion": "1.0.0"}))
        media = doc.get("mediaType", "application/vnd.oci.image.manifest.v1+json")
        (tmp / "layout" / "index.json").write_bytes(canonical_json({
            "schemaVersion": 2, "mediaType": OCI_INDEX,
            "manifests": [{"mediaType": media, "digest": target, "size": len(raw)}]}))
        file_pinned(tmp / "layout", out_layout, digest, target)  # as a pull files it
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def blob_digests(layout: Path) -> set[str]:
    """Every ``sha256:<hex>`` the layout holds a blob file for."""
    return {f"sha256:{p.name}" for p in (layout / "blobs" / "sha256").iterdir() if p.is_file()}
