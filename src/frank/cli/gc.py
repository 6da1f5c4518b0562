"""``frank gc``: remove from frank's cache what nothing in this repo references."""

from __future__ import annotations

from pathlib import Path

import click

from frank.cli.output import emit_json, json_option


@click.command()
@click.option("--keep-days", type=click.FloatRange(min=0), default=14.0, show_default=True,
              help="Keep anything changed within this many days, referenced or not.")
@click.option("--wait", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="Seconds to wait for other frank commands using the cache to finish.")
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
@json_option
def gc(keep_days: float, wait: float, dry_run: bool, as_json: bool) -> None:
    """Remove cached blobs, bases, step outputs and clones nothing here references.

    Kept: what this repo's locks (and pylocks, .debs locks), its out/ images and its recorded
    pushes reference, the bases its image files make, and anything changed within
    --keep-days. Runs with the cache to itself (other frank commands wait, or it waits for
    them), and says how much it freed. Images imported into frank's engine storage go too,
    unless referenced or run within --keep-days. Also removes what killed runs and builds
    left: their engines still serving (stopped), their containers (mounts included),
    frank's folders in /tmp, run roots of deleted caches.
    """
    from frank.fsutil import find_repo_root
    from frank.ship.gc import collect
    from frank.store.blobs import default_root

    done = collect(default_root(), find_repo_root(Path.cwd()), keep_days=keep_days,
                   dry_run=dry_run, wait=wait)
    if as_json:
        emit_json({"freed": done.freed, "removed": done.removed, "kept_blobs": done.kept_blobs,
                   "leftovers_removed": done.reaped, "dry_run": dry_run})
        return
    verb = "would free" if dry_run else "freed"
    what = ", ".join(f"{n} {k}" for k, n in sorted(done.removed.items())) or "nothing"
    click.echo(f"{verb} {done.freed / 1e6:.1f} MB ({what}); {done.kept_blobs} blobs kept")
    for what in done.reaped:
        click.echo(f"{'would remove' if dry_run else 'removed'} {what}")
