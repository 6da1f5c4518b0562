"""Shared output helpers for commands: JSON for CI, plain tables for people."""

from __future__ import annotations

import json
import math
from typing import Any

import click


def emit_json(value: Any) -> None:
    """Print a value as stable, indented JSON."""
    click.echo(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False))


def json_option(func: Any) -> Any:
    """The ``--json`` flag every read command takes."""
    return click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")(func)


def print_table(title: str | None, columns: list[str], rows: list[list[str]]) -> None:
    """A plain table on stdout, fitted to the terminal (``COLUMNS``): a cell too wide for
    its column folds onto more lines. Plain text, so that a read command needs no
    terminal library to start (``rich`` alone costs more than the rest of `frank diff`)."""
    import shutil

    width = shutil.get_terminal_size((100, 24)).columns
    cells = [columns, *rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    room = max(width - 3 * (len(columns) - 1), 8 * len(columns))
    while sum(widths) > room and max(widths) > 8:
        widest = widths.index(max(widths))
        widths[widest] -= 1
    out = [title] if title else []
    for n, row in enumerate(cells):
        folded = [[cell[i:i + w] for i in range(0, len(cell), w)] or [""]
                  for cell, w in zip(row, widths, strict=True)]
        for line in range(max(len(f) for f in folded)):
            parts = [(f[line] if line < len(f) else "").ljust(w)
                     for f, w in zip(folded, widths, strict=True)]
            out.append(" │ ".join(parts).rstrip())
        if n == 0:
            out.append("─┼─".join("─" * w for w in widths))
    click.echo("\n".join(out))


class Seconds(click.ParamType[float]):
    """A positive, finite number of seconds (``float`` alone takes ``nan``, ``inf``, ``-5``:
    a deadline that never comes or has always passed)."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(seconds) or seconds <= 0:
            self.fail(f"{value!r} is not a positive, finite number of seconds", param, ctx)
        return seconds


SECONDS = Seconds()
