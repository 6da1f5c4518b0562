"""Run roots of engine storages (``build.engines._runroot``) and when gc takes them."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from frank.assemble.engines import reap_runroots


def _runroot(top: Path, storage: Path, *extra: str, age_s: float = 0) -> Path:
    tag = hashlib.sha256(str(storage).encode()).hexdigest()[:12]
    runroot = top / f"frank-run-{tag}"
    runroot.mkdir()
    mark = runroot / "frank-storage"
    mark.write_text(str(storage))
    for name in extra:
        (runroot / name).mkdir()
    then = time.time() - age_s
    os.utime(mark, (then, then))
    return runroot


def test_a_storage_never_made_is_left_quietly_and_a_deleted_one_is_reaped(
        tmp_path: Path) -> None:
    """An engine's argv worked out but never used marks a run root for a storage that does
    not exist: it is not reported (the next command would mark it again, and every run said
    "removed ... an engine storage that is gone"). A run root an engine used (its locks)
    whose storage was deleted goes; one whose storage is there stays."""
    top = tmp_path / "tmp"
    top.mkdir()
    never = _runroot(top, tmp_path / "cache" / "containers" / "podman-overlay")
    deleted = _runroot(top, tmp_path / "gone" / "containers" / "buildah-overlay",
                       "overlay-locks", "frank-runs")
    live_root = tmp_path / "live" / "containers" / "buildah-overlay"
    (live_root / "overlay-layers").mkdir(parents=True)
    live = _runroot(top, live_root, "overlay-locks", age_s=3600)
    assert reap_runroots(top) == [deleted]
    assert never.is_dir() and live.is_dir() and not deleted.exists()
