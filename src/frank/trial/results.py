"""The results file (``trials/NAME.results.jsonl``): one JSON line per engine start.

Why JSON lines, appended by rewrite-and-rename: a start is recorded the moment it ends,
so a crash of frank itself loses at most the start in flight and ``run`` resumes from the
file; nothing on disk is ever half a line. The record type is read by run, decide, images
and the job logs; importing starts measured elsewhere is frank.trial.record.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from frank.model.kinds.base import Strict
from frank.store.jsonl import append_models, read_models

IMAGE_DIGEST = r"^sha256:[0-9a-f]{64}$"


class StartRecord(Strict):
    """One engine start as it happened."""

    start: int
    block: int
    arm: Literal["A", "B"]
    digest: str  # the lock digest that was served
    image: str | None = Field(default=None, pattern=IMAGE_DIGEST)  # its manifest digest
    trial: str  # the trial digest (seal hash) it was run under
    status: Literal["ok", "crash"]
    value: float | None = None
    error: str | None = None
    stack: str | None = None
    started: str | None = None
    ready: str | None = None
    finished: str | None = None
    metrics: dict[str, float] = {}
    source: str = "run"
    # the warm cache the image's start used (its artifact digest), or "none: why" (issue 55)
    warm_cache: str | None = None


def read_results(path: Path) -> list[StartRecord]:
    """Every recorded start, in file order; a bad line is an error naming the line."""
    return read_models(path, StartRecord)


def append(path: Path, records: list[StartRecord]) -> None:
    """Append records atomically (the old content plus the new lines, renamed into place)."""
    append_models(path, records)
