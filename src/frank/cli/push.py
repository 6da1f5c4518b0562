"""``frank push STACK --to HOST/REPO``: push the stack's image by digest, tag it, push the
attestations ``frank attest`` attached to it as referrers, and record the push.

The image goes out compressed by default (``--compression zstd``; ``gzip`` for Docker before
23; ``none`` sends the layout as it is): the same config and diff_ids, a pinned compressor,
so the pushed digest is the same from any machine (``frank.image.compress``)."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import TYPE_CHECKING, cast

import click

from frank.errors import FrankError

if TYPE_CHECKING:
    from frank.ship.pushes import PushedWarmCache


def registry_message(body: bytes) -> str:
    """The registry's own words from an error body (``{"errors": [{"message": ...}]}``)."""
    import json

    try:
        errors = json.loads(body).get("errors") or []
        return "; ".join(str(e.get("message", "")) for e in errors if isinstance(e, dict))
    except (ValueError, AttributeError):
        return ""


def progress(line: str) -> None:
    """A plain progress line on stderr (a terminal or a log alike)."""
    click.echo(f"frank: {line}", err=True)


@click.command()
@click.argument("stack")
@click.option("--to", "to", required=True, metavar="HOST/REPO", help="Repository to push to.")
@click.option("--layout", "layout", type=click.Path(path_type=Path), default=None,
              help="OCI layout of the composed image (default: out/<stack>/image).")
@click.option("--tag", "tags", multiple=True, help="Extra tag (repeatable).")
@click.option("--cosign-tag/--no-cosign-tag", "cosign", default=True, show_default=True,
              help="Also list the attestations under cosign's sha256-<digest>.att tag.")
@click.option("--compression", type=click.Choice(["zstd", "gzip", "none"]), default="zstd",
              show_default=True,
              help="Layer compression on the wire: zstd (containerd >= 1.5, Docker >= 23, "
                   "podman), gzip (any client), none (the layout's own uncompressed layers).")
@click.option("--trust-cache", is_flag=True,
              help="Skip release mode's check (the image made again from the lock's pins "
                   "in a scratch store, docs/trust.md): trust what the cache built.")
def push(stack: str, to: str, layout: Path | None, tags: tuple[str, ...],
         cosign: bool, compression: str, trust_cache: bool) -> None:
    """Push STACK's image to HOST/REPO by digest, then tag it: stack name, lock-<digest>.

    Attestations in the layout (`frank attest`) follow as referrers: through the registry's
    referrers API where it has one, else listed under the tag sha256-<image digest hex>;
    and, for cosign, under its tag sha256-<image digest hex>.att. The push is recorded in
    out/pushes.jsonl (lock digest, repository, the registry's digest): `frank render k8s`
    deploys exactly that.
    """
    from frank.resolve.project import repo_root_for, stack_path

    root = repo_root_for()
    if layout is None:
        layout = root / "out" / stack_path(stack, root).stem / "image"

    if not layout.is_dir():
        raise FrankError("no composed image here; run frank compose first", file=layout)
    from frank.audit.auditor import ensure_audited
    from frank.resolve.project import lock_stack

    # against the stack's lock in the repo, never the image's own or an audit.json (issue 53)
    lock = lock_stack(stack).lock
    ensure_audited(layout, lock, root, what="push it", release=not trust_cache)
    if not trust_cache:  # release mode: only what the lock pins (docs/trust.md)
        from frank.audit.release import derive_and_check

        derive_and_check(layout, lock, root, what="push it")
    send(root, stack, layout, to, tags, cosign, compression)


def send(root: Path, stack: str, layout: Path, to: str, tags: tuple[str, ...], cosign: bool,
         compression: str) -> None:
    """Push a layout already held to its stack's lock (``push`` checks it first), read it
    back, attach its referrers and record the push."""
    from frank.image.compress import Compression, image_form
    from frank.image.oci import OCI_MANIFEST, read_layout, resolve_manifest
    from frank.image.remote import (
        LOCK_DIGEST_KEY,
        check_repository,
        default_tags,
        push_layout,
        tag_for_stack,
    )
    from frank.ship.attest.layout import about, read_referrers
    from frank.ship.attest.remote import Registry, push_cosign_tag, push_referrers
    from frank.ship.pushes import PushRecord, record_push
    from frank.store.blobs import BlobStore

    all_tags = list(dict.fromkeys([*default_tags(layout, stack), *tags]))
    check_repository(to)
    if compression != "none":  # before minutes of compression, a registry not there: one line
        reg = Registry(to.split("/", 1)[0])
        try:
            status, _, body = reg.request("GET", reg.url("/v2/"))
        except FrankError as exc:
            raise FrankError(f"push to {to} failed: {exc.message}") from None
        if status == 401:
            raise FrankError(f"push to {to} failed: the registry asks for a login and has "
                             f"none from you ({registry_message(body) or 'HTTP 401'}): log in "
                             "(`skopeo login`), or run a registry without auth "
                             "(docs/concepts/image.md: a local registry)")
    start = time.monotonic()
    form = image_form(layout, cast(Compression, compression),
                      BlobStore().root / "compressed", progress=progress)
    if form.compression != "none":
        progress(f"{form.compression} form {form.digest}: {form.compressed_bytes:,} bytes of "
                 f"layers for {form.uncompressed_bytes:,} ({form.layers_compressed} layers "
                 f"compressed now, {time.monotonic() - start:.1f} s, {form.compressor})")
    result = push_layout(layout, to, all_tags, form=form)
    info = read_layout(layout, verify_layers=False)
    lock_digest = info.annotations.get(LOCK_DIGEST_KEY) or info.labels.get(LOCK_DIGEST_KEY)
    click.echo(result.reference)
    for t in result.tags:
        click.echo(f"{result.repository}:{t}")
    image_digest = resolve_manifest(layout)[0]
    referrers = read_referrers(layout, image_digest)
    if referrers and result.digest != image_digest:  # the envelopes name the layout's digest
        subject = {"mediaType": OCI_MANIFEST, "digest": form.digest, "size": len(form.manifest)}
        referrers = [about(r, subject) for r in referrers]
    if referrers:
        pushed = push_referrers(result.repository, result.digest, referrers)
        how = "referrers API" if pushed.scheme == "api" else \
            f"referrers tag {result.repository}:{pushed.tag}"
        for digest in pushed.digests:
            click.echo(f"{result.repository}@{digest} ({how})")
        if cosign:
            tag = push_cosign_tag(result.repository, result.digest, referrers)
            click.echo(f"{result.repository}:{tag} (cosign's attestation tag)")
    warm = push_warm_caches(layout, result.repository, result.digest, image_digest,
                            form.manifest if form.digest == result.digest else None)
    if lock_digest:  # recorded once every part is pushed and read back: what `frank render
        # k8s` deploys (the registry's digest of this lock) and `frank verify` checks
        record_push(root, PushRecord(stack=tag_for_stack(stack), lock_digest=lock_digest,
                                     repository=result.repository, digest=result.digest,
                                     tags=result.tags, compression=form.compression,
                                     image=image_digest, warm_caches=warm,
                                     time=dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")))


def push_warm_caches(layout: Path, repository: str, pushed: str, image: str,
                     manifest: bytes | None) -> list[PushedWarmCache]:
    """Attach the warm caches of the layout's image (``frank warm``) as referrers of the
    pushed manifest (``frank.ship.warmremote``); one line each. What was pushed, for the
    push record (`frank render k8s` mounts one)."""
    from frank.image.oci import OCI_MANIFEST, resolve_manifest
    from frank.ship.pushes import PushedWarmCache
    from frank.ship.warmremote import push as push_warm
    from frank.store.blobs import BlobStore

    size = len(manifest) if manifest is not None else len(resolve_manifest(layout, image)[1])
    subject = {"mediaType": OCI_MANIFEST, "digest": pushed, "size": size}
    out = []
    for w in push_warm(BlobStore(), repository, image, subject):
        how = "referrers API" if w.scheme == "api" else "referrers tag"
        click.echo(f"{repository}@{w.digest} (warm cache for {w.made_on}; {how})")
        out.append(PushedWarmCache(digest=w.digest, layer=w.layer, device=w.identity,
                                   made_on=w.made_on))
    return out
