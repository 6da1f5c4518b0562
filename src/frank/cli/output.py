"""Shared output helpers for commands: JSON for CI, rich tables for people."""

from __future__ import annotations

import json
from typing import Any

import click


def emit_json(value: Any) -> None:
    """Print a value as stable, indented JSON."""
    click.echo(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False))


def json_option(func: Any) -> Any:
    """The ``--json`` flag every read command takes."""
    return click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")(func)


def print_table(title: str | None, columns: list[str], rows: list[list[str]]) -> None:
    """A rich table on stdout (rich imported only when a person wants a table)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    for col in columns:
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(*row)
    Console(soft_wrap=True).print(table)
