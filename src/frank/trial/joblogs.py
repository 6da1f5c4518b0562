"""Results of a trial's Kubernetes Jobs, read back from their logs.

Each Job's workload container prints one ``frank-trial-result <JSON>`` line (see
``frank/trial/driver.py``); collect them with ``kubectl logs job/NAME -c workload >
DIR/NAME.log``. Here each line is checked against the sealed plan (the trial, its seal, the
start's arm and block, the arm's lock digest, one image per arm, the starts run one at a
time in the sealed order, the engine not restarted) and the sealed metric is evaluated
from the raw samples and the workload's output by the same code ``frank trial run`` uses.
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from frank.errors import FrankError
from frank.model.kinds.base import Strict
from frank.model.tomlio import validation_to_error
from frank.trial.images import check_same_image
from frank.trial.metric import MetricError, deltas, parse, parse_prometheus, workload_json
from frank.trial.model import Trial
from frank.trial.results import IMAGE_DIGEST, StartRecord

MARK = "frank-trial-result "
RESTART_SERIES = "process_start_time_seconds"


class JobResult(Strict):
    """One ``frank-trial-result`` line as the driver prints it."""

    name: str
    digest: str  # the trial digest (seal) the Job was rendered under
    start: str
    block: str
    arm: str
    stack: str
    lock_digest: str
    image: str
    started: str
    ready: str | None = None
    finished: str
    status: Literal["ok", "crash"]
    error: str | None = None
    rc: int | None = None
    stdout: str = ""
    metrics_before: str = ""
    metrics_after: str = ""


def _results(src: Path) -> list[tuple[Path, JobResult]]:
    files = sorted(p for p in src.glob("*.log") if p.is_file()) if src.is_dir() else [src]
    if not files:
        raise FrankError("no .log files here (collect each Job's output with `kubectl logs "
                         "job/NAME -c workload > DIR/NAME.log`)", file=src)
    out = []
    for path in files:
        if not path.is_file():
            raise FrankError("results file not found", file=path)
        found = 0
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace")
                                 .splitlines(), start=1):
            at = line.find(MARK)  # kubectl logs --timestamps puts a time before it
            if at < 0:
                continue
            found += 1
            try:
                raw = json.loads(line[at + len(MARK):])
                out.append((path, JobResult.model_validate(raw)))
            except json.JSONDecodeError as exc:
                raise FrankError(f"not valid JSON: {exc.msg}", file=path,
                                 field=f"line {n}") from None
            except ValidationError as exc:
                err = validation_to_error(exc, path)
                err.field = f"line {n}.{err.field}" if err.field else f"line {n}"
                raise err from None
        if not found:
            raise FrankError(f"no {MARK.strip()} line: not the workload container's log of a "
                             "finished trial Job (kubectl logs job/NAME -c workload)", file=path)
    return out


def job_rows(trial: Trial, digest: str, src: Path, existing: list[StartRecord]
             ) -> list[dict[str, Any]]:
    """The rows ``record.import_rows`` checks and imports, one per Job result."""
    expr = parse(trial.metric.expr)
    rows: list[dict[str, Any]] = []
    seen: dict[int, Path] = {}
    taken = list(existing)
    for path, res in _results(src):
        where = f"start {res.start}"
        if res.name != trial.name:
            raise FrankError(f"{where} is from trial {res.name!r}, not {trial.name!r}",
                             file=path, field="name")
        if res.digest != digest:
            raise FrankError(f"{where} ran under seal {res.digest}, the trial is sealed as "
                             f"{digest}: render the Jobs again from the sealed plan",
                             file=path, field="digest")
        if not res.start.isdigit():
            raise FrankError(f"{res.start!r} is not a start number", file=path, field="start")
        start = int(res.start)
        if start in seen:
            raise FrankError(f"start {start} is also in {seen[start].name}", file=path,
                             field="start")
        seen[start] = path
        sealed = next((s for s in trial.order if s.start == start), None)
        if sealed is None:
            raise FrankError(f"extra start: the sealed order has starts 1-{len(trial.order)}",
                             file=path, field="start")
        if (res.arm, res.block) != (sealed.arm, str(sealed.block)):
            raise FrankError(f"{where} is arm {sealed.arm} in block {sealed.block} in the "
                             f"sealed order, the Job says arm {res.arm} in block {res.block}",
                             file=path, field="arm")
        expected = getattr(trial.arms, sealed.arm).digest
        if res.lock_digest != expected:
            raise FrankError(f"results for a stack whose lock changed since sealing: arm "
                             f"{sealed.arm} was sealed as {expected}, {where} served "
                             f"{res.lock_digest}", file=path, field="lock_digest")
        if res.status != "ok":
            raise FrankError(f"{where} crashed in its Job: {res.error}; delete the Job, apply "
                             "it again and collect its log", file=path, field="status")
        before, after = parse_prometheus(res.metrics_before), parse_prometheus(res.metrics_after)
        if before.get(RESTART_SERIES) != after.get(RESTART_SERIES):
            raise FrankError(f"{where}: the engine restarted during the workload "
                             f"({RESTART_SERIES} {before.get(RESTART_SERIES)} -> "
                             f"{after.get(RESTART_SERIES)}): run that Job again", file=path,
                             field="metrics_after")
        found = deltas(before, after, expr.series)
        try:
            value = expr.value(found, workload_json(res.stdout))
        except MetricError as exc:
            raise FrankError(f"{where}: {exc}", file=path, field="value") from None
        if not re.fullmatch(IMAGE_DIGEST, res.image):
            raise FrankError(f"{res.image!r} is not an image digest", file=path, field="image")
        check_same_image(res.arm, res.image, taken, path)
        row = {"start": start, "block": res.block, "arm": res.arm,
               "digest": res.lock_digest, "image": res.image, "value": value,
               "started": res.started, "ready": res.ready, "finished": res.finished,
               "metrics": found, "stack": res.stack}
        rows.append(row)
        taken.append(StartRecord(start=start, block=int(res.block) if res.block.isdigit()
                                 else 0, arm="A" if res.arm == "A" else "B",
                                 digest=res.lock_digest, trial=digest, status="ok",
                                 image=res.image))
    rows.sort(key=lambda r: int(r["start"]))
    for prev, cur in itertools.pairwise(rows):
        if cur["started"] < prev["finished"]:
            raise FrankError(f"start {cur['start']} began ({cur['started']}) before start "
                             f"{prev['start']} finished ({prev['finished']}): the Jobs must "
                             "run one at a time in the sealed order", file=seen[cur["start"]],
                             field="started")
    return rows
