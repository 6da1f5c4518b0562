"""`frank revert PART`: one step back, as the part's manifest says; rebuilds nothing.

`frank revert --undo` takes the stack's last revert back (from its history file).
"""

from __future__ import annotations

import difflib
from pathlib import Path

import click

from frank.cli.output import emit_json, json_option
from frank.errors import FrankError
from frank.history.diff import diff_locks
from frank.history.repolock import repo_lock, repo_read_lock
from frank.history.revert import apply_revert, plan_revert
from frank.resolve.project import repo_root_for, stack_path


@click.command()
@click.argument("part", required=False)
@click.option("--stack", "stack_arg", default="stacks/served.toml", show_default=True)
@click.option("--why", default=None, help="Reason, kept in the stack's history.")
@click.option("--undo", is_flag=True,
              help="Take back the stack's last revert (the history keeps its earlier text).")
@click.option("--with-dependents", is_flag=True,
              help="Also take back every part that requires PART (one step, one history "
                   "entry).")
@click.option("--dry-run", is_flag=True, help="Show the change; write nothing.")
@json_option
def revert(part: str | None, stack_arg: str, why: str | None, undo: bool,
           with_dependents: bool, dry_run: bool, as_json: bool) -> None:
    """Take PART one step back in STACK: remove it or return it to its earlier version."""
    if undo == (part is not None):
        raise FrankError("give a PART to revert, or --undo (without a part) to take the "
                         "last revert back", field="PART")
    root = repo_root_for()
    path = stack_path(stack_arg, root)
    root = repo_root_for(path)
    from frank.resolve.closure import pylock_path

    dependents: list[tuple[str, str]] = []
    pylock = pylock_path(path)
    old_closure = pylock.read_bytes() if pylock.is_file() else None  # before it may move
    # plan and write in one turn: a concurrent revert waits (a dry run writes nothing)
    with repo_read_lock(root) if dry_run else repo_lock(root):
        if undo:
            from frank.history.undo import apply_undo, plan_undo

            done = plan_undo(path, root)
            e = done.entry
            part = str(e.get("part"))
            action, old, new = "undo", e.get("to"), e.get("from")
            if not dry_run:
                dependents = apply_undo(path, done, root)
        else:
            assert part is not None
            result = plan_revert(path, part, root, with_dependents=with_dependents)
            done = result  # type: ignore[assignment]
            action, old, new = result.action, result.old_version, result.new_version
            if not dry_run:
                dependents = apply_revert(path, result, why, root)
    changes = diff_locks(done.old_lock, done.lock, root, (old_closure, done.closure))
    if as_json:
        taken = [n for n, _ in getattr(done, "dependents", [])]
        emit_json({"part": part, "action": action, "from": old, "to": new,
                   "with_dependents": taken,
                   "dry_run": dry_run, "digest_before": done.old_lock.digest,
                   "digest_after": done.lock.digest, "diff": changes,
                   "dependents": dict(dependents),
                   "mappings_taken": getattr(done, "mappings", [])})
        return
    rel = path.relative_to(root) if path.is_relative_to(root) else Path(stack_arg)
    click.echo("".join(difflib.unified_diff(
        done.old_text.splitlines(keepends=True), done.stack_text.splitlines(keepends=True),
        f"a/{rel}", f"b/{rel}")), nl=False)
    verb = "would be" if dry_run else "is"
    if action == "undo":
        target = "back" if old is None else f"back to {new}"
        click.echo(f"{part} {verb} {target} (undoing its revert); "
                   f"digest {done.old_lock.digest} -> {done.lock.digest}")
    else:
        target = "removed" if action == "remove" else f"back to {new}"
        click.echo(f"{part} {old} {verb} {target}; "
                   f"digest {done.old_lock.digest} -> {done.lock.digest}")
        for name, version in getattr(done, "dependents", []):
            click.echo(f"  {name} {version} {verb} taken back with it (it requires {part})")
        for dist in getattr(done, "mappings", []):
            click.echo(f"  from_index.{dist} {verb} taken with it (nothing asks for it now)")
    for c in changes["closure"]:
        click.echo(f"  closure {c['distribution']}: {c['old'] or '-'} -> {c['new'] or '-'}")
    for layer in changes["layers"]:
        if layer["state"] != "same":
            click.echo(f"  layer {layer['layer']}: {layer['state']}")
    for name, state in dependents:
        click.echo(f"  {name} extends it: {state}")
