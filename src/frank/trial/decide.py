"""Deciding a trial: exactly what the sealed rule says, on results that match the plan.

Why refuse rather than decide on what is there: a rule written for 5 blocks says nothing
about 4, a start that served another lock measured another variant, and a start run twice
lets the better run be picked. So results must be exactly the sealed starts, each once,
each with its metric, each from the sealed lock digest, in the sealed order, and all starts
of one arm from one image.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import fmean
from typing import Any

from frank.errors import FrankError
from frank.trial.design import Outcome, permutation_test, rank_test, sign_test
from frank.trial.images import NO_IMAGE, measured_images
from frank.trial.model import Trial, results_path
from frank.trial.results import StartRecord, read_results
from frank.trial.seal import load_sealed


@dataclass(frozen=True)
class Row:
    """One line of the published table: a block (or, for balanced, one start)."""

    label: str
    a: float | None
    b: float | None
    diff: float | None  # B - A
    rel: float | None  # (B - A) / A


@dataclass(frozen=True)
class Decision:
    """The decision and everything the published table shows."""

    trial: str
    digest: str
    design: str
    rule: str
    metric: str
    direction: str
    alpha: float
    rows: list[Row]
    mean: Row
    outcome: Outcome
    crashed_starts: int
    ranges: tuple[tuple[float, float], tuple[float, float]]  # (min, max) of A, then of B
    images: dict[str, str | None] = field(default_factory=dict)  # arm -> image its starts ran
    # (start, arm, metric) of every start in the sealed order: what the chart draws
    starts: list[tuple[int, str, float]] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        """What the rule says."""
        return "adopt" if self.outcome.passed else "do not adopt"

    def summary(self) -> str:
        """The one-line result for a manifest's evidence."""
        rel = f" ({self.mean.rel * 100:+.2f}%)" if self.mean.rel is not None else ""
        (a_lo, a_hi), (b_lo, b_hi) = self.ranges
        return (f"{self.metric}: mean A {self.mean.a:.6g} -> B {self.mean.b:.6g}{rel}, "
                f"range {a_lo:.6g}-{a_hi:.6g} -> {b_lo:.6g}-{b_hi:.6g}; "
                f"{self.outcome.statistic}; p = {self.outcome.p_exact} "
                f"({self.outcome.p_value:.4g}); {self.verdict}")

    def to_json(self) -> dict[str, Any]:
        """Everything, for CI and for people who publish elsewhere."""
        return {"trial": self.trial, "digest": self.digest, "design": self.design,
                "rule": self.rule, "metric": self.metric, "direction": self.direction,
                "alpha": self.alpha, "rows": [asdict(r) for r in self.rows],
                "mean": asdict(self.mean), "p_value": self.outcome.p_value,
                "p_exact": self.outcome.p_exact, "statistic": self.outcome.statistic,
                "passed": self.outcome.passed, "verdict": self.verdict,
                "crashed_starts": self.crashed_starts, "ranges": {"A": list(self.ranges[0]),
                                                                  "B": list(self.ranges[1])},
                "images": self.images, "summary": self.summary()}


def match_results(trial: Trial, digest: str, records: list[StartRecord], path: Path
                  ) -> dict[int, StartRecord]:
    """start -> its one valid record; anything that does not fit the sealed plan is refused."""
    order = {s.start: s for s in trial.order}
    ok: dict[int, StartRecord] = {}
    crashed: dict[int, StartRecord] = {}
    for r in records:
        where = f"start {r.start}"
        if r.trial != digest:
            raise FrankError(f"{where} was recorded under trial digest {r.trial}, but the "
                             f"trial is sealed as {digest} (was it edited and re-sealed?)",
                             file=path, field="trial")
        sealed = order.get(r.start)
        if sealed is None:
            raise FrankError(f"extra start: {where} is not in the sealed order of "
                             f"{len(order)} starts", file=path, field="start")
        if (r.arm, r.block) != (sealed.arm, sealed.block):
            raise FrankError(f"{where} is block {r.block} arm {r.arm}; the sealed order says "
                             f"block {sealed.block} arm {sealed.arm}", file=path, field="arm")
        expected = getattr(trial.arms, r.arm).digest
        if r.digest != expected:
            raise FrankError(f"wrong lock digest: {where} (arm {r.arm}) served {r.digest}, "
                             f"the trial sealed {expected}", file=path, field="digest")
        if r.status == "crash":
            crashed[r.start] = r
            continue
        if r.start in ok:
            raise FrankError(f"extra start: {where} has more than one result", file=path,
                             field="start")
        if r.value is None:
            raise FrankError(f"metric missing from {where} (block {r.block}, arm {r.arm}): "
                             f"{r.error or trial.metric.label}", file=path, field="value")
        ok[r.start] = r
    missing = [s for s in trial.order if s.start not in ok]
    if missing:
        first = missing[0]
        if first.start in crashed:
            raise FrankError(f"start {first.start} (block {first.block}, arm {first.arm}) "
                             f"crashed: {crashed[first.start].error}; run `frank trial run` "
                             "to resume", file=path, field="status")
        blocks = sorted({s.block for s in missing})
        raise FrankError(f"missing block(s) {', '.join(map(str, blocks))}: no result for "
                         f"start(s) {', '.join(str(s.start) for s in missing)}",
                         file=path, field="start")
    previous = ""
    for s in trial.order:
        started = ok[s.start].started
        if started is None:
            continue
        if started < previous:
            raise FrankError(f"start {s.start} ran before start {s.start - 1}: the sealed "
                             "order was not followed", file=path, field="started")
        previous = started
    return ok


def _rel(a: float, b: float) -> float | None:
    return (b - a) / a if a != 0 else None


def decide(trial: Trial, digest: str, records: list[StartRecord], path: Path) -> Decision:
    """Apply the sealed rule to matched results."""
    ok = match_results(trial, digest, records, path)
    d = trial.design
    direction = trial.metric.direction
    value = {n: r.value for n, r in ok.items() if r.value is not None}  # all, by matching
    rows: list[Row] = []
    if d.kind == "balanced":
        a_f = [value[s.start] for s in trial.order if s.arm == "A"]
        b_f = [value[s.start] for s in trial.order if s.arm == "B"]
        for s in trial.order:
            v = value[s.start]
            rows.append(Row(f"start {s.start}", v if s.arm == "A" else None,
                            v if s.arm == "B" else None, None, None))
        outcome = rank_test(a_f, b_f, direction, d.alpha)
        ma, mb = fmean(a_f), fmean(b_f)
        mean = Row("mean", ma, mb, mb - ma, _rel(ma, mb))
    else:
        pairs: list[tuple[float, float]] = []
        for block in range(1, d.blocks + 1):
            by_arm = {s.arm: value[s.start] for s in trial.order if s.block == block}
            a, b = by_arm["A"], by_arm["B"]
            pairs.append((a, b))
            rows.append(Row(f"block {block}", a, b, b - a, _rel(a, b)))
        test = sign_test if d.kind == "blocks" else permutation_test
        outcome = test(pairs, direction, d.alpha)
        rels = [r.rel for r in rows if r.rel is not None]
        mean = Row("mean", fmean(a for a, _ in pairs), fmean(b for _, b in pairs),
                   fmean(b - a for a, b in pairs), fmean(rels) if rels else None)
    crashes = sum(1 for r in records if r.status == "crash")
    arm_values = {arm: [value[s.start] for s in trial.order if s.arm == arm]
                  for arm in ("A", "B")}
    ranges = ((min(arm_values["A"]), max(arm_values["A"])),
              (min(arm_values["B"]), max(arm_values["B"])))
    design = {"blocks": f"randomized blocks, {d.blocks} blocks, one start per arm per block",
              "balanced": f"{d.starts_per_arm} + {d.starts_per_arm} starts in a balanced order",
              "permutation": f"within-block permutation test, {d.blocks} blocks"}[d.kind]
    return Decision(trial.name, digest, design, d.rule, trial.metric.label, direction,
                    d.alpha, rows, mean, outcome, crashes, ranges,
                    measured_images(list(ok.values()), path),
                    [(s.start, s.arm, value[s.start]) for s in trial.order])


def decide_file(trial_file: Path) -> Decision:
    """Load the sealed trial and its results file, and decide."""
    trial, digest = load_sealed(trial_file)
    results = results_path(trial_file)
    if not results.is_file():
        raise FrankError(f"no results yet: run `frank trial run {trial_file.stem} --workload "
                         "CMD` (or `frank trial record` for starts measured elsewhere) first",
                         file=results)
    return decide(trial, digest, read_results(results), results)


def render(decision: Decision) -> None:
    """The table our users publish, then the p-value and the verdict (to stdout)."""
    from rich.console import Console
    from rich.table import Table

    def fmt(v: float | None, pct: bool = False) -> str:
        if v is None:
            return ""
        return f"{v * 100:+.2f}%" if pct else f"{v:.6g}"

    table = Table(title=f"trial {decision.trial} ({decision.design})")
    table.add_column("")
    table.add_column("A (current)", justify="right")
    table.add_column("B (candidate)", justify="right")
    table.add_column("B - A", justify="right")
    table.add_column("(B - A) / A", justify="right")
    for r in decision.rows:
        table.add_row(r.label, fmt(r.a), fmt(r.b), fmt(r.diff), fmt(r.rel, pct=True))
    m = decision.mean
    table.add_row("mean", fmt(m.a), fmt(m.b), fmt(m.diff), fmt(m.rel, pct=True),
                  style="bold")
    console = Console()
    console.print(table)
    o = decision.outcome
    console.print(f"metric: {decision.metric} ({decision.direction} is better)", highlight=False)
    (a_lo, a_hi), (b_lo, b_hi) = decision.ranges
    console.print(f"range: A {a_lo:.6g}-{a_hi:.6g}, B {b_lo:.6g}-{b_hi:.6g}", highlight=False)
    for arm in ("A", "B"):
        console.print(f"image {arm}: {decision.images.get(arm) or NO_IMAGE}", highlight=False)
    console.print(f"rule: {decision.rule}", highlight=False)
    console.print(f"{o.statistic}; p = {o.p_exact} = {o.p_value:.6g} (alpha {decision.alpha:g})",
                  highlight=False)
    if decision.crashed_starts:
        console.print(f"{decision.crashed_starts} crashed start(s) were re-run", highlight=False)
    console.print(f"verdict: {decision.verdict}", style="bold", highlight=False)
    console.print(f"trial digest: {decision.digest}", highlight=False)
