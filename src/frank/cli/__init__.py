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
    "debs": "frank.cli.debs:debs",
    "diff": "frank.cli.diff:diff",
    "inspect": "frank.cli.inspect:inspect_cmd",
    "lock": "frank.cli.lock:lock",
    "parts": "frank.cli.parts:parts",
    "pin": "frank.cli.pin:pin",
    "push": "frank.cli.push:push",
    "render": "frank.cli.render:render",
    "revert": "frank.cli.revert:revert",
    "run": "frank.cli.run:run_cmd",
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


# click >= 8.2 raises this for a group run without a command (its message is the help).
NO_ARGS_IS_HELP: type[click.ClickException] = getattr(
    click.exceptions, "NoArgsIsHelpError", type("NeverRaised", (click.ClickException,), {}))


def usage_line(exc: click.ClickException) -> str:
    """A click usage error (unknown option, bad choice, missing argument) as one line that
    names the command and points at its help, like every other bad input."""
    message = " ".join(exc.format_message().split())
    ctx = getattr(exc, "ctx", None)
    if ctx is None:
        return f"frank: error: {message}"
    return f"frank: error: {ctx.command_path}: {message} (see '{ctx.command_path} --help')"


def main() -> None:
    """Entry point: run the CLI; FrankError or a usage error becomes one line on stderr and
    exit 2, without a traceback."""
    try:
        code = cli.main(prog_name="frank", standalone_mode=False)
    except FrankError as exc:  # raised outside a command's invoke
        click.echo(f"frank: error: {exc.one_line()}", err=True)
        sys.exit(exc.exit_code)
    except NO_ARGS_IS_HELP as exc:  # plain `frank`: the help is the answer, as click gives it
        click.echo(exc.format_message(), err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:  # UsageError, BadParameter, NoSuchOption, ...
        click.echo(usage_line(exc), err=True)
        sys.exit(exc.exit_code)
    except click.Abort:
        click.echo("frank: aborted", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
