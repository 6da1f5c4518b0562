"""Which pushed warm cache a rendered deployment mounts, and how (issue 55).

The push record lists the warm caches `frank push` attached to the image (digest, layer,
device identity). The deployment's device is what its lock targets: for ``arch = "sm_120"``
and ``gpus = 2``, a cache made on two GPUs of compute capability 12.0; for ``arch = "cpu"``,
a CPU's. Several such caches (another driver, another CPU model) are not guessed between:
``--warm-cache DIGEST`` names one. A cache made for another device is never mounted.

How: Kubernetes 1.35 and later mount OCI objects as image volumes by default (the
``ImageVolume`` feature gate, beta and on from 1.35): the kubelet pulls the artifact by
digest, and the init step reads its layer from the volume; earlier versions get an init step
that pulls it by digest itself. Both run ``warm_init.py`` (in the engine's image, stdlib and
libzstd only), which checks every digest and unpacks into the pod's ``/frank/warm`` folder.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from frank.errors import FrankError
from frank.resolve.lock import Lock
from frank.ship.pushes import PushedWarmCache, PushRecord

# the first Kubernetes minor version whose kubelet mounts image volumes by default
IMAGE_VOLUME_SINCE = (1, 35)
_VERSION = re.compile(r"v?([0-9]+)\.([0-9]+)(\.[0-9]+)?")


@dataclass(frozen=True)
class WarmMount:
    """The warm cache a pod gets: ``repository@digest``, its layer, where it was made."""

    repository: str
    digest: str
    layer: str
    made_on: str
    image_volume: bool  # mounted by the kubelet (an image volume), else pulled by the init step

    @property
    def reference(self) -> str:
        return f"{self.repository}@{self.digest}"


def kube_version(text: str | None) -> tuple[int, int] | None:
    """``1.35`` (or ``v1.35.2``) as (1, 35); None: not given."""
    if text is None:
        return None
    m = _VERSION.fullmatch(text.strip())
    if m is None:
        raise FrankError(f"{text!r} is not a Kubernetes version like 1.35", field="--kube-version")
    return int(m.group(1)), int(m.group(2))


def fits(lock: Lock, device_json: str) -> bool:
    """Whether a cache made on ``device_json`` is for the lock's target device."""
    try:
        dev = json.loads(device_json)
    except ValueError:
        return False
    if not isinstance(dev, dict):
        return False
    arch = str(lock.target.get("arch", "cpu"))
    if arch == "cpu":
        return dev.get("kind") == "cpu"
    m = re.fullmatch(r"sm_([0-9]+)([0-9])[af]?", arch)
    gpus = dev.get("gpus") or []
    if dev.get("kind") != "gpu" or m is None or len(gpus) != int(lock.target.get("gpus", 0)):
        return False
    want = f"{m.group(1)}.{m.group(2)}"
    return all(isinstance(g, dict) and g.get("compute_capability") == want for g in gpus)


def choose(lock: Lock, push: PushRecord, choice: str, version: str | None) -> WarmMount | None:
    """The warm cache to mount: ``choice`` "auto" (the one pushed for the target's device,
    none if none), "none", or a pushed cache's digest. Bad choices are one line naming
    ``--warm-cache``."""
    since = kube_version(version)
    if choice == "none":
        return None
    fitting = [w for w in push.warm_caches if fits(lock, w.device)]
    if choice == "auto":
        if len(fitting) > 1:
            names = ", ".join(f"{w.digest} ({w.made_on})" for w in fitting)
            raise FrankError(f"{len(fitting)} warm caches were pushed for this target: {names}; "
                             "name one", field="--warm-cache")
        picked: PushedWarmCache | None = fitting[0] if fitting else None
    else:
        picked = next((w for w in push.warm_caches if w.digest == choice), None)
        if picked is None:
            raise FrankError(f"{choice} is not a warm cache pushed with {push.reference} "
                             "(`frank warm`, then `frank push`)", field="--warm-cache")
        if picked not in fitting:
            raise FrankError(f"{choice} was made on {picked.made_on}, not for this "
                             f"deployment's {lock.target.get('arch')} x"
                             f"{lock.target.get('gpus', 0)}", field="--warm-cache")
    if picked is None:
        return None
    return WarmMount(push.repository, picked.digest, picked.layer, picked.made_on,
                     since is not None and since >= IMAGE_VOLUME_SINCE)
