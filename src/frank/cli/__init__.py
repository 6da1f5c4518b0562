"""frank's command line: one module per command, one place that turns errors into one line.

Command modules are imported lazily (by name) so that `frank lock --check` and `frank diff`
start without importing rich, the image builders or huggingface-hub.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import click

from frank.errors import FrankError

# command name -> "module:attribute"; each module holds one click command.
COMMANDS: dict[str, str] = {
    "check": "frank.cli.check:check",
    "compose": "frank.cli.compose:compose",
    "diff": "frank.cli.diff:diff",
    "inspect": "frank.cli.inspect:inspect_cmd",
    "lock": "frank.cli.lock:lock",
    "parts": "frank.cli.parts:parts",
    "pin": "frank.cli.pin:pin",
    "push": "frank.cli.push:push",
    "revert": "frank.cli.revert:revert",
    "serve": "frank.cli.serve:serve",
    "show": "frank.cli.show:show",
    "trial": "frank.cli.trial:trial",
}


class LazyGroup(click.Group):
    """A click group that imports a command's module only when that command runs."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                return None  # command not built yet
            raise
        command: click.Command = getattr(module, attr)
        return command

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except FrankError as exc:
            click.echo(f"frank: error: {exc.one_line()}", err=True)
            ctx.exit(exc.exit_code)
        except OSError as exc:  # a disk or permission problem: say which file, no traceback
            if os.environ.get("FRANK_DEBUG"):
                raise
            where = f"{exc.filename}: " if exc.filename else ""
            click.echo(f"frank: error: {where}{exc.strerror or exc}", err=True)
            ctx.exit(2)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="frank")
def cli() -> None:
    """Declarative build-and-deploy for LLM engine variants."""


def main() -> None:
    """Entry point: run the CLI; FrankError becomes one line on stderr and exit 2."""
    try:
        cli.main(prog_name="frank", standalone_mode=True)
    except FrankError as exc:  # raised outside a command's invoke
        click.echo(f"frank: error: {exc.one_line()}", err=True)
        sys.exit(exc.exit_code)
