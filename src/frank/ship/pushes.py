"""What ``frank push`` pushed: ``out/pushes.jsonl``, one JSON line per push.

Why a record: a deployment must name the image by the digest the registry holds, and only
the push knows that the registry holds it. ``frank render k8s`` reads this file to find the
pushed image of a stack's *current* lock (the push records the lock digest the image
carries), and refuses to render without one. The file is keyed by lock digest, not by the
state of ``out/<stack>/``, so a recompose that gives the same image keeps its pushes.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from frank.errors import FrankError
from frank.model.kinds.base import Strict
from frank.store.jsonl import append_models, read_models

DIGEST = r"^sha256:[0-9a-f]{64}$"


class PushedWarmCache(Strict):
    """A warm cache pushed with the image (a referrer): what `frank render k8s` mounts."""

    digest: str = Field(pattern=DIGEST)  # the artifact's manifest digest in the registry
    layer: str = Field(pattern=DIGEST)
    device: str  # the device identity, canonical JSON (``frank.run.device``)
    made_on: str


class PushRecord(Strict):
    """One push: which stack's image, built from which lock, is where."""

    stack: str
    lock_digest: str = Field(pattern=DIGEST)  # the lock the image carries
    repository: str  # host[:port]/path
    digest: str = Field(pattern=DIGEST)  # the manifest digest the registry reported
    tags: list[str] = []
    time: str
    # the layer compression of what was pushed, and the layout's own (uncompressed) digest;
    # older records have neither: they pushed the layout as it was
    compression: str = "none"
    image: str | None = Field(default=None, pattern=DIGEST)
    warm_caches: list[PushedWarmCache] = []

    @property
    def reference(self) -> str:
        """``host/repo@sha256:...``."""
        return f"{self.repository}@{self.digest}"


def pushes_path(root: Path) -> Path:
    """``<repo>/out/pushes.jsonl``."""
    return root / "out" / "pushes.jsonl"


def read_pushes(root: Path) -> list[PushRecord]:
    """Every recorded push, oldest first; a bad line is an error naming the line."""
    return read_models(pushes_path(root), PushRecord)


def record_push(root: Path, record: PushRecord) -> None:
    """Append one push."""
    append_models(pushes_path(root), [record])


def pushed_image(root: Path, stack: str, lock_digest: str, registry: str | None) -> PushRecord:
    """The latest push of an image built from ``lock_digest`` (to ``registry`` if given).

    None found is one line saying which command to run: compose when the image in
    ``out/<stack>/image`` is missing or was built from another lock, else push.
    """
    from frank.image.oci import read_layout
    from frank.image.remote import LOCK_DIGEST_KEY

    found = [p for p in read_pushes(root) if p.lock_digest == lock_digest
             and (registry is None or p.repository == registry)]
    if found:
        return found[-1]
    layout = root / "out" / stack / "image"
    built = None
    if layout.is_dir():
        try:
            info = read_layout(layout, verify_layers=False)
            built = info.annotations.get(LOCK_DIGEST_KEY) or info.labels.get(LOCK_DIGEST_KEY)
        except FrankError:
            built = None
    to = registry or "HOST/REPO"
    if built != lock_digest:
        why = ("is not built" if built is None
               else f"in out/{stack}/image is built from lock {built}, not the current lock")
        raise FrankError(f"the image of {stack} ({lock_digest}) {why}: run `frank compose "
                         f"stacks/{stack}.toml`, then `frank push {stack} --to {to}`")
    where = f" to {registry}" if registry else ""
    raise FrankError(f"the image of {stack} ({lock_digest}) is built but not pushed{where}: "
                     f"run `frank push {stack} --to {to}`")
