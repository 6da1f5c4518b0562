"""`frank check`: validate every manifest and every stack in the repo."""

from __future__ import annotations

import click

from frank.cli.output import emit_json, json_option
from frank.model.catalog import Catalog
from frank.model.stackfiles import stack_files
from frank.resolve.project import lock_stack, repo_root_for
from frank.resolve.standing import shelved_part


@click.command()
@json_option
def check(as_json: bool) -> None:
    """Validate all parts/ manifests and resolve all stacks/ (writes nothing); a parked or
    rejected part in any stack is refused."""
    root = repo_root_for()
    catalog = Catalog(root)
    manifests = catalog.all()
    # offline: an official base's contents as kept or as each lock recorded them
    locked = [lock_stack(str(p), catalog, offline=True) for p in stack_files(root)]
    for one in locked:
        bad = shelved_part(one.resolved)
        if bad is not None:
            raise bad
    stacks = [one.lock for one in locked]
    if as_json:
        emit_json({"manifests": [m.rel for m in manifests],
                   "stacks": {s.stack: s.digest for s in stacks}})
    else:
        click.echo(f"ok: {len(manifests)} manifests, {len(stacks)} stacks")
