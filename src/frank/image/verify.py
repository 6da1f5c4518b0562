"""An OCI layout checked blob by blob before it runs, and the lock it carries.

Why re-hash everything at run time: a layout is a folder anyone can edit, and the container
engine would run an edited layer without a word (buildah and podman check blobs they pull
from a registry, not from ``oci:``). Every blob the image is made of (manifest, config, each
layer) must hash to its digest; an edited layer is named by its index and the history line
that made it, so the refusal says which part's layer changed.
"""

from __future__ import annotations

import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from frank.errors import FrankError
from frank.image.oci import layout_blob_path, read_layout_blob, resolve_manifest
from frank.image.spec import LOCK_IN_IMAGE
from frank.store.blobs import check_digest, sha256_file
from frank.store.ledger import Ledger

LOCK_DIGEST_KEY = "dev.frank.lock.digest"


@dataclass(frozen=True)
class Layer:
    """One layer of a verified image: where its blob is and what made it."""

    index: int
    digest: str
    path: Path
    created_by: str

    def label(self) -> str:
        """``layer 2 (frank: frank:launcher)``, or ``layer 2`` without a history line."""
        return f"layer {self.index} ({self.created_by})" if self.created_by else \
            f"layer {self.index}"


@dataclass(frozen=True)
class VerifiedImage:
    """A layout whose every blob matched its digest when it was checked."""

    layout: Path
    digest: str
    config: dict[str, Any]
    annotations: dict[str, str]
    layers: list[Layer] = field(default_factory=list)

    @property
    def entrypoint(self) -> list[str]:
        return list((self.config.get("config") or {}).get("Entrypoint") or [])

    @property
    def cmd(self) -> list[str]:
        return list((self.config.get("config") or {}).get("Cmd") or [])

    @property
    def lock_digest(self) -> str | None:
        """The lock digest compose wrote (manifest annotation, else config label)."""
        labels = (self.config.get("config") or {}).get("Labels") or {}
        return self.annotations.get(LOCK_DIGEST_KEY) or labels.get(LOCK_DIGEST_KEY)


def _history(config: dict[str, Any]) -> list[str]:
    """``created_by`` of each history entry that made a layer, in layer order."""
    hist = config.get("history") or []
    return [str(h.get("created_by", "")) for h in hist
            if isinstance(h, dict) and not h.get("empty_layer")]


def verify_layout(layout: Path, *, ledger: Ledger | None = None) -> VerifiedImage:
    """Re-hash the manifest, the config and every layer; the first mismatch is one line.
    With the store's stat ``ledger`` (``frank run``: the developer's loop), a layer blob
    the ledger vouches for is not hashed again, and one hashed here is noted in it, so the
    audit that follows keeps its readings (docs/trust.md: local mistakes)."""
    layout = Path(layout).absolute()
    digest, _, manifest = resolve_manifest(layout)  # index -> manifest, manifest verified
    cdesc = manifest.get("config") or {}
    cdig = check_digest(str(cdesc.get("digest", "")), file=layout, field="manifest config")
    try:
        config = json.loads(read_layout_blob(layout, cdig, "config"))
    except ValueError:
        raise FrankError("corrupt OCI layout: config is not valid JSON",
                         file=layout_blob_path(layout, cdig)) from None
    if not isinstance(config, dict):
        raise FrankError("corrupt OCI layout: config is not a JSON object",
                         file=layout_blob_path(layout, cdig))
    made_by = _history(config)
    layers = []
    for i, desc in enumerate(manifest.get("layers") or []):
        ldig = check_digest(str((desc or {}).get("digest", "")), file=layout,
                            field=f"manifest layers[{i}]")
        layer = Layer(i, ldig, layout_blob_path(layout, ldig),
                      made_by[i] if i < len(made_by) else "")
        _check_layer(layer, int((desc or {}).get("size", -1)), ledger)
        layers.append(layer)
    return VerifiedImage(layout, digest, config, dict(manifest.get("annotations") or {}),
                         layers)


class LayerChanged(FrankError):
    """A layer blob whose bytes are not the ones its manifest names: the image was changed
    after it was built (``frank verify`` reports it as a failed verification, exit 1)."""


def _check_layer(layer: Layer, size: int, ledger: Ledger | None = None) -> None:
    what = f"refusing to run: {layer.label()} blob {layer.digest}"
    if not layer.path.is_file():
        raise FrankError(f"{what} is missing from the layout", file=layer.path)
    if layer.path.stat().st_size != size:
        raise LayerChanged(f"{what} has {layer.path.stat().st_size} bytes, the manifest says "
                           f"{size}: the image was changed after it was built", file=layer.path)
    actual = sha256_file(layer.path) if ledger is None else \
        "sha256:" + ledger.sha256(layer.path)
    if actual != layer.digest:
        raise LayerChanged(f"{what} hashes to {actual}: the layer was changed after the image "
                           "was built (compose it again)", file=layer.path)


def image_lock(image: VerifiedImage) -> dict[str, Any]:
    """The lock the image carries at ``/etc/frank/frank.lock`` (the newest layer with it)."""
    names = {LOCK_IN_IMAGE.lstrip("/"), "." + LOCK_IN_IMAGE, LOCK_IN_IMAGE}
    for layer in reversed(image.layers):
        try:
            with tarfile.open(layer.path, "r:*") as tar:
                member = next((m for m in tar if m.name in names and m.isfile()), None)
                handle = tar.extractfile(member) if member is not None else None
                if handle is None:
                    continue
                data = handle.read()
        except (tarfile.TarError, OSError) as exc:
            raise FrankError(f"{layer.label()} is not a readable tar ({exc})",
                             file=layer.path) from None
        try:
            lock = json.loads(data)
        except ValueError:
            raise FrankError(f"{LOCK_IN_IMAGE} in {layer.label()} is not valid JSON",
                             file=layer.path) from None
        if not isinstance(lock, dict) or "digest" not in lock:
            raise FrankError(f"{LOCK_IN_IMAGE} in {layer.label()} is not a frank lock",
                             file=layer.path)
        return lock
    raise FrankError(f"not an image frank built: no layer holds {LOCK_IN_IMAGE}",
                     file=image.layout)
