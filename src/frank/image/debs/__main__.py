"""``python -m frank.image.debs lock|build IMAGE``: the ``frank debs`` commands, standalone."""

import sys

import click

from frank.cli.debs import debs
from frank.errors import FrankError

try:
    debs.main(sys.argv[1:], prog_name="python -m frank.image.debs", standalone_mode=False)
except FrankError as exc:
    click.echo(f"frank: error: {exc.one_line()}", err=True)
    sys.exit(exc.exit_code)
except click.ClickException as exc:
    exc.show()
    sys.exit(exc.exit_code)
