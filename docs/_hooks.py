"""mkdocs hooks for frank's site: the reference is made from the code, not by hand.

- ``<!-- fields: NAME -->`` in a page becomes the field tables of ``schemas/NAME.json`` (which
  ``frank schema`` writes from the pydantic models and a test keeps current);
- ``<!-- bench-results -->`` becomes the list of committed bench results, each of which is
  added to the site as a page of its own (``bench/results/*.md``);
- a link to a file of the repo outside docs/ (``../../trials/README.md``) becomes its path as
  code: the site cannot serve it, a reader of the repo finds it; a link to a file that exists
  nowhere stays a link, so ``mkdocs build --strict`` fails on it;
- a page in docs/ that the nav does not list (one added with a feature) joins the nav under
  "More", and ``trust.md`` under its own title, so a new page is never left unreachable.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

from frank.model.schema import field_table

ROOT = Path(__file__).resolve().parent.parent
FIELDS = re.compile(r"<!-- fields: ([a-z0-9-]+) -->")
LINK = re.compile(r"(?<!!)\[([^\]]+)\]\(([^)\s#]+)(#[^)]*)?\)")
OPTIONAL_PAGES = [("Trust and threat models", "trust.md")]


def _results() -> list[Path]:
    return sorted((ROOT / "bench" / "results").glob("*.md"))


def _listed(nav: Any) -> set[str]:
    if isinstance(nav, str):
        return {nav}
    if isinstance(nav, list):
        return set().union(*(_listed(x) for x in nav)) if nav else set()
    if isinstance(nav, dict):
        return set().union(*(_listed(x) for x in nav.values()))
    return set()


def on_config(config: Any) -> Any:
    nav = config["nav"]
    for title, page in OPTIONAL_PAGES:
        if (ROOT / "docs" / page).is_file() and page not in _listed(nav):
            nav.insert(len(nav) - 1, {title: page})
    listed = _listed(nav)
    more = [{_first_line(p): p.relative_to(ROOT / "docs").as_posix()}
            for p in sorted((ROOT / "docs").rglob("*.md"))
            if p.relative_to(ROOT / "docs").as_posix() not in listed]
    if more:
        nav.append({"More": more})
    return config


def on_files(files: Files, config: Any) -> Files:
    for path in _results():
        files.append(File.generated(config, f"bench/results/{path.name}",
                                    content=path.read_text(encoding="utf-8")))
    return files


def _first_line(path: Path) -> str:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return path.stem


def _outside_link(match: re.Match[str], page_dir: Path) -> str:
    text, target = match.group(1), match.group(2)
    if "://" in target or target.startswith("mailto:"):
        return match.group(0)
    resolved = (page_dir / target).resolve()
    docs = ROOT / "docs"
    if resolved.is_relative_to(docs) or not resolved.is_relative_to(ROOT):
        return match.group(0)
    if not resolved.exists():
        return match.group(0)  # broken: left for --strict to report
    rel = resolved.relative_to(ROOT).as_posix()
    return f"`{rel}`" if text.strip("`") == rel else f"{text} (`{rel}`)"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    def fields(match: re.Match[str]) -> str:
        schema = json.loads((ROOT / "schemas" / f"{match.group(1)}.json").read_text())
        return field_table(schema, heading="###")

    markdown = FIELDS.sub(fields, markdown)
    if "<!-- bench-results -->" in markdown:
        items = [f"- [{p.stem}](bench/results/{p.name}): {_first_line(p)}" for p in _results()]
        markdown = markdown.replace("<!-- bench-results -->", "\n".join(items))
    if page.file.abs_src_path:
        page_dir = Path(page.file.abs_src_path).parent
        markdown = LINK.sub(lambda m: _outside_link(m, page_dir), markdown)
    return markdown
