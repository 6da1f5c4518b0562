"""`frank diff A B`: stacks (names or paths) or lock files, part by part."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from frank.cli.output import emit_json, json_option, print_table
from frank.fsutil import write_atomic
from frank.store import memo


def diff_answer(a: str, b: str) -> dict[str, Any]:
    """The structured diff of A and B (imported only when no kept answer holds)."""
    from frank.history.diff import diff_locks
    from frank.resolve.project import load_lock_any, repo_root_for

    return diff_locks(load_lock_any(a), load_lock_any(b), repo_root_for())


def _short(value: object) -> str:
    text = "-" if value is None else str(value)
    return text if len(text) <= 44 else text[:20] + "…" + text[-20:]


def _label(field: str) -> str:
    """A field's name for the table: an input fetched by URL by its file name (the JSON
    output keeps the whole URL)."""
    if field.startswith("inputs.") and "://" in field:
        return "inputs.…/" + field.rstrip("/").rsplit("/", 1)[-1]
    return field


def _print_k8s(k8s: dict[str, object], a: str, b: str) -> None:
    unrendered = k8s["unrendered"]
    assert isinstance(unrendered, dict)
    for side, why in unrendered.items():
        click.echo(f"k8s: {a if side == 'a' else b} does not render: {why}")
    objects = k8s["objects"]
    assert isinstance(objects, list)
    if objects:
        rows = []
        for o in objects:
            # what the pods run first, then metadata
            fields = sorted(o["fields"], key=lambda f: (f.startswith("metadata"), f))
            shown = ", ".join(fields[:4]) + (f" (+{len(fields) - 4} more)" if len(fields) > 4
                                             else "")
            rows.append([o["kind"], o["state"], o["a"] or "-", o["b"] or "-", shown])
        print_table("kubernetes objects", ["kind", "state", a, b, "fields that change"], rows)


@click.command()
@click.argument("a")
@click.argument("b")
@click.option("--exit-code", is_flag=True, help="Exit 1 when the two differ.")
@click.option("--k8s", "with_k8s", is_flag=True,
              help="Also the Kubernetes objects `frank render k8s` would change, and how.")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "html"]), default="text",
              show_default=True,
              help="html: one self-contained page of the changes, for a review.")
@click.option("--out", "out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the answer to this file (atomically) instead of stdout.")
@json_option
def diff(a: str, b: str, exit_code: bool, with_k8s: bool, fmt: str, out: Path | None,
         as_json: bool) -> None:
    """Show what differs between A and B (stack names, stack paths or .lock files)."""
    if out is not None and fmt == "text" and not as_json:
        raise click.UsageError("--out writes --format html or json")
    result = memo.answer("diff", [a, b], lambda: diff_answer(a, b))
    if with_k8s:
        from frank.resolve.project import load_lock_any
        from frank.ship.render.objdiff import diff_objects

        result = {**result, "k8s": diff_objects(load_lock_any(a), load_lock_any(b))}
    if as_json:
        if fmt == "html":
            raise click.UsageError("--json and --format html: choose one")
        fmt = "json"
    if fmt in ("html", "json") and (fmt == "html" or out is not None):
        from frank.history.diffpage import render_html

        text = render_html(result) if fmt == "html" else \
            json.dumps(result, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        if out is None:
            click.echo(text, nl=False)
        else:
            write_atomic(out, text)
            click.echo(f"wrote {out}")
    elif fmt == "json":
        emit_json(result)
    else:
        click.echo(f"{a}: {result['a']['digest']}\n{b}: {result['b']['digest']}")
        if result["same"]:
            click.echo("same resolved content")
        rows, history = [], []
        for p in result["parts"]:
            rows.append([p["part"], f"{p['change']} ({p['kind']})", _short(p["old"]),
                         _short(p["new"])])
            if "same_content_as" in p:
                other = "removed" if p["change"] == "added" else "added"
                rows.append(["", f"  same content as {other} {p['same_content_as']}", "", ""])
            for f in p["fields"]:
                rows.append(["", f"  {_label(f['field'])}", _short(f["old"]), _short(f["new"])])
            for f in p["history"]:
                history.append([p["part"], f["field"], _short(f["old"]), _short(f["new"])])
        for c in result["config"]:
            rows.append(["(stack)", c["field"], _short(c["old"]), _short(c["new"])])
        for c in result["closure"]:
            change = "removed" if c["new"] is None else "added" if c["old"] is None \
                else "version"
            rows.append(["(closure)", f"{c['distribution']}: {change}", _short(c["old"]),
                         _short(c["new"])])
        if rows:
            print_table("parts and config", ["part", "change", a, b], rows)
        if history:
            print_table("part history (summary, provenance, status, evidence, revert: "
                        "not built, not in the digest)", ["part", "field", a, b], history)
        print_table("image layers", ["layer", "state", a, b],
                    [[x["layer"], x["state"], _short(x["old"] and x["old"][:16]),
                      _short(x["new"] and x["new"][:16])] for x in result["layers"]])
        if with_k8s:
            _print_k8s(result["k8s"], a, b)
    if exit_code and not result["same"]:
        raise SystemExit(1)
