"""`frank lock STACK...`: write each stack's lock, or with --check fail when one is stale."""

from __future__ import annotations

from pathlib import Path

import click

from frank.cli.output import emit_json, json_option
from frank.lock import render_lock, write_lock
from frank.project import lock_stack, repo_root_for


def all_stacks() -> list[str]:
    """Every stack file in the repo's stacks/ folder."""
    root = repo_root_for()
    return [str(p) for p in sorted((root / "stacks").glob("*.toml"))]


@click.command()
@click.argument("stacks", nargs=-1)
@click.option("--check", is_flag=True, help="Write nothing; exit 1 if a lock would change.")
@json_option
def lock(stacks: tuple[str, ...], check: bool, as_json: bool) -> None:
    """Resolve STACKS (default: all) and write STACK.lock next to each."""
    results = []
    stale = False
    for arg in stacks or all_stacks():
        locked = lock_stack(arg)
        path = locked.lock_file
        if check:
            current = path.read_text(encoding="utf-8") if path.is_file() else None
            ok = current == render_lock(locked.lock)
            stale |= not ok
            state = "up to date" if ok else ("missing" if current is None else "stale")
        else:
            state = "written" if write_lock(locked.lock, path) else "unchanged"
        results.append({"stack": locked.lock.stack, "lock": _rel(path), "state": state,
                        "digest": locked.lock.digest})
    if as_json:
        emit_json(results)
    else:
        for r in results:
            click.echo(f"{r['lock']}: {r['state']} ({r['digest']})")
    if stale:
        click.echo("frank: error: lock is out of date; run `frank lock`", err=True)
        raise SystemExit(1)


def _rel(path: Path) -> str:
    try:
        return path.relative_to(Path.cwd()).as_posix()
    except ValueError:
        return str(path)
