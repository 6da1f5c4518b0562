"""`frank lock STACK...`: write each stack's lock, or with --check fail when one is stale."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import click

from frank.cli.output import emit_json, json_option
from frank.fsutil import find_repo_root
from frank.history.repolock import repo_lock, repo_read_lock
from frank.model.stackfiles import stack_files
from frank.store import memo

# What `frank lock --check` imports is kept small: on a kept answer (frank.store.memo) nothing
# that resolves a stack (pydantic, the part kinds) is imported at all.


def all_stacks() -> list[str]:
    """Every stack file in the repo's stacks/ folder."""
    return [str(p) for p in stack_files(find_repo_root(Path.cwd()))]


def check_answer(arg: str) -> dict[str, Any]:
    """What the lock of ``arg`` must hold (offline, writing nothing), as JSON data."""
    from frank.resolve.lock import render_lock
    from frank.resolve.project import lock_stack

    locked = lock_stack(arg, closure="check")
    return {"stack": locked.lock.stack, "lock_file": str(locked.lock_file),
            "digest": locked.lock.digest, "closure_stale": locked.closure_stale,
            "sha256": hashlib.sha256(render_lock(locked.lock).encode()).hexdigest()}


def _current(path: Path, sha256: str) -> bool:
    """Whether the lock file holds exactly the text whose sha256 is given (as bytes)."""
    return path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == sha256


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
    for arg in _holding_repo_lock(stacks or all_stacks(), read_only=check):
        if check:
            want = memo.answer("lock --check", [arg], partial(check_answer, arg))
            path = Path(want["lock_file"])
            ok = _current(path, want["sha256"]) and not want["closure_stale"]
            stale |= not ok
            state = "up to date" if ok else ("stale" if path.is_file() else "missing")
            stack, digest = want["stack"], want["digest"]
        else:
            from frank.resolve.lock import write_lock
            from frank.resolve.project import lock_stack

            locked = lock_stack(arg, closure=mode)  # type: ignore[arg-type]
            path = locked.lock_file
            state = "written" if write_lock(locked.lock, path) else "unchanged"
            stack, digest = locked.lock.stack, locked.lock.digest
        results.append({"stack": stack, "lock": _rel(path), "state": state, "digest": digest})
    if as_json:
        emit_json(results)
    else:
        for r in results:
            click.echo(f"{r['lock']}: {r['state']} ({r['digest']})")
    if stale:
        click.echo("frank: error: lock is out of date; run `frank lock`", err=True)
        raise SystemExit(1)


def _holding_repo_lock(args: Iterable[str], *, read_only: bool) -> Iterator[str]:
    """``args``, with the repo lock held until the last one is done: no revert or adopt
    rewrites a stack between its locking and the lock's writing (a check holds it shared)."""
    root = find_repo_root(Path.cwd())
    with repo_read_lock(root) if read_only else repo_lock(root):
        yield from args


def _rel(path: Path) -> str:
    try:
        return path.relative_to(Path.cwd()).as_posix()
    except ValueError:
        return str(path)
