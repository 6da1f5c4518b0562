"""`frank debs lock|build IMAGE...`: pin a ``[debs]`` base's closure, or build it from its lock.

Locking reads the archive's signed indexes (network); ``--check`` and ``build`` never do.
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from frank.errors import FrankError


def _recipe(image: str) -> tuple[Path, object]:
    from frank.model.imagefile import load_image_file

    path = Path(image)
    img = load_image_file(path)
    if img.debs is None:
        raise FrankError("has no [debs] recipe", file=path)
    return path, img


@click.group()
def debs() -> None:
    """Bases made from Debian packages pinned by version and sha256."""


@debs.command("lock")
@click.argument("images", nargs=-1, required=True)
@click.option("--check", is_flag=True, help="Offline: exit 1 if a lock is missing or stale.")
@click.option("--mirror", "mirrors", multiple=True, type=click.Path(path_type=Path),
              help="A folder of files named by sha256, read before the network.")
def lock(images: tuple[str, ...], check: bool, mirrors: tuple[Path, ...]) -> None:
    """Resolve each IMAGE's [debs] closure and write IMAGE.debs.lock beside it."""
    from frank.model.imagefile import BaseImageFile
    from frank.resolve.debs.lock import current_lock, lock_path, write_lock
    from frank.resolve.debs.resolver import resolve_lock
    from frank.store.blobs import BlobStore
    from frank.store.fetch import Fetcher

    stale = False
    for image in images:
        path, img = _recipe(image)
        assert isinstance(img, BaseImageFile) and img.debs is not None
        if check:
            try:
                current_lock(img.debs, path)
                click.echo(f"{lock_path(path)}: current")
            except FrankError as exc:
                click.echo(exc.one_line())
                stale = True
            continue
        t = time.monotonic()
        new = resolve_lock(img.debs, Fetcher(BlobStore(), mirrors), file=path)
        changed = write_lock(new, lock_path(path))
        click.echo(f"{lock_path(path)}: {len(new.packages)} packages, "
                   f"{sum(p.size for p in new.packages) / 1e6:.1f} MB of .debs, "
                   f"{'written' if changed else 'unchanged'} ({time.monotonic() - t:.1f} s)")
    if stale:
        raise SystemExit(1)


@debs.command("build")
@click.argument("image")
@click.option("--mirror", "mirrors", multiple=True, type=click.Path(path_type=Path),
              help="A folder of files named by sha256, read before the network.")
def build(image: str, mirrors: tuple[Path, ...]) -> None:
    """Build IMAGE's base from its lock (cached by the locked packages); print its digest."""
    from frank.assemble.debs.build import debs_base
    from frank.model.imagefile import BaseImageFile
    from frank.store.blobs import BlobStore

    path, img = _recipe(image)
    assert isinstance(img, BaseImageFile) and img.debs is not None
    base = debs_base(img.debs, path, BlobStore(), name=img.name, mirrors=mirrors)
    click.echo(f"{base.digest} {base.layout}")


def _standalone() -> None:
    """``python -m frank.cli.debs lock|build IMAGE``: the ``frank debs`` commands, standalone."""
    import sys

    from frank.errors import FrankError

    try:
        debs.main(sys.argv[1:], prog_name="python -m frank.cli.debs", standalone_mode=False)
    except FrankError as exc:
        click.echo(f"frank: error: {exc.one_line()}", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    _standalone()
