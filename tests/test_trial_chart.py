"""`frank trial decide` draws its decision beside its table: trials/NAME.decision.svg holds
each start's metric by arm in the sealed start order and the rule's verdict (issue 56)."""

from __future__ import annotations

import csv
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.test_trial_commands import load, plan, rows_for, run_frank, smoke

SVG = "{http://www.w3.org/2000/svg}"
A_VALUES = [6.64, 6.93, 6.70, 6.81, 6.77]
B_VALUES = [1.16, 1.23, 1.19, 1.20, 1.18]

__all__ = ["smoke"]  # the fixture, shared with the trial command tests


def _record(repo: Path, name: str, values: dict[str, list[float]]) -> None:
    rows = rows_for(repo, name, values)
    src = repo / f"{name}.csv"
    with src.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    assert run_frank("trial", "record", name, str(src), cwd=repo).code == 0


def _dots(svg: ET.Element) -> dict[int, list[tuple[int, float]]]:
    """serie index -> (start, value) of each dot drawn in the plot (the first group of a
    serie that has dots; pygal repeats a serie's group for its lines and tooltips)."""
    out: dict[int, list[tuple[int, float]]] = {}
    for g in svg.iter(f"{SVG}g"):
        m = re.search(r"\bserie-(\d+)\b", g.get("class", ""))
        if not m or int(m.group(1)) in out:
            continue
        dots = []
        for dot in g.iter(f"{SVG}g"):
            if dot.get("class") == "dots":
                desc = {d.get("class"): d.text for d in dot.iter(f"{SVG}desc")}
                dots.append((int(desc["x_label"] or ""), float(desc["value"] or "")))
        if dots:
            out[int(m.group(1))] = dots
    return out


def test_decide_writes_the_starts_by_arm_and_the_verdict(smoke: Path) -> None:
    assert plan(smoke, "rc", "--blocks", "5").code == 0
    _record(smoke, "rc", {"A": A_VALUES, "B": B_VALUES})
    out = run_frank("trial", "decide", "rc", cwd=smoke)
    assert out.code == 0, out.err
    chart = smoke / "trials/rc.decision.svg"
    assert f"chart: {chart}" in out.out
    text = chart.read_text()
    svg = ET.fromstring(text)
    title = " ".join(t.text or "" for t in svg.iter(f"{SVG}text") if "title" in
                     (t.get("class") or ""))
    assert "trial rc: adopt" in title and "p = 1/32" in title
    words = " ".join(t.text or "" for t in svg.iter(f"{SVG}text"))
    for label in ("A (current)", "B (candidate)", "start, in the sealed order"):
        assert label in words, (label, words)
    order = load(smoke / "trials/rc.toml")["order"]
    axis = next(g for g in svg.iter(f"{SVG}g") if g.get("class") == "axis x")
    assert [t.text for t in axis.iter(f"{SVG}text")] == [str(s["start"]) for s in order]
    # each arm's dots: exactly its starts, in the sealed order, at their recorded values
    values = {"A": iter(A_VALUES), "B": iter(B_VALUES)}
    expect = {"A": [], "B": []}  # type: dict[str, list[tuple[int, float]]]
    for s in order:
        expect[s["arm"]].append((s["start"], next(values[s["arm"]])))
    dots = _dots(svg)
    assert dots[0] == expect["A"] and dots[1] == expect["B"]
    assert len(expect["A"]) == len(expect["B"]) == 5
    assert "<script" not in text and "http://kozea" not in text  # fetches nothing
    # the same decision gives the same bytes (no random chart id)
    assert run_frank("trial", "decide", "rc", "--json", cwd=smoke).code == 0
    assert chart.read_text() == text
    d = json.loads(run_frank("trial", "decide", "rc", "--json", cwd=smoke).out)
    assert d["chart"] == str(chart)


def test_a_worse_candidate_is_drawn_as_do_not_adopt(smoke: Path) -> None:
    assert plan(smoke, "worse", "--blocks", "5").code == 0
    _record(smoke, "worse", {"A": B_VALUES, "B": A_VALUES})
    assert run_frank("trial", "decide", "worse", cwd=smoke).code == 0
    svg = ET.fromstring((smoke / "trials/worse.decision.svg").read_text())
    title = [t.text or "" for t in svg.iter(f"{SVG}text") if "title" in (t.get("class") or "")]
    assert any("trial worse: do not adopt" in t for t in title), title


@pytest.mark.parametrize("name", ["missing"])
def test_no_chart_without_a_decision(smoke: Path, name: str) -> None:
    assert plan(smoke, name, "--blocks", "5").code == 0
    assert run_frank("trial", "decide", name, cwd=smoke).code == 2
    assert not (smoke / f"trials/{name}.decision.svg").exists()
