"""`frank revert PART`: one step back, as the part's manifest says; rebuilds nothing."""

from __future__ import annotations

import difflib
from pathlib import Path

import click

from frank.cli.output import emit_json, json_option
from frank.diff import diff_locks
from frank.project import repo_root_for, stack_path
from frank.revert import apply_revert, plan_revert, relock_dependents


@click.command()
@click.argument("part")
@click.option("--stack", "stack_arg", default="stacks/served.toml", show_default=True)
@click.option("--why", default=None, help="Reason, kept in the stack's history.")
@click.option("--dry-run", is_flag=True, help="Show the change; write nothing.")
@json_option
def revert(part: str, stack_arg: str, why: str | None, dry_run: bool, as_json: bool) -> None:
    """Take PART one step back in STACK: remove it or return it to its earlier version."""
    root = repo_root_for()
    path = stack_path(stack_arg, root)
    root = repo_root_for(path)
    result = plan_revert(path, part, root)
    dependents: list[tuple[str, str]] = []
    if not dry_run:
        apply_revert(path, result, why)
        dependents = relock_dependents(path, root)
    changes = diff_locks(result.old_lock, result.lock, root)
    if as_json:
        emit_json({"part": part, "action": result.action, "from": result.old_version,
                   "to": result.new_version, "dry_run": dry_run,
                   "digest_before": result.old_lock.digest, "digest_after": result.lock.digest,
                   "diff": changes, "dependents": dict(dependents)})
        return
    rel = path.relative_to(root) if path.is_relative_to(root) else Path(stack_arg)
    click.echo("".join(difflib.unified_diff(
        result.old_text.splitlines(keepends=True), result.stack_text.splitlines(keepends=True),
        f"a/{rel}", f"b/{rel}")), nl=False)
    target = "removed" if result.action == "remove" else f"back to {result.new_version}"
    verb = "would be" if dry_run else "is"
    click.echo(f"{part} {result.old_version} {verb} {target}; "
               f"digest {result.old_lock.digest[:19]} -> {result.lock.digest[:19]}")
    for layer in changes["layers"]:
        if layer["state"] != "same":
            click.echo(f"  layer {layer['layer']}: {layer['state']}")
    for name, state in dependents:
        click.echo(f"  {name} extends it: {state}")
