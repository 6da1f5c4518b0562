"""The documentation site (issue 56): `mkdocs build --strict` passes (a broken link or a
missing page fails it), the part-kind pages carry every field the models accept, and every
shell block of the getting-started page runs as written."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
GETTING_STARTED = ROOT / "docs" / "getting-started.md"
BLOCK = re.compile(r"<!-- run: (quick|slow|never)\b[^>]*-->\n```sh\n(.*?)```", re.DOTALL)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([str(BIN / "mkdocs"), "build", "--strict", "--site-dir", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, check=False,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def _text(html: Path) -> str:
    return html.read_text(encoding="utf-8")


def test_every_kind_page_lists_every_field_of_its_schema(site: Path) -> None:
    schemas = sorted((ROOT / "schemas").glob("part-*.json"))
    assert len(schemas) >= 11
    for schema_file in schemas:
        kind = schema_file.stem.removeprefix("part-")
        page = _text(site / "kinds" / kind / "index.html")
        schema = json.loads(schema_file.read_text())
        for field in schema["properties"]:
            assert f"<td><code>{field}</code></td>" in page, (kind, field)
        for name in schema.get("$defs", {}):
            assert f"<code>{name}</code>" in page, (kind, name)
    stack = _text(site / "reference" / "stack" / "index.html")
    for field in json.loads((ROOT / "schemas/stack.json").read_text())["properties"]:
        assert f"<td><code>{field}</code></td>" in stack, field
    assert "per node" in stack  # a model's comment, carried into the table


def test_pages_of_the_issue_exist_and_bench_results_are_listed(site: Path) -> None:
    for page in ("getting-started", "tour", "concepts/parts", "concepts/stacks",
                 "concepts/lock", "concepts/plan", "concepts/image", "concepts/audit",
                 "concepts/trials", "ci", "k8s", "kubernetes", "bench", "reference/schemas"):
        assert (site / page / "index.html").is_file(), page
    bench = _text(site / "bench" / "index.html")
    for result in (ROOT / "bench/results").glob("*.md"):
        assert f'href="results/{result.stem}/"' in bench, result.name
        assert (site / "bench" / "results" / result.stem / "index.html").is_file()
    # a link to a repo file outside docs/ is shown as its path, never a dead link
    plan = _text(site / "concepts" / "plan" / "index.html")
    assert "<code>images/README.md</code>" in plan and 'href="../../images' not in plan
    # the site loads nothing from elsewhere (no web fonts)
    assert "fonts.googleapis.com" not in _text(site / "index.html")


def _blocks() -> list[tuple[str, str]]:
    text = GETTING_STARTED.read_text(encoding="utf-8")
    blocks = BLOCK.findall(text)
    assert len(blocks) == text.count("```sh"), "every sh block needs a <!-- run: ... --> marker"
    return blocks


def test_getting_started_blocks_are_all_accounted_for() -> None:
    blocks = _blocks()
    never = [body.strip() for how, body in blocks if how == "never"]
    assert never == ["scripts/test"]  # the suite itself is the one command not run inside it
    assert [body.strip() for how, body in blocks if how == "slow"] == \
        ["scripts/setup && scripts/demo"]


def test_getting_started_commands_run_as_written() -> None:
    """In the checkout itself, as a newcomer runs them: they read the repo and write only
    under out/ (a copy would not do: a stack built from a local git source locks
    differently outside its checkout)."""
    repo = ROOT
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "COLUMNS": "200"}
    quick = [body for how, body in _blocks() if how == "quick"]
    assert len(quick) >= 2
    for body in quick:
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", body], cwd=repo, env=env,
                              capture_output=True, text=True, check=False, timeout=600)
        assert done.returncode == 0, (body, done.stdout[-3000:], done.stderr[-3000:])
    review = (repo / "out/review.html").read_text()
    assert "<b>rs8</b> (kernel)" in review and "added" in review


@pytest.mark.slow
def test_setup_and_demo_run_as_written(tmp_path: Path) -> None:
    """The README's first command, as written, on this checkout (setup is idempotent; the
    demo's image is built in the test store, its tiny model's hub cache in tmp)."""
    (body,) = [body for how, body in _blocks() if how == "slow"]
    env = {**os.environ, "FRANK_DEMO_DIR": str(tmp_path / "demo")}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", body], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=False, timeout=1800)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    assert "x-frank-patch:" in done.stdout and "x-frank-patch: None" not in done.stdout
