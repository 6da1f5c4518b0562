"""`frank schema`: JSON Schema of parts, stacks and base images, and each file's pointer."""

from __future__ import annotations

import click

from frank.cli.output import emit_json, json_option
from frank.model.schema import REGENERATE, SCHEMA_DIR, update
from frank.resolve.project import repo_root_for


@click.command()
@click.option("--check", is_flag=True,
              help="Write nothing; exit 1 naming what is not current.")
@json_option
def schema(check: bool, as_json: bool) -> None:
    """Write schemas/ from the models and name each part's, stack's and base image's schema
    on its first line (#:schema)."""
    root = repo_root_for()
    report = update(root, check=check)
    if as_json:
        emit_json({"schemas": report.schemas, "stamps": report.stamps, "check": check})
    else:
        verb = "stale" if check else "written"
        for name in report.schemas:
            click.echo(f"{verb}: {name}")
        for name in report.stamps:
            click.echo(f"{'no current #:schema line' if check else 'stamped'}: {name}")
        if not report.stale:
            click.echo(f"ok: {SCHEMA_DIR}/ and every #:schema line are current")
        elif check:
            click.echo(f"run `{REGENERATE}` to bring them up to date", err=True)
        elif report.stamps:
            click.echo("manifest bytes changed: run `frank lock` to refresh the locks")
    if check and report.stale:
        raise SystemExit(1)
