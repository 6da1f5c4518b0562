"""``frank inspect IMAGE``: what an image carries (stack, parts, lock), layout or registry."""

from __future__ import annotations

import click


@click.command("inspect")
@click.argument("image")
@click.option("--json", "as_json", is_flag=True, help="Print the full record as JSON.")
def inspect_cmd(image: str, as_json: bool) -> None:
    """Show the image at IMAGE (an OCI layout directory or HOST/REPO[:TAG|@DIGEST])."""
    from frank.image.oci import read_image

    info = read_image(image)
    if as_json:
        click.echo(info.model_dump_json(indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(f"[bold]{info.source}[/bold]  {info.digest}")
    console.print(f"created {info.created}  {info.os}/{info.architecture}")
    if info.entrypoint or info.cmd:
        console.print(f"entrypoint {info.entrypoint}  cmd {info.cmd}")
    for title, items in (("labels", info.labels), ("annotations", info.annotations)):
        if items:
            t = Table(title=title, show_header=False, box=None)
            for k in sorted(items):
                t.add_row(k, items[k])
            console.print(t)
    layers = Table(title="layers")
    for col in ("#", "digest", "size", "created by", "key"):
        layers.add_column(col)
    for i, layer in enumerate(info.layers):
        layers.add_row(str(i), layer.digest[:19], f"{layer.size:,}", layer.created_by,
                       layer.comment[:12])
    console.print(layers)
