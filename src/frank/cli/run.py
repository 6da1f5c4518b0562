"""``frank run STACK_OR_LAYOUT [-- ARGS]``: serve a built image, checked blob by blob first.

Why not ``frank serve``: serve runs the host's engine; run starts the image compose built,
so what serves is exactly what the image's lock says. A stack names its image
(``out/<stack>/image``), which must carry the stack's current lock digest; an image whose
blobs do not match their digests is refused before any engine is asked to run it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import cast

import click

from frank.build.engines import Engine, EngineName
from frank.cli.output import SECONDS, json_option
from frank.cli.targets import built_image
from frank.errors import FrankError

_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _env_pairs(pairs: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not _ENV_KEY.fullmatch(key):
            raise FrankError(f"{pair!r} is not KEY=VALUE", field="--env")
        out[key] = value
    return out


def _engine(name: str, print_only: bool) -> Engine:
    """The engine to run with; ``--print --engine NAME`` also shows an engine not here."""
    from frank.build.engines import _runroot, detect, get_engine
    from frank.store.blobs import BlobStore

    if name == "auto" or not print_only:
        return get_engine(name)
    found = next((e for e in detect() if e.name == name), None)
    if found is not None:
        return found
    root = BlobStore().root / "containers" / name
    return Engine(cast(EngineName, name), shutil.which(name) or name, root, _runroot(root))


@click.command("run")
@click.argument("target", metavar="STACK_OR_LAYOUT")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.option("--engine", "engine_name", default="auto", show_default=True,
              type=click.Choice(["auto", "buildah", "podman", "docker"]),
              help="Container engine; auto: the first found (buildah, podman, docker).")
@click.option("--hub-cache", type=click.Path(path_type=Path), default=None,
              help="Host hub cache to mount (default: HF_HUB_CACHE / HF_HOME, the stack's "
                   "env over yours).")
@click.option("--model-dir", type=click.Path(path_type=Path), default=None,
              help="A folder holding the weights' files, mounted instead of a hub cache.")
@click.option("--env", "env_pairs", multiple=True, metavar="KEY=VALUE",
              help="Extra environment for the container (the lock's env still wins).")
@click.option("--wait-ready", type=SECONDS, default=600.0, show_default=True,
              help="Seconds to wait for /health to answer 200.")
@click.option("--shm-size", default="1g", show_default=True, metavar="SIZE",
              help="Size of the container's /dev/shm (docker; buildah shares the host's).")
@click.option("--ipc", default="private", show_default=True,
              type=click.Choice(["private", "shareable", "host"]),
              help="IPC namespace of the container (docker).")
@click.option("--print", "print_only", is_flag=True,
              help="Show the exact container commands; run nothing.")
@json_option
def run_cmd(target: str, args: tuple[str, ...], engine_name: str, hub_cache: Path | None,
            model_dir: Path | None, env_pairs: tuple[str, ...], wait_ready: float,
            shm_size: str, ipc: str, print_only: bool, as_json: bool) -> None:
    """Run the image of STACK_OR_LAYOUT; ARGS after `--` go to its entrypoint."""
    from frank.image.verify import image_lock, verify_layout
    from frank.run import container as image_run

    extra_env = _env_pairs(env_pairs)
    layout, locked = built_image(target)
    stack_digest, stack = (locked.lock.digest, target) if locked else (None, None)
    image = verify_layout(layout)
    if stack_digest is not None and image.lock_digest != stack_digest:
        raise FrankError(f"the image was built from lock {image.lock_digest}, the stack's lock "
                         f"is now {stack_digest} (run `frank compose {stack}`)", file=layout)
    from frank.audit.auditor import ensure_audited, stack_lock
    from frank.resolve.project import repo_root_for

    root = repo_root_for(Path(stack)) if stack and stack.endswith(".toml") \
        else repo_root_for(None)
    # against the stack's lock in the repo, never the image's own (issue 53)
    ensure_audited(layout, locked.lock if locked else stack_lock(layout, root), root,
                   what="run it")
    lock = image_lock(image)
    engine = _engine(engine_name, print_only)
    weights = image_run.weights(lock, hub_cache=hub_cache, model_dir=model_dir,
                                env=dict(os.environ))
    if not re.fullmatch(r"[0-9]+[bkmg]?", shm_size):
        raise FrankError(f"{shm_size!r} is not a size (like 512m or 2g)", field="--shm-size")
    plan = image_run.plan(image, lock, engine, w=weights, extra_env=extra_env, args=list(args),
                          shm_size=shm_size, ipc=ipc)
    if print_only:
        click.echo(json.dumps(plan.as_json(), indent=2) if as_json else plan.as_text())
        return
    # with the launcher's own arguments (--print...) the weights' files may not be needed
    image_run.check_weights(lock, weights, files=not args)
    from frank.run.supervise import execute

    sys.exit(execute(plan, wait_ready))
