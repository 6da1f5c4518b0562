"""Each arm's image for ``frank trial run``: found from its stack, checked against the plan.

Why images, not the host's venv: the host's packages are not in any lock, so two host starts
of "the same" arm can run different code. An arm's image (``out/<stack>/image``) carries the
lock it was built from; it must be the lock the sealed plan names, every blob is re-hashed
before it runs, and its manifest digest is recorded per start. An A/B then compares exactly
two images: a start whose arm image differs from the one the arm's measured starts ran is
refused, as is a decision over such starts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frank.errors import FrankError
from frank.image.verify import VerifiedImage, image_lock, verify_layout
from frank.run import container as image_run
from frank.trial.model import Trial
from frank.trial.results import StartRecord

NO_IMAGE = "no image (the host launcher, or imported)"


@dataclass(frozen=True)
class ArmImage:
    """One arm's verified image, the lock it carries and how its weights are mounted."""

    arm: str
    layout: Path
    image: VerifiedImage
    lock: dict[str, Any]
    weights: image_run.Weights

    @property
    def digest(self) -> str:
        return self.image.digest


def layout_of(root: Path, lock: dict[str, Any]) -> Path:
    """Where compose puts a stack's image: ``out/<stack>/image``."""
    return root / "out" / str(lock["stack"]) / "image"


def arm_image(trial: Trial, arm: str, lock: dict[str, Any], root: Path, *,
              hub_cache: Path | None = None) -> ArmImage:
    """The arm's image, every blob re-hashed, built from the lock the plan seals."""
    spec = getattr(trial.arms, arm)
    layout = layout_of(root, lock)
    compose = f"run `frank compose {spec.stack}`"
    if not (layout / "oci-layout").is_file():
        raise FrankError(f"arm {arm}: no image built for stack {lock['stack']} ({compose})",
                         file=layout)
    try:
        image = verify_layout(layout)
        carried = image_lock(image)
    except FrankError as exc:
        raise FrankError(f"arm {arm}: {exc.message}", file=exc.file, field=exc.field) from None
    for what, found in (("was built from", image.lock_digest),
                        ("carries", carried.get("digest"))):
        if found != spec.digest:
            raise FrankError(f"arm {arm}: the image {what} lock {found}, the trial sealed "
                             f"{spec.digest} for {spec.stack} ({compose})", file=layout)
    from frank.audit.auditor import ensure_audited
    from frank.resolve.lock import Lock

    # against the lock the trial sealed from the repo, never the image's own (issue 53)
    ensure_audited(layout, Lock.model_validate(lock), root, what=f"run arm {arm}")
    weights = image_run.weights(carried, hub_cache=hub_cache, model_dir=None,
                                env=dict(os.environ))
    try:
        image_run.check_weights(carried, weights, files=True)
    except FrankError as exc:
        raise FrankError(f"arm {arm}: {exc.message}", file=exc.file, field=exc.field) from None
    return ArmImage(arm, layout, image, carried, weights)


def ran(record: StartRecord) -> str:
    """What a start ran, in words: its image digest, or that it had none."""
    return record.image or NO_IMAGE


def check_same_image(arm: str, now: str | None, records: list[StartRecord],
                     results: Path) -> None:
    """Refuse a start of ``arm`` running ``now`` when the arm's measured starts ran another."""
    want = now or NO_IMAGE
    other = [r for r in records if r.arm == arm and r.status == "ok" and ran(r) != want]
    if other:
        starts = ", ".join(str(r.start) for r in other)
        raise FrankError(f"arm {arm}: start(s) {starts} ran {ran(other[0])}, this start would "
                         f"run {want}: the arm's image changed between starts (an A/B "
                         "compares exactly two images: put that image back, or plan the "
                         "trial again under a new name)", file=results, field="image")


def measured_images(records: list[StartRecord], results: Path) -> dict[str, str | None]:
    """The one image each arm's measured starts ran (None: none recorded); two is refused."""
    out: dict[str, str | None] = {}
    for arm in ("A", "B"):
        mine = [r for r in records if r.arm == arm and r.status == "ok"]
        seen = {ran(r): r for r in mine}
        if len(seen) > 1:
            shown = "; ".join(f"start {r.start} ran {what}" for what, r in seen.items())
            raise FrankError(f"arm {arm}'s starts ran different images ({shown}): an A/B "
                             "compares exactly two images", file=results, field="image")
        out[arm] = mine[0].image if mine else None
    return out
