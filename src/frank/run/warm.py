"""``frank warm``: start the image once with every engine cache in one fresh folder, send a
short workload, stop it, and keep the folder as a warm artifact (``run.warmcache``).

Why a workload and not just a start: vLLM compiles and captures graphs for its configured
sizes while starting, but some caches fill only when requests arrive (Triton kernels a
first prefill or decode selects, FlashInfer modules JIT-built on first use, autotuning of a
new shape). The default workload is a few chat requests of growing prompt length, each well
inside the engine's ``max-model-len``.

Nothing half-written: the folder is a per-process folder of ``/tmp`` (``store.tmpdirs``),
the blobs go in through the store's temp + rename, and the index entry is written last; a
``frank warm`` killed at any point leaves at most blobs nothing names (``frank gc`` takes
them) and its folder (reaped by the next run).
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from frank.errors import FrankError
from frank.image.oci import resolve_manifest
from frank.image.verify import VerifiedImage
from frank.model.stack import WarmWorkload
from frank.run import warmcache
from frank.run.container import RunPlan
from frank.run.device import Device
from frank.run.supervise import serving
from frank.store.blobs import BlobStore
from frank.store.tmpdirs import owned

_WORDS = ("the", "engine", "compiles", "each", "shape", "once", "and", "reads", "it", "later")


@dataclass(frozen=True)
class Workload:
    """A few chat requests: prompt lengths in words, and tokens to generate for each."""

    prompts: tuple[int, ...] = (8, 128, 512)
    max_tokens: int = 16

    @classmethod
    def of(cls, spec: WarmWorkload | None, *, prompts: tuple[int, ...] | None = None,
           max_tokens: int | None = None) -> Workload:
        """The stack's ``[warm]`` (``spec``; None: the default), the options over it."""
        base = cls(tuple(spec.prompts), spec.max_tokens) if spec is not None else cls()
        return cls(prompts or base.prompts, max_tokens or base.max_tokens)

    def as_json(self) -> dict[str, Any]:
        return {"prompts": list(self.prompts), "max_tokens": self.max_tokens}

    def bodies(self, model: str, max_model_len: int) -> list[dict[str, Any]]:
        out = []
        for words in self.prompts:
            n = max(1, min(words, max_model_len // 4))
            text = " ".join(_WORDS[i % len(_WORDS)] for i in range(n))
            out.append({"model": model, "max_tokens": self.max_tokens, "temperature": 0,
                        "messages": [{"role": "user", "content": text}]})
        return out


def _post(url: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return dict(json.loads(resp.read()))


def send(base: str, lock: dict[str, Any], workload: Workload, timeout: float) -> int:
    """Send the workload to the engine at ``base``; how many requests were answered."""
    try:
        with urllib.request.urlopen(f"{base}/v1/models", timeout=timeout) as resp:
            model = str(json.loads(resp.read())["data"][0]["id"])
        flags = lock.get("flags") or {}
        done = 0
        for body in workload.bodies(model, int(flags.get("max-model-len") or 2048)):
            _post(f"{base}/v1/chat/completions", body, timeout)
            done += 1
    except (OSError, ValueError, KeyError, IndexError) as exc:
        raise FrankError(f"the warm-up workload failed against {base}: {exc}") from None
    return done


def subject(image: VerifiedImage) -> dict[str, Any]:
    """The image's manifest descriptor (what a registry lists the artifact under)."""
    digest, raw, doc = resolve_manifest(Path(image.layout), image.digest)
    return {"mediaType": doc.get("mediaType") or "application/vnd.oci.image.manifest.v1+json",
            "digest": digest, "size": len(raw)}


def make(image: VerifiedImage, lock: dict[str, Any], device: Device, store: BlobStore,
         plan_for: Callable[[Path], RunPlan], *, workload: Workload, ready_timeout: float,
         output: IO[bytes] | None = None) -> tuple[warmcache.Artifact, dict[str, float]]:
    """Start, load, stop, pack; the artifact and the seconds each phase took."""
    times: dict[str, float] = {}
    log = output or sys.stderr.buffer
    with owned("warmmake") as work:
        folder = warmcache.prepare(work / "cache")
        plan = plan_for(folder)
        t0 = time.monotonic()
        with serving(plan, ready_timeout, log):
            times["ready_s"] = time.monotonic() - t0
            t1 = time.monotonic()
            n = send(plan.url.removesuffix("/health"), lock, workload, ready_timeout)
            times["workload_s"] = time.monotonic() - t1
            times["requests"] = n
        t2 = time.monotonic()
        artifact = warmcache.make(store, folder, subject=subject(image), image=image.digest,
                                  device=device, workload=workload.as_json())
        times["pack_s"] = time.monotonic() - t2
    return artifact, times
