"""`frank parts`: every part version in the repo with its kind and status."""

from __future__ import annotations

import click

from frank.cli.output import emit_json, json_option, print_table
from frank.model.catalog import Catalog
from frank.resolve.project import repo_root_for


@click.command()
@json_option
def parts(as_json: bool) -> None:
    """List part manifests: name, version, kind, status, summary."""
    rows = [
        {"name": m.part.name, "version": m.part.version, "kind": m.part.kind,
         "status": m.part.status, "summary": m.part.summary, "manifest": m.rel}
        for m in Catalog(repo_root_for()).all()
    ]
    if as_json:
        emit_json(rows)
        return
    print_table(None, ["part", "version", "kind", "status", "summary"],
                [[r["name"], r["version"], r["kind"], r["status"], r["summary"]] for r in rows])
