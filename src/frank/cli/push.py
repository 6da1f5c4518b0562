"""``frank push STACK --to HOST/REPO``: push the stack's image by digest, tag it, push the
attestations ``frank attest`` attached to it as referrers, and record the push."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import click

from frank.errors import FrankError


@click.command()
@click.argument("stack")
@click.option("--to", "to", required=True, metavar="HOST/REPO", help="Repository to push to.")
@click.option("--layout", "layout", type=click.Path(path_type=Path), default=None,
              help="OCI layout of the composed image (default: out/<stack>/image).")
@click.option("--tag", "tags", multiple=True, help="Extra tag (repeatable).")
@click.option("--cosign-tag/--no-cosign-tag", "cosign", default=True, show_default=True,
              help="Also list the attestations under cosign's sha256-<digest>.att tag.")
def push(stack: str, to: str, layout: Path | None, tags: tuple[str, ...],
         cosign: bool) -> None:
    """Push STACK's image to HOST/REPO by digest, then tag it: stack name, lock-<digest>.

    Attestations in the layout (`frank attest`) follow as referrers: through the registry's
    referrers API where it has one, else listed under the tag sha256-<image digest hex>;
    and, for cosign, under its tag sha256-<image digest hex>.att. The push is recorded in
    out/pushes.jsonl (lock digest, repository, the registry's digest): `frank render k8s`
    deploys exactly that.
    """
    from frank.image.oci import read_layout
    from frank.image.remote import LOCK_DIGEST_KEY, default_tags, push_layout, tag_for_stack
    from frank.resolve.project import repo_root_for, stack_path
    from frank.ship.attest.layout import read_referrers
    from frank.ship.attest.remote import push_cosign_tag, push_referrers
    from frank.ship.pushes import PushRecord, record_push

    root = repo_root_for()
    if layout is None:
        layout = root / "out" / stack_path(stack, root).stem / "image"

    if not layout.is_dir():
        raise FrankError("no composed image here; run frank compose first", file=layout)
    from frank.audit.auditor import ensure_audited

    ensure_audited(layout, None, root, what="push it")
    all_tags = list(dict.fromkeys([*default_tags(layout, stack), *tags]))
    result = push_layout(layout, to, all_tags)
    info = read_layout(layout, verify_layers=False)
    lock_digest = info.annotations.get(LOCK_DIGEST_KEY) or info.labels.get(LOCK_DIGEST_KEY)
    if lock_digest:  # what `frank render k8s` deploys: the registry's digest of this lock
        record_push(root, PushRecord(stack=tag_for_stack(stack), lock_digest=lock_digest,
                                     repository=result.repository, digest=result.digest,
                                     tags=result.tags,
                                     time=dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")))
    click.echo(result.reference)
    for t in result.tags:
        click.echo(f"{result.repository}:{t}")
    referrers = read_referrers(layout, result.digest)
    if referrers:
        pushed = push_referrers(result.repository, result.digest, referrers)
        how = "referrers API" if pushed.scheme == "api" else \
            f"referrers tag {result.repository}:{pushed.tag}"
        for digest in pushed.digests:
            click.echo(f"{result.repository}@{digest} ({how})")
        if cosign:
            tag = push_cosign_tag(result.repository, result.digest, referrers)
            click.echo(f"{result.repository}:{tag} (cosign's attestation tag)")
