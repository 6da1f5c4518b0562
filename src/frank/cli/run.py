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
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from frank.cli.output import SECONDS, json_option
from frank.cli.starting import engine_for, runnable
from frank.errors import FrankError

if TYPE_CHECKING:
    pass

_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _env_pairs(pairs: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not _ENV_KEY.fullmatch(key):
            raise FrankError(f"{pair!r} is not KEY=VALUE", field="--env")
        out[key] = value
    return out


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
@click.option("--no-warm-cache", is_flag=True,
              help="Start cold: every engine cache in an empty folder, no warm cache used.")
@click.option("--print", "print_only", is_flag=True,
              help="Show the exact container commands; run nothing.")
@json_option
def run_cmd(target: str, args: tuple[str, ...], engine_name: str, hub_cache: Path | None,
            model_dir: Path | None, env_pairs: tuple[str, ...], wait_ready: float,
            shm_size: str, ipc: str, no_warm_cache: bool, print_only: bool,
            as_json: bool) -> None:
    """Run the image of STACK_OR_LAYOUT; ARGS after `--` go to its entrypoint."""
    from frank.run import container as image_run

    extra_env = _env_pairs(env_pairs)
    image, lock = runnable(target)
    engine = engine_for(engine_name, print_only)
    weights = image_run.weights(lock, hub_cache=hub_cache, model_dir=model_dir,
                                env=dict(os.environ))
    if not re.fullmatch(r"[0-9]+[bkmg]?", shm_size):
        raise FrankError(f"{shm_size!r} is not a size (like 512m or 2g)", field="--shm-size")
    if print_only:
        plan = image_run.plan(image, lock, engine, w=weights, extra_env=extra_env,
                              args=list(args), shm_size=shm_size, ipc=ipc)
        click.echo(json.dumps(plan.as_json(), indent=2) if as_json else plan.as_text())
        return
    # with the launcher's own arguments (--print...) the weights' files may not be needed
    image_run.check_weights(lock, weights, files=not args)
    from frank.cli.warm import warm_for_run
    from frank.run.supervise import execute

    with warm_for_run(image, lock, cold=no_warm_cache, serve=not args) as warm:
        plan = image_run.plan(image, lock, engine, w=weights, extra_env=extra_env,
                              args=list(args), shm_size=shm_size, ipc=ipc, warm_dir=warm.host,
                              warm_env=warm.env, warm_note=warm.note)
        code = execute(plan, wait_ready)
    sys.exit(code)
