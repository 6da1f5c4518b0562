"""``frank warm STACK_OR_LAYOUT``: make the image's warm cache on this machine (see
``frank.run.warm``), and the lookup ``frank run`` does before it starts (``warm_for_run``).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from frank.cli.output import SECONDS, emit_json, json_option
from frank.errors import FrankError

if TYPE_CHECKING:
    from frank.image.verify import VerifiedImage
    from frank.run.warmuse import WarmUse


def _gpus(lock: dict[str, Any]) -> int:
    return int((lock.get("target") or {}).get("gpus", 0) or 0)


def _pushes(image: str) -> list[tuple[str, str]]:
    """(repository, pushed digest) of every recorded push of layout digest ``image``."""
    from frank.resolve.project import repo_root_for
    from frank.ship.pushes import read_pushes

    try:
        records = read_pushes(repo_root_for(None))
    except FrankError:
        return []
    seen = []
    for p in reversed(records):
        if (p.image or p.digest) == image and (p.repository, p.digest) not in seen:
            seen.append((p.repository, p.digest))
    return seen


def _key(env: str, default: Path) -> Path | None:
    if os.environ.get(env):
        return Path(os.environ[env])
    return default if default.is_file() else None


def _signing_key(given: Path | None) -> Path | None:
    """``--key``, else ``$FRANK_SIGNING_KEY``, else frank keygen's ``frank.key`` if any."""
    from frank.cli.attest import KEY_ENV
    from frank.cli.keygen import default_key

    return given or _key(KEY_ENV, default_key())


@contextlib.contextmanager
def warm_for_run(image: VerifiedImage, lock: dict[str, Any], *, cold: bool,
                 serve: bool = True) -> Iterator[WarmUse]:
    """The warm cache ``frank run`` gives the engine: the store's for this device, else one
    pulled from a registry the image was pushed to (``frank.ship.warmremote``). None for a
    one-off run of the entrypoint (``serve`` False: ARGS after ``--``)."""
    from frank.run import warmcache, warmuse
    from frank.run.device import this_device
    from frank.store.blobs import BlobStore

    if not serve:
        yield warmuse.WarmUse()
        return
    store = BlobStore()
    device = this_device(_gpus(lock))
    pulled_note = ""
    if not cold and device is not None and \
            device.key not in warmcache.listed(store.root, image.digest):
        pushes = _pushes(image.digest)
        if pushes:
            from frank.ship.warmremote import pulled

            found, pulled_note = pulled(store, pushes, image.digest, device)
            if found is not None:
                print(f"frank: warm cache {found.digest} {pulled_note}", file=sys.stderr,
                      flush=True)
    from frank.ship import warmsign

    check = warmsign.run_check(store.root, Path(image.layout), image.digest,
                               warmsign.public_key_path())
    with warmuse.attached(store, image.digest, _gpus(lock), cold=cold, check=check) as use:
        if use.artifact is None and pulled_note:
            use.note += f" (registry: {pulled_note})"
        elif use.artifact is not None and check is not None:
            use.note += "; its signature holds"
        yield use


@click.command("warm")
@click.argument("target", metavar="STACK_OR_LAYOUT")
@click.option("--engine", "engine_name", default="auto", show_default=True,
              type=click.Choice(["auto", "buildah", "podman", "docker"]),
              help="Container engine; auto: the first found (buildah, podman, docker).")
@click.option("--hub-cache", type=click.Path(path_type=Path), default=None,
              help="Host hub cache to mount (as for `frank run`).")
@click.option("--model-dir", type=click.Path(path_type=Path), default=None,
              help="A folder holding the weights' files, mounted instead of a hub cache.")
@click.option("--wait-ready", type=SECONDS, default=900.0, show_default=True,
              help="Seconds to wait for /health to answer 200.")
@click.option("--requests", "prompts", default=None, metavar="WORDS,...",
              help="The workload: one chat request per prompt length (in words, capped at a "
              "quarter of max-model-len); default: the stack's [warm] prompts, else 8,128,512.")
@click.option("--max-tokens", default=None, type=click.IntRange(1, 4096),
              help="Tokens each request generates; default: the stack's [warm] max_tokens, "
              "else 16.")
@click.option("--key", "key", type=click.Path(path_type=Path), default=None,
              help="Where the image is attested: the signing key of its attestations "
                   "(default: $FRANK_SIGNING_KEY, else frank keygen's frank.key); the warm "
                   "cache is signed with it, and `frank run` uses only a signed one there.")
@json_option
def warm(target: str, engine_name: str, hub_cache: Path | None, model_dir: Path | None,
         wait_ready: float, prompts: str | None, max_tokens: int | None, key: Path | None,
         as_json: bool) -> None:
    """Start STACK_OR_LAYOUT's image with empty engine caches, send a short workload, stop it,
    and keep the caches as a warm artifact for this image and this device."""
    from frank.cli.starting import engine_for, runnable
    from frank.run import container as image_run
    from frank.run import warm as warming
    from frank.run import warmcache
    from frank.run.device import this_device
    from frank.store.blobs import BlobStore

    lengths = _lengths(prompts)
    image, lock = runnable(target, what="warm it")
    workload = _workload(target, lengths, max_tokens)
    device = this_device(_gpus(lock))
    if device is None:
        raise FrankError(f"the image's lock wants {_gpus(lock)} GPUs and nvidia-smi lists "
                         "fewer: a warm cache is made on the device it is for")
    signer = _signer_for(image, key)  # before the engine starts: a refusal costs nothing
    engine = engine_for(engine_name, False)
    weights = image_run.weights(lock, hub_cache=hub_cache, model_dir=model_dir,
                                env=dict(os.environ))
    image_run.check_weights(lock, weights, files=True)

    def plan_for(folder: Path) -> image_run.RunPlan:
        return image_run.plan(image, lock, engine, w=weights, extra_env={}, args=[],
                              warm_dir=folder, warm_env=warmcache.engine_env(),
                              warm_note=f"making the warm cache for {device.describe()}")

    artifact, times = warming.make(image, lock, device, BlobStore(), plan_for,
                                   workload=workload,
                                   ready_timeout=wait_ready)
    signed = ""
    if signer is not None:
        from frank.ship.attest.dsse import key_id
        from frank.ship.warmsign import sign_into

        sign_into(BlobStore().root, artifact, signer)
        signed = key_id(signer.public_key())
    out = {"artifact": artifact.digest, "image": image.digest, "layer": artifact.layer,
           "layer_size": artifact.layer_size, "device": artifact.device.as_json(),
           "device_key": artifact.device.key, "made_on": artifact.made_on, "signed_by": signed,
           "workload": workload.as_json(),
           **times}
    if as_json:
        emit_json(out)
        return
    click.echo(f"warm cache {artifact.digest} for image {image.digest} on {artifact.made_on}: "
               f"{artifact.layer_size} bytes (ready {times['ready_s']:.1f} s, "
               f"{int(times['requests'])} requests {times['workload_s']:.1f} s, "
               f"packed {times['pack_s']:.1f} s)" + (f", signed by {signed}" if signed else ""))


def _lengths(prompts: str | None) -> tuple[int, ...] | None:
    if prompts is None:
        return None
    try:
        lengths = tuple(int(x) for x in prompts.split(","))
        if not lengths or min(lengths) < 1:
            raise ValueError
    except ValueError:
        raise FrankError(f"{prompts!r} is not a list of word counts like 8,128,512",
                         field="--requests") from None
    return lengths


def _workload(target: str, lengths: tuple[int, ...] | None, max_tokens: int | None) -> Any:
    """The options over the stack's ``[warm]`` over the default (a layout has no stack)."""
    from frank.cli.targets import built_image
    from frank.run.warm import Workload

    _, locked = built_image(target)
    return Workload.of(locked.resolved.stack.warm if locked is not None else None,
                       prompts=lengths, max_tokens=max_tokens)


def _signer_for(image: VerifiedImage, given: Path | None) -> Any:
    """The private key to sign the warm cache with where the image is attested (None where
    it is not); refused in one line when there is none or it did not sign the image."""
    from frank.ship.attest.dsse import key_id, load_private_key
    from frank.ship.warmsign import image_signers

    signers = image_signers(Path(image.layout), image.digest)
    if signers is None:
        return None
    path = _signing_key(given)
    if path is None:
        raise FrankError("the image is attested, so its warm cache must be signed: give "
                         "--key KEY (or set $FRANK_SIGNING_KEY)", field="--key")
    private = load_private_key(path)
    kid = key_id(private.public_key())
    known = {k for k in signers if k}
    if known and kid not in known:
        raise FrankError(f"{path} ({kid}) did not sign the image's attestations "
                         f"({', '.join(sorted(known))})", field="--key")
    return private
