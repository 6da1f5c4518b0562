"""``frank inspect IMAGE``: what an image carries (stack, parts, lock), layout or registry."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from frank.errors import FrankError


def is_registry_ref(image: str) -> bool:
    """``HOST[:PORT]/NAME...`` whose first part names a host (a '.' or ':' in it, or
    ``localhost``) and is not a folder here. Anything else is a local path, so a mistyped
    layout (``out/missing/image``) is a local error, never a question to Docker Hub."""
    first, slash, _ = image.partition("/")
    looks_like_host = "." in first or ":" in first or first == "localhost"
    return bool(slash) and looks_like_host and not image.startswith((".", "/", "~")) \
        and not Path(first).exists()


def check_local_layout(image: str) -> None:
    """A local argument must be an existing OCI layout directory."""
    path = Path(image)
    if not path.exists():
        raise FrankError("no such OCI layout directory (a registry image is written "
                         "HOST[:PORT]/NAME[:TAG|@DIGEST])", file=image)
    if not path.is_dir():
        raise FrankError("not an OCI layout directory", file=image)


@click.command("inspect")
@click.argument("image")
@click.option("--json", "as_json", is_flag=True, help="Print the full record as JSON.")
def inspect_cmd(image: str, as_json: bool) -> None:
    """Show the image at IMAGE (an OCI layout directory or HOST/REPO[:TAG|@DIGEST])."""
    from frank.image.remote import read_image

    if not is_registry_ref(image):
        check_local_layout(image)
    info = read_image(image)
    if as_json:
        click.echo(info.model_dump_json(indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    # piped, rich would fit 80 columns and cut digests with "…": never cut a digest (a log
    # or a script reads them whole); on a terminal long cells fold instead
    console = Console(width=None if sys.stdout.isatty() else 400)
    console.print(f"[bold]{info.source}[/bold]  {info.digest}")
    console.print(f"created {info.created}  {info.os}/{info.architecture}")
    if info.entrypoint or info.cmd:
        console.print(f"entrypoint {info.entrypoint}  cmd {info.cmd}")
    for title, items in (("labels", info.labels), ("annotations", info.annotations)):
        if items:
            t = Table(title=title, show_header=False, box=None)
            t.add_column(overflow="fold")
            t.add_column(overflow="fold")
            for k in sorted(items):
                t.add_row(k, items[k])
            console.print(t)
    layers = Table(title="layers")
    for col in ("#", "digest", "size", "created by", "key"):
        layers.add_column(col, overflow="fold")
    for i, layer in enumerate(info.layers):
        layers.add_row(str(i), layer.digest, f"{layer.size:,}", layer.created_by,
                       layer.comment[:12])
    console.print(layers)
