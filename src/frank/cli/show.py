"""`frank show PART[@VERSION]`: one part's manifest, validated."""

from __future__ import annotations

import click

from frank.cli.output import emit_json, json_option
from frank.errors import FrankError
from frank.model.catalog import Catalog
from frank.resolve.project import repo_root_for


@click.command()
@click.argument("part")
@json_option
def show(part: str, as_json: bool) -> None:
    """Show PART (every version) or PART@VERSION."""
    catalog = Catalog(repo_root_for())
    name, _, version = part.partition("@")
    versions = [version] if version else catalog.versions(name)
    if not versions:
        raise FrankError(f"no part named {name!r} in parts/")
    where = catalog.root / "parts" / name
    manifests = [catalog.get(name, v, file=where, field="version") for v in versions]
    if as_json:
        emit_json([{"manifest": m.rel, "sha256": m.sha256, **m.part.model_dump(mode="json")}
                   for m in manifests])
        return
    for m in manifests:
        click.echo(f"# {m.rel} (sha256 {m.sha256})")
        click.echo(m.path.read_text(encoding="utf-8"))
