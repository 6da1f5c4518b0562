"""frank's command line: one module per command, one place that turns errors into one line.

Command modules are imported lazily (by name) so that `frank lock --check` and `frank diff`
start without importing rich, the image builders or huggingface-hub.

May import: every stage (it is the last one).
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import click

from frank.errors import NESTED_TOO_DEEP, FrankError

# command name -> "module:attribute"; each module holds one click command.
COMMANDS: dict[str, str] = {
    "attest": "frank.cli.attest:attest",
    "audit": "frank.cli.audit:audit",
    "check": "frank.cli.check:check",
    "compose": "frank.cli.compose:compose",
    "debs": "frank.cli.debs:debs",
    "diff": "frank.cli.diff:diff",
    "gc": "frank.cli.gc:gc",
    "image": "frank.cli.image:image",
    "inspect": "frank.cli.inspect:inspect_cmd",
    "keygen": "frank.cli.keygen:keygen",
    "lock": "frank.cli.lock:lock",
    "parts": "frank.cli.parts:parts",
    "pin": "frank.cli.pin:pin",
    "push": "frank.cli.push:push",
    "render": "frank.cli.render:render",
    "revert": "frank.cli.revert:revert",
    "run": "frank.cli.run:run_cmd",
    "schema": "frank.cli.schema:schema",
    "serve": "frank.cli.serve:serve",
    "show": "frank.cli.show:show",
    "trial": "frank.cli.trial:trial",
    "verify": "frank.cli.verify:verify",
    "warm": "frank.cli.warm:warm",
}


# command name -> the first paragraph of its help, for `frank --help` without importing
# every command (tests/test_spine_startup.py keeps it equal to each command's own help).
SUMMARIES: dict[str, str] = {
    "attest": "Write STACK's (or LAYOUT's) SBOM and SLSA provenance, signed, as OCI referrers.",
    "audit": "Check the image of IMAGE|STACK against its lock: files, distributions, GPU code.",
    "check": "Validate all parts/ manifests and resolve all stacks/ (writes nothing); a parked "
             "or rejected part in any stack is refused.",
    "compose": "Resolve STACK, lock it, plan its layers, write the build context, build the "
               "image.",
    "debs": "Bases made from Debian packages pinned by version and sha256.",
    "diff": "Show what differs between A and B (stack names, stack paths or .lock files).",
    "gc": "Remove cached blobs, bases, step outputs and clones nothing here references.",
    "image": "Base images: bring a pinned one on a file, for machines with no path to its "
             "registry.",
    "inspect": "Show the image at IMAGE (an OCI layout directory or "
               "HOST/REPO[:TAG|@DIGEST]).",
    "keygen": "Write a new signing key pair: OUT (private) and OUT with .pub (public).",
    "lock": "Resolve STACKS (default: all) and write STACK.lock (and pylock.STACK.toml) "
            "beside each.",
    "parts": "List part manifests: name, version, kind, status, summary.",
    "pin": "Resolve PART@VERSION's tag/branch/release into a content pin in its manifest.",
    "push": "Push STACK's image to HOST/REPO by digest, then tag it: stack name, "
            "lock-<digest>.",
    "render": "Render a stack's lock for a deployment system (objects, not a controller).",
    "revert": "Take PART one step back in STACK: remove it or return it to its earlier "
              "version.",
    "run": "Run the image of STACK_OR_LAYOUT; ARGS after `--` go to its entrypoint.",
    "schema": "Write schemas/ from the models and name each part's, stack's and base "
              "image's schema on its first line (#:schema).",
    "verify": "Verify IMAGE_REF (HOST/NAME[:TAG|@DIGEST], or an OCI layout) against its lock.",
    "serve": "Fetch and verify the weights, then run the engine as the lock says.",
    "show": "Show PART (every version) or PART@VERSION.",
    "trial": "A part goes in only through a test whose rule was written before it ran.",
    "warm": "Start STACK_OR_LAYOUT's image with empty engine caches, send a short workload, "
            "stop it, and keep the caches as a warm artifact for this image and this device.",
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

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list of `frank --help`, from SUMMARIES: as click writes it, without
        importing every command's module (and its dependencies) to read one line."""
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(n) for n in names)
        rows = [(n, click.Command(n, help=SUMMARIES[n]).get_short_help_str(limit))
                for n in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except FrankError as exc:
            click.echo(f"frank: error: {exc.one_line()}", err=True)
            ctx.exit(exc.exit_code)
        except RecursionError:  # a file nested deeper than a reader along the way copes with
            if os.environ.get("FRANK_DEBUG"):
                raise
            click.echo(f"frank: error: {NESTED_TOO_DEEP}", err=True)
            ctx.exit(2)
        except BrokenPipeError:  # `frank diff a b | head`: the reader has all it wanted
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())  # so exiting does not flush into the pipe
            ctx.exit(141)  # as a shell reports a program ended by SIGPIPE
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
