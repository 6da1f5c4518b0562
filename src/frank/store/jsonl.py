"""Append-only JSON-lines files of pydantic records (trial results, pushes).

Appended by rewrite-and-rename, so nothing on disk is ever half a line; a bad line is an
error naming the file and the line.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from frank.errors import NESTED_TOO_DEEP, FrankError
from frank.fsutil import write_atomic
from frank.model.tomlio import validation_to_error

M = TypeVar("M", bound=BaseModel)


def read_models(path: Path, model: type[M]) -> list[M]:
    """Every record in the file, in file order (none when it does not exist)."""
    if not path.is_file():
        return []
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            raise FrankError(f"not valid JSON: {exc.msg}", file=path, field=f"line {n}") from None
        except RecursionError:
            raise FrankError(NESTED_TOO_DEEP, file=path, field=f"line {n}") from None
        try:
            out.append(model.model_validate(raw))
        except ValidationError as exc:
            err = validation_to_error(exc, path)
            err.field = f"line {n}.{err.field}" if err.field else f"line {n}"
            raise err from None
    return out


def append_models(path: Path, records: Sequence[BaseModel]) -> None:
    """Append records atomically (the old content plus the new lines, renamed into place)."""
    old = path.read_text(encoding="utf-8") if path.is_file() else ""
    if old and not old.endswith("\n"):
        old += "\n"
    lines = "".join(json.dumps(r.model_dump(mode="json", exclude_defaults=False),
                               sort_keys=True) + "\n" for r in records)
    write_atomic(path, old + lines)
