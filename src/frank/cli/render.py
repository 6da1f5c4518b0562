"""`frank render k8s STACK`: the lock as Kubernetes objects, every pin kept."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import click

from frank.cli.output import SECONDS


@click.group()
def render() -> None:
    """Render a stack's lock for a deployment system (objects, not a controller)."""


@render.command("k8s")
@click.argument("stack")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=None,
              help="Write one YAML file per object here (default: one stream on stdout).")
@click.option("--registry", default=None, metavar="HOST/REPO",
              help="Use the image pushed there (default: the latest push of this lock).")
@click.option("--namespace", default=None, help="metadata.namespace of every object.")
@click.option("--weights-size", default="200Gi", show_default=True,
              help="Size of the weights (hub cache) claim.")
@click.option("--storage-class", default=None, help="storageClassName of the weights claim.")
@click.option("--weights-claim", default=None,
              help="Use this existing claim for the weights instead of rendering one.")
@click.option("--offline-weights", is_flag=True,
              help="The claim already holds the weights: the init step only checks sha256.")
@click.option("--ready-timeout", type=SECONDS, default=1800.0, show_default=True,
              help="Seconds the startup probe allows the engine to answer /health.")
@click.option("--warm-cache", "warm_cache", default="auto", show_default=True,
              metavar="auto|none|DIGEST",
              help="The warm cache the pods mount: auto, the one `frank push` attached for "
                   "the target's device (none if none); none; or a pushed one's digest.")
@click.option("--kube-version", default=None, metavar="MAJOR.MINOR",
              help="The cluster's Kubernetes version: 1.35 and later mount the warm cache as "
                   "an image volume; earlier (or not given), an init step pulls it by digest.")
def k8s(stack: str, out_dir: Path | None, registry: str | None, namespace: str | None,
        weights_size: str, storage_class: str | None, weights_claim: str | None,
        offline_weights: bool, ready_timeout: float, warm_cache: str,
        kube_version: str | None) -> None:
    """Write STACK's objects: a Deployment (or, for target.nodes > 1, a LeaderWorkerSet), a
    Service and the weights claim, the image by the digest `frank push` recorded, and the
    warm cache pushed for the target's device (docs/warm-starts.md).

    Refused, in one line saying what to run, when the stack's current lock has no pushed
    image. Apply the directory with `kubectl apply -f DIR`, or commit it for Argo CD / Flux.
    """
    from frank.errors import FrankError
    from frank.image.remote import check_repository
    from frank.resolve.project import lock_stack, repo_root_for
    from frank.ship.pushes import pushed_image
    from frank.ship.render.files import render_files, report, write_dir
    from frank.ship.render.k8s import (
        ImageRef,
        RenderOptions,
        check_renderable,
        render_objects,
        stream,
    )
    from frank.ship.render.warm import choose as choose_warm
    from frank.ship.render.warm import kube_version as parse_version
    from frank.store.blobs import DIGEST_RE

    if registry is not None:
        try:
            check_repository(registry)
        except FrankError as exc:
            exc.field = "--registry"
            raise
    locked = lock_stack(stack)
    lock = locked.lock
    root = repo_root_for(locked.lock_file)
    opts = RenderOptions(namespace=namespace, weights_size=weights_size,
                         storage_class=storage_class, weights_claim=weights_claim,
                         ready_timeout=ready_timeout, offline_weights=offline_weights)
    check_renderable(lock, opts)
    parse_version(kube_version)
    if warm_cache not in ("auto", "none") and not DIGEST_RE.fullmatch(warm_cache):
        raise FrankError(f"{warm_cache!r} is not auto, none or a digest (sha256:...)",
                         field="--warm-cache")
    push = pushed_image(root, locked.lock_file.stem, lock.digest, registry)
    image = ImageRef(repository=push.repository, digest=push.digest)
    opts = replace(opts, warm=choose_warm(lock, push, warm_cache, kube_version))
    objects = render_objects(lock, image, opts)
    if out_dir is None:
        click.echo(stream(lock, objects), nl=False)
        return
    changed, removed = write_dir(out_dir, render_files(lock, objects))
    for line in report(out_dir, changed, removed):
        click.echo(line)
    if not changed and not removed:
        click.echo(f"{out_dir}: up to date ({image.reference})")
