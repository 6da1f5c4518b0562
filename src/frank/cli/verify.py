"""``frank verify IMAGE_REF --key PUB``: check an image's signed SBOM and provenance."""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from frank.cli.output import emit_json, json_option
from frank.errors import FrankError

PUB_ENV = "FRANK_VERIFY_KEY"


@click.command()
@click.argument("image_ref", metavar="IMAGE_REF")
@click.option("--key", "key", type=click.Path(path_type=Path), default=None,
              help=f"The signer's public key, PEM (default: ${PUB_ENV}, else "
                   "frank keygen's ~/.config/frank/frank.pub).")
@json_option
def verify(image_ref: str, key: Path | None, as_json: bool) -> None:
    """Verify IMAGE_REF (HOST/NAME[:TAG|@DIGEST], or an OCI layout) against its lock.

    Reads the image's manifest, config and lock, its referrers (the referrers API, else the
    sha256-<digest> tag), checks each signature with the key, each subject against the image
    digest, and the SBOM and provenance against what the image's lock pins. Exit 0 when all
    hold; otherwise one line naming what differs, exit 1 (bad input: exit 2).
    """
    from frank.fsutil import find_repo_root
    from frank.ship.attest.check import verify_image
    from frank.ship.attest.dsse import load_public_key

    if key is None:
        from frank.cli.keygen import default_key

        if os.environ.get(PUB_ENV):
            key = Path(os.environ[PUB_ENV])
        elif default_key().with_suffix(".pub").is_file():
            key = default_key().with_suffix(".pub")
        else:
            raise FrankError(f"no public key: give --key PUB or set ${PUB_ENV} (or make "
                             f"{default_key().with_suffix('.pub')} with `frank keygen`)",
                             field="--key")
    public = load_public_key(key)
    try:
        root: Path | None = find_repo_root(Path.cwd())
    except FrankError:
        root = None
    result = verify_image(image_ref, public, str(key), root)
    warm = _warm_caches(image_ref, result.image, result.signed_as or result.image, public,
                        str(key))
    if as_json:
        emit_json({**asdict(result), "warm_caches": [asdict(w) for w in warm]})
        return
    click.echo(f"verified {image_ref}: image {result.image}, lock {result.lock}, signed by "
               f"{result.key} ({result.found})")
    click.echo(f"  SBOM {result.components} components, provenance {result.dependencies} "
               "resolved dependencies: as the image's lock pins them")
    for why in result.not_checked.values():
        click.echo(f"  not checked: {why}")
    for w in warm:
        click.echo(f"  warm cache {w.digest} for {w.made_on}: manifest and layer match their "
                   f"digests ({w.layer_size:,} bytes), unpacks inside its folder, signed by "
                   f"the key, names image {result.signed_as or result.image}")


def _warm_caches(ref: str, pushed: str, image: str, public: Any, key_name: str) -> list[Any]:
    """The warm caches pushed as referrers of the image (``frank.ship.warmremote``),
    checked, their signatures by the image's key too; none for a layout (its store's are
    checked by `frank run` before use)."""
    if Path(ref).is_dir():
        return []
    from frank.image.remote import repository_of
    from frank.ship.warmremote import verify as verify_warm

    return list(verify_warm(repository_of(ref), pushed, image, public, key_name))
