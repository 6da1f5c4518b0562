"""Small OCI layouts written by hand, in frank's form (canonical JSON, uncompressed layers),
for tests that need an image without building one."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

from frank.image.oci import canonical_json

TAR = "application/vnd.oci.image.layer.v1.tar"


def tar_of(files: dict[str, bytes], mtime: int = 0) -> bytes:
    """A tar holding ``files`` (name -> bytes), each modified at ``mtime``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), mtime
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def write_layout(out: Path, layers: list[bytes], *, diff_ids: list[str] | None = None,
                 annotations: dict[str, str] | None = None,
                 config: dict[str, object] | None = None) -> Path:
    """A one-image layout of ``layers``; ``diff_ids`` replaces the true ones (a config that
    lies about its layers); ``config`` is the image config to use (its rootfs replaced)."""
    blobs = out / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def put(data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return f"sha256:{digest}"

    descs = [{"mediaType": TAR, "digest": put(x), "size": len(x)} for x in layers]
    rootfs = {"type": "layers", "diff_ids": diff_ids or [d["digest"] for d in descs]}
    raw_config = canonical_json({**(config or {"architecture": "amd64", "os": "linux",
                                               "config": {"Cmd": ["/hello"]}}),
                                 "rootfs": rootfs})
    manifest: dict[str, object] = {
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": put(raw_config), "size": len(raw_config)},
        "layers": descs}
    if annotations:
        manifest["annotations"] = annotations
    raw = canonical_json(manifest)
    mdig = put(raw)
    (out / "oci-layout").write_bytes(canonical_json({"imageLayoutVersion": "1.0.0"}))
    (out / "index.json").write_bytes(canonical_json({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": mdig, "size": len(raw)}]}))
    return out
