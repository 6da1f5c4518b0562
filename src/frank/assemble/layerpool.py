"""Layers of wheels streamed into their blobs by worker processes, the largest ready first.

Why processes: a streamed layer spends about a third of its CPU in Python holding the GIL
(installer planning every member, tarfile headers, the member reader), and the rest in C
calls that let go of it for a millisecond at a time (inflate, sha256, write). Two threads on
two cores then ran no faster than one: each C call's return waits for the GIL the other
thread holds (bench/results/profile-build-2026-12-03.md: 7 layers, 23.3 s in one thread,
22.1 s in two, 14.1 s in two processes). Each layer is independent and a worker writes its
blob through the store's temp + rename, so nothing is shared but the result it sends back.

Why the largest first: the pool used to take layers in the order their wheels arrived, so
on a cold build the 1.9 GB flashinfer-cubin layer waited behind thirty small ones and ran
alone at the end. Here a free worker takes the largest layer whose wheels are all in.

What comes back is (digest, size) of a blob the worker hashed as it wrote it, through a pipe
from a process this one started: nothing read back from the store, so the output layout may
link it without hashing it again (``oci.write_layout``'s ``fresh``), as it did for a thread.

A ``tap`` (a picklable factory, e.g. the audit's tar reader) is fed every byte the worker
writes into the blob, in the same pass, and what its ``close`` returns comes back with the
digest: the audit of a layer just made then needs no second read of its bytes from disk
(served: 9.7 GB). The builder knows nothing of what the tap is; the caller passes it in.
"""

from __future__ import annotations

import functools
import heapq
import multiprocessing
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

# set in each worker by ``_init``: the build's stop flag (a multiprocessing Event)
_STOP: Any = None


class Tap(Protocol):
    """Sees a layer's bytes as they are written: ``feed`` each piece, ``close`` at the end
    (its result is returned with the layer's digest)."""

    def feed(self, chunk: bytes) -> None: ...

    def close(self) -> Any: ...


class _Tee:
    """The blob writer with a tap beside it: each piece written goes to both."""

    def __init__(self, out: Any, tap: Tap):
        self._out, self._tap = out, tap

    def write(self, data: bytes) -> int:
        self._out.write(data)
        self._tap.feed(data)
        return len(data)


@dataclass(frozen=True)
class Job:
    """One layer to stream: its wheels (file name, verified store path), where they install,
    the epoch and the index key its tar names in its first member."""

    tag: Any  # the caller's handle for the layer, returned with its result
    wheels: tuple[tuple[str, Path], ...]
    site: str
    epoch: int
    key: str
    size: int  # bytes of wheels: the larger, the sooner


@dataclass(frozen=True)
class Done:
    """A job's outcome: the blob made (``digest``, ``size``), or why it was not streamed."""

    tag: Any
    digest: str = ""
    size: int = 0
    refused: str = ""
    seconds: float = 0.0  # the worker's time on it
    at: float = 0.0  # time.monotonic() when it came back
    tapped: Any = None  # what the tap's ``close`` gave, if there was a tap


def _init(stop: Any) -> None:
    global _STOP
    _STOP = stop


def _stream(wheels: tuple[tuple[str, Path], ...], site: str, epoch: int, key: str,
            root: Path, tap: Callable[[], Tap] | None = None
            ) -> tuple[str, int, str, float, Any]:
    """In a worker: stream one layer into a new blob of the store at ``root``; (digest,
    size, "", seconds, tapped), or ("", 0, why, seconds, None) when it cannot be streamed
    (the caller stages it, which makes the same bytes or fails in its own words)."""
    from frank.assemble.wheeltar import plan_wheels, write_wheel_tar
    from frank.store.blobs import BlobStore

    began = time.monotonic()
    try:
        members = plan_wheels(list(wheels), site)
        seen = tap() if tap is not None else None
        with BlobStore(root).writer(around_cache=True) as w:
            out = w if seen is None else _Tee(w, seen)
            write_wheel_tar(members, epoch, out, _STOP, key=key)  # type: ignore[arg-type]
        tapped = seen.close() if seen is not None else None
    except Exception as exc:  # StreamRefused, or installer refusing a wheel
        return "", 0, str(exc) or type(exc).__name__, time.monotonic() - began, None
    return w.digest, w.size, "", time.monotonic() - began, tapped


class LayerPool:
    """``workers`` processes taking ``Job``s largest first; ``results`` yields each
    ``Done`` in the calling thread. Use as a context manager."""

    def __init__(self, workers: int, root: Path, tap: Callable[[], Tap] | None = None):
        self.workers = max(1, workers)
        self.root = root
        self.tap = tap
        self._ready: list[tuple[int, int, Job]] = []
        self._running = self._added = self._finished = 0
        self._done: list[Done] = []
        self._error: BaseException | None = None
        self._cond = threading.Condition()
        ctx = multiprocessing.get_context("spawn")  # never fork a process that has threads
        self.stop = ctx.Event()
        self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=ctx,
                                         initializer=_init, initargs=(self.stop,))

    def __enter__(self) -> LayerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:
            self.stop.set()  # a running layer ends at its next member
        with self._cond:
            self._ready.clear()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def add(self, job: Job) -> None:
        """Queue ``job``: it starts once a worker is free and no larger job waits."""
        with self._cond:
            self._added += 1
            heapq.heappush(self._ready, (-job.size, self._added, job))
            self._dispatch()

    def _dispatch(self) -> None:  # self._cond held
        while self._ready and self._running < self.workers and not self.stop.is_set():
            _, _, job = heapq.heappop(self._ready)
            self._running += 1
            fut = self._pool.submit(_stream, job.wheels, job.site, job.epoch, job.key,
                                    self.root, self.tap)
            fut.add_done_callback(functools.partial(self._finish, job))

    def _finish(self, job: Job, fut: Future[tuple[str, int, str, float, Any]]) -> None:
        with self._cond:
            self._running -= 1
            self._finished += 1
            if not fut.cancelled():
                exc = fut.exception()
                if exc is not None:
                    self._error = self._error or exc
                else:
                    digest, size, refused, seconds, tapped = fut.result()
                    self._done.append(Done(job.tag, digest, size, refused, seconds,
                                           time.monotonic(), tapped))
            self._dispatch()
            self._cond.notify_all()

    def results(self) -> Iterator[Done]:
        """Each ``Done`` as it comes, until every job added so far is done (call it once
        no job will be added). A worker that died raises here."""
        while True:
            with self._cond:
                while not self._done and self._error is None \
                        and self._finished < self._added:
                    self._cond.wait()
                if self._error is not None:
                    raise self._error
                if not self._done:
                    return
                batch, self._done = self._done, []
            yield from batch
