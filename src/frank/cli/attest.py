"""``frank attest STACK|LAYOUT --key KEY``: sign the image's SBOM and provenance, attach them."""

from __future__ import annotations

import os
from pathlib import Path

import click

from frank.cli.output import emit_json, json_option
from frank.errors import FrankError

KEY_ENV = "FRANK_SIGNING_KEY"


def layout_and_root(target: str) -> tuple[Path, Path | None, str | None]:
    """(layout, repo root or None, the stack's current lock digest) for a stack or layout."""
    from frank.cli.targets import built_image
    from frank.fsutil import find_repo_root

    layout, locked = built_image(target)
    stack_digest = locked.lock.digest if locked else None
    try:
        root: Path | None = find_repo_root(Path.cwd())
    except FrankError:
        root = None
    return layout, root, stack_digest


@click.command()
@click.argument("target", metavar="STACK|LAYOUT")
@click.option("--key", "key", type=click.Path(path_type=Path), default=None,
              help=f"ECDSA P-256 private key, PEM (default: ${KEY_ENV}, else frank keygen's "
                   "~/.config/frank/frank.key; an encrypted key's passphrase comes from "
                   "$FRANK_KEY_PASSWORD).")
@click.option("--out", "out", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Also write manifest.json, sbom.cdx.json, provenance.json and the two "
                   "*.dsse.json envelopes here (for cosign, scanners, people).")
@click.option("--trust-cache", is_flag=True,
              help="Skip release mode's check (the image made again from the lock's pins "
                   "in a scratch store, docs/trust.md): trust what the cache built.")
@json_option
def attest(target: str, key: Path | None, out: Path | None, trust_cache: bool,
           as_json: bool) -> None:
    """Write STACK's (or LAYOUT's) SBOM and SLSA provenance, signed, as OCI referrers.

    Nothing in the image changes (its digest stays); the attestations are listed in the
    layout's index.json, each an artifact whose subject is the image manifest.
    """
    from frank.ship.attest.check import attest_layout
    from frank.ship.attest.dsse import load_private_key

    if key is None:
        from frank.cli.keygen import default_key

        if os.environ.get(KEY_ENV):
            key = Path(os.environ[KEY_ENV])
        elif default_key().is_file():
            key = default_key()
        else:
            raise FrankError(f"no signing key: give --key KEY or set ${KEY_ENV} "
                             f"(or make {default_key()} with `frank keygen`)", field="--key")
    private = load_private_key(key)
    layout, root, stack_digest = layout_and_root(target)
    if not trust_cache and root is not None:  # release mode: only what the lock pins
        from frank.audit.auditor import stack_lock
        from frank.audit.release import derive_and_check

        lock = stack_lock(layout, root)
        if stack_digest is None or lock.digest == stack_digest:  # else: refused as stale
            derive_and_check(layout, lock, root, what="attest it")
    summary = attest_layout(layout, private, root, out, stack=target, stack_digest=stack_digest)
    summary["warm_caches_signed"] = _sign_warm_caches(summary["image"], private)
    if as_json:
        emit_json(summary)
        return
    click.echo(f"{summary['image']} (lock {summary['lock']})")
    for what, digest in summary["referrers"].items():
        click.echo(f"  {what:10s} {digest}")
    click.echo(f"  {summary['components']} components, signed by {summary['key']}")
    for why in summary["not_listed"].values():
        click.echo(f"  not listed: {why}")
    for digest in summary["warm_caches_signed"]:
        click.echo(f"  warm cache {digest} signed")


def _sign_warm_caches(image: str, private: object) -> list[str]:
    """Sign the store's warm caches of the image (``frank.ship.warmsign``): an attested
    image's warm caches are used by `frank run` only when signed by its key."""
    from frank.run import warmcache
    from frank.ship.warmsign import sign_into
    from frank.store.blobs import BlobStore

    store = BlobStore()
    signed = []
    for digest in warmcache.listed(store.root, image).values():
        try:
            artifact = warmcache.read(store, digest)
        except FrankError:
            continue  # a damaged one stays unsigned: `frank run` refuses it anyway
        sign_into(store.root, artifact, private)
        signed.append(digest)
    return signed
