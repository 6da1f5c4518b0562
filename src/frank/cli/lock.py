"""`frank lock STACK...`: write each stack's lock, or with --check fail when one is stale."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import click

from frank.cli.output import emit_json, json_option
from frank.lock import lock_is_current, render_lock, write_lock
from frank.project import lock_stack, repo_root_for
from frank.repolock import repo_lock
from frank.stackfiles import stack_files


def all_stacks() -> list[str]:
    """Every stack file in the repo's stacks/ folder."""
    root = repo_root_for()
    return [str(p) for p in stack_files(root)]


@click.command()
@click.argument("stacks", nargs=-1)
@click.option("--check", is_flag=True,
              help="Write nothing, stay offline; exit 1 if a lock or pylock would change.")
@click.option("--upgrade", is_flag=True,
              help="Re-resolve every Python closure even if its request did not change.")
@json_option
def lock(stacks: tuple[str, ...], check: bool, upgrade: bool, as_json: bool) -> None:
    """Resolve STACKS (default: all) and write STACK.lock (and pylock.STACK.toml) beside each.

    The Python closure is re-resolved (with uv, over the network) only when what the
    stack asks for changed, or with --upgrade; otherwise locking is offline.
    """
    results = []
    stale = False
    mode = "check" if check else ("upgrade" if upgrade else "resolve")
    for arg in _holding_repo_lock(stacks or all_stacks()):
        locked = lock_stack(arg, closure=mode)  # type: ignore[arg-type]
        path = locked.lock_file
        if check:
            ok = lock_is_current(path, render_lock(locked.lock)) and not locked.closure_stale
            stale |= not ok
            state = "up to date" if ok else ("stale" if path.is_file() else "missing")
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


def _holding_repo_lock(args: Iterable[str]) -> Iterator[str]:
    """``args``, with the repo lock held until the last one is done: no revert or adopt
    rewrites a stack between its locking and the lock's writing."""
    with repo_lock(repo_root_for()):
        yield from args


def _rel(path: Path) -> str:
    try:
        return path.relative_to(Path.cwd()).as_posix()
    except ValueError:
        return str(path)
