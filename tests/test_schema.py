"""`frank schema`: the JSON Schemas under schemas/ are the models' own, every shipped part and
stack names its schema on its first line, and check-jsonschema holds every shipped TOML to
them (issue 56)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from click.testing import CliRunner

from frank.cli import cli
from frank.model.schema import REGENERATE, directive, shipped, update

ROOT = Path(__file__).resolve().parent.parent
CHECK_JSONSCHEMA = Path(sys.executable).parent / "check-jsonschema"


def _check_jsonschema(schema: Path, files: list[Path]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CHECK_JSONSCHEMA), "--schemafile", str(schema),
                           *map(str, files)], capture_output=True, text=True, check=False)


def test_schemas_and_stamps_are_current() -> None:
    report = update(ROOT, check=True)
    stale = report.schemas + report.stamps
    assert not stale, (f"not current: {', '.join(stale)}; run `{REGENERATE}` (then "
                       "`frank lock` if it stamped manifests) and commit the result")


def test_every_shipped_toml_is_covered() -> None:
    """No part manifest or stack escapes the schema check (an unknown kind would)."""
    items = shipped(ROOT)
    covered = {i.path for i in items}
    parts = set(ROOT.glob("parts/*/*.toml")) | set(ROOT.glob("examples/*/parts/*/*.toml"))
    stacks = {p for p in [*ROOT.glob("stacks/*.toml"), *ROOT.glob("examples/*/stacks/*.toml")]
              if not p.name.startswith("pylock.")}
    assert parts and stacks
    assert parts | stacks <= covered
    for item in items:
        if item.stamp:
            first = item.path.read_text(encoding="utf-8").splitlines()[0]
            assert first == directive(ROOT, item)
            target = (item.path.parent / first.split(" ", 1)[1]).resolve()
            assert target == ROOT / "schemas" / item.schema and target.is_file()


def test_check_jsonschema_accepts_every_shipped_toml() -> None:
    groups: dict[str, list[Path]] = defaultdict(list)
    for item in shipped(ROOT):
        groups[item.schema].append(item.path)
    assert {"stack.json", "image.json", "part-engine.json", "part-data.json"} <= set(groups)
    failed = {}
    for name, files in sorted(groups.items()):
        done = _check_jsonschema(ROOT / "schemas" / name, files)
        if done.returncode != 0:
            failed[name] = done.stdout + done.stderr
    assert not failed, failed


def test_check_jsonschema_refuses_a_wrong_manifest(tmp_path: Path) -> None:
    good = (ROOT / "parts/tiny-llama/seed0.toml").read_text(encoding="utf-8")
    typo = tmp_path / "typo.toml"
    typo.write_text(good.replace("served_model_name", "served_model"), encoding="utf-8")
    wrong_kind = tmp_path / "kind.toml"
    wrong_kind.write_text(good, encoding="utf-8")
    bad = _check_jsonschema(ROOT / "schemas/part-weights.json", [typo])
    assert bad.returncode == 1 and "'served_model' was unexpected" in bad.stdout
    other = _check_jsonschema(ROOT / "schemas/part-data.json", [wrong_kind])
    assert other.returncode == 1 and "'data' was expected" in other.stdout
    stack = tmp_path / "stack.toml"
    stack.write_text('extends = "served.toml"\n[target]\ngpus = "two"\n', encoding="utf-8")
    refused = _check_jsonschema(ROOT / "schemas/stack.json", [stack])
    assert refused.returncode == 1 and "'two' is not of type 'integer'" in refused.stdout


def test_schemas_carry_the_models_comments() -> None:
    stack = json.loads((ROOT / "schemas/stack.json").read_text(encoding="utf-8"))
    target = stack["$defs"]["Target"]
    assert "per node" in target["properties"]["gpus"]["description"]
    assert "required" not in target  # a stack that extends gives [target] in part
    assert stack["additionalProperties"] is False
    step = json.loads((ROOT / "schemas/part-step.json").read_text(encoding="utf-8"))
    assert step["properties"]["kind"]["const"] == "step"


def _mini_repo(root: Path) -> Path:
    (root / ".git").mkdir(parents=True)
    part = root / "parts/env-x/1.toml"
    part.parent.mkdir(parents=True)
    part.write_text('kind = "env"\nname = "env-x"\nversion = "1"\n', encoding="utf-8")
    (root / "stacks").mkdir()
    (root / "stacks/s.toml").write_text("#:schema old.json\n[parts]\n", encoding="utf-8")
    (root / "stacks/pylock.s.toml").write_text("lock-version = '1.0'\n", encoding="utf-8")
    return part


def test_frank_schema_writes_and_stamps_then_check_passes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "r"
    part = _mini_repo(root)
    runner = CliRunner()
    monkeypatch.chdir(root)
    checked = runner.invoke(cli, ["schema", "--check"])
    assert checked.exit_code == 1
    assert "no current #:schema line: parts/env-x/1.toml" in checked.output
    assert "run `frank schema`" in checked.output
    written = runner.invoke(cli, ["schema"])
    assert written.exit_code == 0, written.output
    assert "stamped: stacks/s.toml" in written.output
    assert part.read_text().startswith("#:schema ../../schemas/part-env.json\nkind")
    assert (root / "stacks/s.toml").read_text() == "#:schema ../schemas/stack.json\n[parts]\n"
    assert (root / "stacks/pylock.s.toml").read_text() == "lock-version = '1.0'\n"
    again = runner.invoke(cli, ["schema", "--check", "--json"])
    assert again.exit_code == 0 and json.loads(again.output)["stamps"] == []
    (root / "schemas/part-env.json").write_text("{}\n")
    (root / "schemas/part-gone.json").write_text("{}\n")
    stale = runner.invoke(cli, ["schema", "--check"])
    assert stale.exit_code == 1
    assert "stale: schemas/part-env.json" in stale.output
    assert "schemas/part-gone.json (no such schema any more)" in stale.output
