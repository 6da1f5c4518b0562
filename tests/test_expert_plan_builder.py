"""The expert-plan builder (builders/expert-plan/plan.py) on small traces: exact budget,
most-routed on the GPU, the stated tie rule, coverage, bad input."""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path
from types import ModuleType

import pytest

from tests.spine_helpers import REPO


def _builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "expert_plan_builder", REPO / "builders/expert-plan/plan.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


plan = _builder()


def trace(tmp: Path, name: str, counts: dict[str, object]) -> str:
    path = tmp / name
    path.write_text(json.dumps({"format": "frank-routing-counts/1", "counts": counts}))
    return str(path)


def run(tmp: Path, *args: str) -> tuple[int, dict[str, object] | None]:
    out = tmp / "plan.json"
    code = plan.main(["--out", str(out), *args])
    return code, json.loads(out.read_text()) if out.is_file() else None


def test_least_routed_go_to_the_cpu_exactly_the_budget(tmp_path: Path) -> None:
    rng = random.Random(7)
    counts = {str(layer): [rng.randrange(0, 1000) for _ in range(16)] for layer in range(4)}
    half = {k: v[:8] + [0] * 8 for k, v in counts.items()}
    rest = {k: {str(e): v[e] for e in range(8, 16)} for k, v in counts.items()}  # sparse form
    code, doc = run(tmp_path, "--layers", "4", "--experts", "16", "--cpu-experts", "20",
                    trace(tmp_path, "a.json", half), trace(tmp_path, "b.json", rest))
    assert code == 0 and doc is not None
    cpu = {(int(layer), e) for layer, es in doc["cpu_experts"].items() for e in es}
    assert len(cpu) == 20 == doc["cpu_total"]
    # every CPU expert routes no more tokens than any GPU expert
    gpu = {(layer, e) for layer in range(4) for e in range(16)} - cpu
    assert max(counts[str(layer)][e] for layer, e in cpu) <= \
        min(counts[str(layer)][e] for layer, e in gpu)
    total = sum(map(sum, counts.values()))
    on_gpu = sum(counts[str(layer)][e] for layer, e in gpu)
    assert doc["coverage"]["gpu_share"] == round(on_gpu / total, 6)
    assert [i["file"] for i in doc["inputs"]] == ["a.json", "b.json"]


def test_ties_leave_the_lower_index_on_the_gpu(tmp_path: Path) -> None:
    flat = trace(tmp_path, "t.json", {"0": [5, 5, 5], "1": [5, 5, 5]})
    _, doc = run(tmp_path, "--layers", "2", "--experts", "3", "--cpu-experts", "2", flat)
    assert doc is not None and doc["cpu_experts"] == {"0": [], "1": [1, 2]}
    _, doc = run(tmp_path, "--layers", "2", "--experts", "3", "--cpu-experts", "2",
                 "--split", "even", flat)
    assert doc is not None and doc["cpu_experts"] == {"0": [2], "1": [2]}


def test_budget_in_bytes(tmp_path: Path) -> None:
    t = trace(tmp_path, "t.json", {"0": [1, 2, 3, 4]})
    _, doc = run(tmp_path, "--layers", "1", "--experts", "4", "--cpu-bytes", "300",
                 "--expert-bytes", "100", t)
    assert doc is not None and doc["cpu_experts"] == {"0": [0, 1, 2]}
    (tmp_path / "plan.json").unlink()
    code, doc = run(tmp_path, "--layers", "1", "--experts", "4", "--cpu-bytes", "250",
                    "--expert-bytes", "100", t)
    assert code == 2 and doc is None


@pytest.mark.parametrize(("counts", "args", "said"), [
    ({"0": [1, 2], "2": [1, 1]}, (), "t.json: counts.2: layer 2 is not in the model"),
    ({"0": {"2": 1}}, (), "t.json: counts.0.2: expert 2 is not in the model"),
    ({"0": [1, 2, 3]}, (), "t.json: counts.0[2]: expert 2 is not in the model"),
    ({"0": [1, -2]}, (), "t.json: counts.0[1]: -2 is negative"),
    ({"0": [1, "2"]}, (), 't.json: counts.0[1]: "2" is not a whole number of tokens'),
    ({"0": [1, True]}, (), "t.json: counts.0[1]: true is not a whole number of tokens"),
    ({"0": [1, 2]}, ("--cpu-experts", "5"), "--cpu-experts: 5 experts is more than the "
                                            "model's 4 routed experts"),
    ({"0": [1, 2]}, ("--cpu-experts", "-1"), "--cpu-experts: -1 experts is below zero"),
])
def test_bad_input_one_line_exit_2_nothing_written(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str],
                                                   counts: dict[str, object],
                                                   args: tuple[str, ...], said: str) -> None:
    t = trace(tmp_path, "t.json", counts)
    code, doc = run(tmp_path, "--layers", "2", "--experts", "2",
                    *(args or ("--cpu-experts", "1")), t)
    err = capsys.readouterr().err.strip()
    assert code == 2 and doc is None
    assert err.splitlines() == [err] and said.split(": ", 1)[1] in err, err
    assert err.startswith(said.split(": ", 1)[0] if said.startswith("--")
                          else str(tmp_path / said.split(": ", 1)[0])), err
