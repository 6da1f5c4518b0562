"""The embedded builder's missing layers: downloads in flight while layers are tarred.

A cold build of served used to fetch all 4.3 GB of wheels first and only then assemble 38
layers one after the other, each through a staging tree
(bench/results/profile-build-2026-12-02.md). Here many downloads are in flight at once,
largest first, and a layer made only of wheels is streamed into its blob (``wheeltar``) by a
worker process (``layerpool``: one per core, the largest ready layer first) as soon as its
last wheel is in the store, so the network and the CPU work at the same time. A layer that
brings anything else (repo files, a patch, a kernel, a repo wheel) goes the staging way, in
the calling thread, as soon as its own wheels are in (a kernel compiles while the closure
downloads).

The first failure stops everything: queued downloads are cancelled, running layers stop at
their next file, and the failure is raised (a failed download is raised once the staged
layer being made, if any, is done: a compile is not cut off). Nothing half-made enters the
store: a blob is renamed in only when its tar is whole, and the index names it only after.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from frank.assemble.layerpool import Job, LayerPool, Tap
from frank.assemble.plan import PlanLayer
from frank.image.layer import LAYER_MEDIA_TYPE, index_key
from frank.image.spec import LayerInput
from frank.store.blobs import LayerRecord
from frank.store.fetch import Fetcher, Pinned

# Downloads in flight: one stream rarely fills the link (uv keeps dozens open).
FETCH_JOBS = 12
# Layers streamed at once: inflating and hashing are CPU work, one process per core.
TAR_JOBS = max(1, min(4, os.cpu_count() or 1))


def streamable(layer: PlanLayer) -> bool:
    """A layer of wheels only: its tar can be written from the wheels themselves."""
    return bool(layer.wheels) and not (
        layer.files or layer.generated or layer.patch or layer.build_wheels or layer.kernel
        or layer.run or layer.stage or layer.pip_install or layer.base_remove)


@dataclass
class Built:
    """What the pipeline made: blobs written by this process or its workers (hashed on their
    way in, so the output layout need not hash them again) and how each layer was made."""

    fresh: set[str] = field(default_factory=set)
    streamed: list[str] = field(default_factory=list)
    staged: list[str] = field(default_factory=list)
    tapped: dict[str, Any] = field(default_factory=dict)  # blob digest -> its tap's result


def inputs(layers: list[PlanLayer]) -> dict[str, Pinned]:
    """Every wheel the layers install (a patch's engine wheel too), once per sha256."""
    items: dict[str, Pinned] = {}
    for layer in layers:
        for w in layer.wheels:
            items[w.sha256] = Pinned(w.url, w.sha256, w.size)
        if layer.patch and layer.patch.engine_wheel:
            ew = layer.patch.engine_wheel
            items[ew.sha256] = Pinned(ew.url, ew.sha256, ew.size)
    return items


def build_missing(missing: list[tuple[PlanLayer, LayerInput]], *, site: str, epoch: int,
                  fetcher: Fetcher, stage: Callable[[PlanLayer, LayerInput], str],
                  note: Callable[[str], None],
                  progress: Callable[[Pinned], None] | None = None,
                  fetch_jobs: int = FETCH_JOBS, tar_jobs: int = TAR_JOBS,
                  since: float | None = None, tap: Callable[[], Tap] | None = None) -> Built:
    """Make every missing layer's blob and index entry.

    ``stage(layer, spec_layer)`` builds one layer the staging way and returns its blob's
    digest; it is called for the layers that cannot be streamed, and for a streamed layer
    whose wheel refuses streaming (a zip that does not read back), so that layer's bytes are
    whatever the staging route makes of it. The log's "at N s" counts from ``since`` (a
    ``time.monotonic()`` value; the build's start), else from this call. ``tap``: see
    ``layerpool``; each streamed layer's result is in ``Built.tapped`` by blob digest.
    """
    store = fetcher.store
    start = time.monotonic() if since is None else since
    built = Built()
    lock = threading.Lock()
    items = inputs([x for x, _ in missing])
    streamed = [(x, s) for x, s in missing if streamable(x)]
    staged = [(x, s) for x, s in missing if not streamable(x)]
    waiting = {x.index: {w.sha256 for w in x.wheels} for x, _ in streamed}
    by_sha: dict[str, list[tuple[PlanLayer, LayerInput]]] = {}
    for x, s in streamed:
        for w in x.wheels:
            by_sha.setdefault(w.sha256, []).append((x, s))

    def staged_route(layer: PlanLayer, spec_layer: LayerInput) -> None:
        digest = stage(layer, spec_layer)
        built.fresh.add(digest)
        built.staged.append(layer.name)

    pool = LayerPool(tar_jobs if streamed else 0, store.root, tap)
    stop = pool.stop

    def ready(layer: PlanLayer, spec_layer: LayerInput) -> None:
        """Every wheel of a streamed layer is in: hand it to a worker (paths checked here,
        where a bad stored wheel is moved aside and raised)."""
        wheels = tuple((w.filename, store.verified_path(Pinned(w.url, w.sha256).digest))
                       for w in layer.wheels)
        pool.add(Job((layer, spec_layer), wheels, site, epoch,
                     index_key(spec_layer, epoch), sum(w.size or 0 for w in layer.wheels)))

    dl = ThreadPoolExecutor(max_workers=max(1, fetch_jobs), thread_name_prefix="frank-fetch")

    def fetched(item: Pinned) -> Path:
        path = fetcher.fetch(item)
        if progress is not None:
            progress(item)
        for x, s in by_sha.get(item.sha256, []):
            with lock:
                left = waiting[x.index]
                left.discard(item.sha256)
                now = not left and not stop.is_set()
            if now:
                ready(x, s)
        return path

    with pool:
        try:
            order = sorted(items.values(), key=lambda i: -(i.size or 0))  # long ones first
            downloads = {item.sha256: dl.submit(fetched, item) for item in order}
            for x, s in staged:  # meanwhile, in this thread: each once its own wheels are in
                needs = [w.sha256 for w in x.wheels]
                if x.patch and x.patch.engine_wheel:
                    needs.append(x.patch.engine_wheel.sha256)
                for sha in needs:
                    downloads[sha].result()
                staged_route(x, s)
            done, _ = wait(list(downloads.values()), return_when=FIRST_EXCEPTION)
            for f in done:
                f.result()  # the first failure raises here
            dl.shutdown(wait=True)  # every download's layer is handed to the pool
            note(f"inputs: {len(items)} needed, {fetcher.downloaded} downloaded, "
                 f"{fetcher.from_mirror} from a mirror, the rest already in the store; all "
                 f"in at {time.monotonic() - start:.1f} s")
            for r in pool.results():
                layer, spec_layer = r.tag
                if r.refused:  # StreamRefused, or installer refusing a wheel: the staging
                    # route then makes the same bytes, or fails in the words it always used
                    note(f"layer {layer.index} {layer.name}: not streamed ({r.refused}); "
                         "staged instead")
                    staged_route(layer, spec_layer)
                    continue
                store.put_layer(index_key(spec_layer, epoch), LayerRecord(
                    digest=r.digest, diff_id=r.digest, size=r.size,
                    media_type=LAYER_MEDIA_TYPE))
                built.fresh.add(r.digest)
                built.streamed.append(layer.name)
                if r.tapped is not None:
                    built.tapped[r.digest] = r.tapped
                note(f"layer {layer.index} {layer.name}: built (streamed) in "
                     f"{r.seconds:.1f} s, at {r.at - start:.1f} s")
        except BaseException:
            stop.set()
            raise
        finally:
            dl.shutdown(wait=True, cancel_futures=True)
    return built
