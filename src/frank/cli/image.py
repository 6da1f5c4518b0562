"""``frank image``: base images brought without a registry (``frank image import``)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import click

from frank.cli.output import emit_json, json_option


@click.group()
def image() -> None:
    """Base images: bring a pinned one on a file, for machines with no path to its registry."""


@image.command("import")
@click.argument("source", type=click.Path(exists=True, path_type=Path))
@click.option("--image", "name", default=None, metavar="NAME",
              help="Only images/NAME.toml (default: every image file whose pin SOURCE holds).")
@json_option
def import_cmd(source: Path, name: str | None, as_json: bool) -> None:
    """Import SOURCE (an OCI layout folder, or a tar of one: `skopeo copy ... oci-archive:`,
    Docker 25+'s `docker save`) for each images/*.toml whose pinned digest it holds.

    Every blob is checked against its digest and the pinned one must be among them; the
    image is then kept where a pull would keep it, and no command asks the registry for it.
    """
    from frank.errors import FrankError
    from frank.image.importing import blob_digests, digests_in, import_pinned
    from frank.image.inventory import base_inventory, pulled_layout
    from frank.model.imagefile import load_image_file, parse_pinned_ref
    from frank.resolve.project import repo_root_for
    from frank.store.blobs import BlobStore

    root = repo_root_for()
    files = [root / "images" / f"{name}.toml"] if name else sorted(
        (root / "images").glob("*.toml"))
    pins = []
    for path in files:
        img = load_image_file(path)
        if img.ref is None:
            continue
        ref, digest = parse_pinned_ref(img.ref, file=path)
        if not ref.startswith("oci:"):
            pins.append((path, ref, digest))
    if not pins:
        raise FrankError("no image file here pins a registry image by digest",
                         field="--image" if name else None)
    store = BlobStore()
    done = []
    with tempfile.TemporaryDirectory(dir=store.tmp_dir, prefix="import-") as tmp:
        layout = digests_in(source, Path(tmp))
        held = blob_digests(layout)
        for path, ref, digest in pins:
            if digest not in held:
                continue
            out = pulled_layout(store, digest)
            target = import_pinned(layout, source, digest, out)
            base_inventory(out, target, store)  # read once now: every later command has it
            done.append({"file": str(path.relative_to(root)), "ref": ref, "digest": digest,
                         "image": target})
    if not done:
        wanted = ", ".join(f"{p.relative_to(root)} ({d[:19]}...)" for p, _, d in pins)
        raise FrankError(f"holds none of the pinned images: {wanted}", file=source)
    if as_json:
        emit_json({"imported": done})
        return
    for one in done:
        click.echo(f"{one['file']}: {one['ref']}@{one['digest']} imported from {source}; "
                   "kept by digest, used as if pulled")
