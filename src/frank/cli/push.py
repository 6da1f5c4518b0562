"""``frank push STACK --to HOST/REPO``: push the stack's image by digest, then tag it."""

from __future__ import annotations

import re
from pathlib import Path

import click

from frank.errors import FrankError


def _tag_for(stack: str) -> str:
    """A stack name made into a valid tag (registries allow ``[A-Za-z0-9_.-]``)."""
    tag = re.sub(r"[^A-Za-z0-9_.-]", "-", Path(stack).stem or stack).lstrip(".-") or "stack"
    return tag[:128]


@click.command()
@click.argument("stack")
@click.option("--to", "to", required=True, metavar="HOST/REPO", help="Repository to push to.")
@click.option("--layout", "layout", type=click.Path(path_type=Path), required=True,
              help="OCI layout of the composed image (compose's output directory).")
@click.option("--tag", "tags", multiple=True, help="Extra tag (repeatable).")
def push(stack: str, to: str, layout: Path, tags: tuple[str, ...]) -> None:
    """Push STACK's image to HOST/REPO by digest, then tag it with the stack name."""
    from frank.image.registry import push_layout

    if not layout.is_dir():
        raise FrankError("no composed image here; run frank compose first", file=layout)
    all_tags = list(dict.fromkeys([_tag_for(stack), *tags]))
    result = push_layout(layout, to, all_tags)
    click.echo(result.reference)
    for t in result.tags:
        click.echo(f"{result.repository}:{t}")
