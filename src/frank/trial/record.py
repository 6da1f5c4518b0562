"""``frank trial record``: starts measured elsewhere (CSV, JSON or a Job's logs) imported into
the results file (frank.trial.results), checked against the sealed plan first."""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path
from typing import Any

from frank.errors import NESTED_TOO_DEEP, FrankError
from frank.trial.model import Trial, results_path
from frank.trial.results import IMAGE_DIGEST, StartRecord, append, read_results


def _rows(src: Path) -> list[dict[str, Any]]:
    if not src.is_file():
        raise FrankError("results file not found", file=src)
    text = src.read_text(encoding="utf-8")
    if src.suffix == ".csv":
        return [dict(r) for r in csv.DictReader(text.splitlines())]
    if src.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise FrankError(f"not valid JSON: {exc.msg}", file=src) from None
        except RecursionError:
            raise FrankError(NESTED_TOO_DEEP, file=src) from None
        if isinstance(data, dict):
            data = data.get("starts")
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise FrankError("expected a list of starts (or {\"starts\": [...]})", file=src)
        return data
    raise FrankError("results must be a .csv or .json file", file=src)


def _number(value: Any, src: Path, field: str, *, integer: bool = False) -> float | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise FrankError(f"{value!r} is not a number", file=src, field=field) from None
    if not math.isfinite(number) or (integer and number != int(number)):
        raise FrankError(f"{value!r} is not a valid value", file=src, field=field)
    return number


def import_rows(trial: Trial, digest: str, src: Path, existing: list[StartRecord],
                rows: list[dict[str, Any]] | None = None) -> list[StartRecord]:
    """Rows of a CSV/JSON file as start records, each checked against the sealed plan.

    Required per row: ``start``, ``arm``, ``digest`` (the lock digest that was served) and
    ``value``; ``block``, ``image`` (the image's manifest digest), ``started``, ``finished``
    are checked or kept when present.
    """
    order = {s.start: s for s in trial.order}
    done = {r.start for r in existing if r.status == "ok"}
    out: list[StartRecord] = []
    for i, row in enumerate(_rows(src) if rows is None else rows):
        where = f"starts[{i}]"
        start_no = _number(row.get("start"), src, f"{where}.start", integer=True)
        if start_no is None:
            raise FrankError("required field is missing", file=src, field=f"{where}.start")
        start = int(start_no)
        sealed = order.get(start)
        if sealed is None:
            raise FrankError(f"extra start: the sealed order has starts 1-{len(order)}",
                             file=src, field=f"{where}.start")
        arm = str(row.get("arm") or "")
        if arm != sealed.arm:
            raise FrankError(f"start {start} is arm {sealed.arm} in the sealed order, "
                             f"not {arm or 'missing'!r}", file=src, field=f"{where}.arm")
        block = _number(row.get("block"), src, f"{where}.block", integer=True)
        if block is not None and int(block) != sealed.block:
            raise FrankError(f"start {start} is in block {sealed.block} in the sealed order",
                             file=src, field=f"{where}.block")
        served = str(row.get("digest") or "")
        expected = getattr(trial.arms, arm).digest
        if served != expected:
            raise FrankError(f"results for a stack whose lock changed since sealing: arm {arm} "
                             f"was sealed as {expected}, this start served "
                             f"{served or 'no digest'}", file=src, field=f"{where}.digest")
        image = str(row.get("image") or "") or None
        if image is not None and not re.fullmatch(IMAGE_DIGEST, image):
            raise FrankError(f"{image!r} is not an image digest (sha256:<64 hex>)", file=src,
                             field=f"{where}.image")
        value = _number(row.get("value"), src, f"{where}.value")
        if value is None:
            raise FrankError(f"metric missing from start {start} ({trial.metric.label})",
                             file=src, field=f"{where}.value")
        if start in done:
            raise FrankError(f"extra start: start {start} already has a result",
                             file=src, field=f"{where}.start")
        done.add(start)
        out.append(StartRecord(
            start=start, block=sealed.block, arm=sealed.arm, digest=served, image=image,
            trial=digest,
            status="ok", value=value, started=row.get("started") or None,
            finished=row.get("finished") or None, source=f"record:{src.name}",
            ready=row.get("ready") or None,
            metrics=m if isinstance(m := row.get("metrics"), dict) else {},
            stack=st if isinstance(st := row.get("stack"), str) else None))
    return out


def record_file(trial_file: Path, trial: Trial, digest: str, src: Path) -> list[StartRecord]:
    """Import a results file for the sealed plan; nothing is written if any row is refused."""
    path = results_path(trial_file)
    if src.is_dir() or src.suffix == ".log":  # the output of `frank trial render`'s Jobs
        from frank.trial.joblogs import job_rows

        existing = read_results(path)
        new = import_rows(trial, digest, src, existing, job_rows(trial, digest, src, existing))
    else:
        new = import_rows(trial, digest, src, read_results(path))
    append(path, new)
    return new
