"""Reading TOML and turning pydantic's validation errors into one-line FrankErrors."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from frank.errors import NESTED_TOO_DEEP, FrankError


def read_text(path: Path, missing: str = "file not found") -> str:
    """A text file's content; a missing, unreadable or non-UTF-8 file is one line naming it."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FrankError(missing, file=path) from None
    except OSError as exc:
        raise FrankError(f"cannot read: {exc.strerror}", file=path) from None
    except UnicodeDecodeError as exc:
        raise FrankError(f"not valid UTF-8 (byte {exc.object[exc.start]:#04x} at offset "
                         f"{exc.start})", file=path) from None


def read_toml(path: Path) -> dict[str, Any]:
    """Parse a TOML file; a missing file or a syntax error names the file."""
    text = read_text(path)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise FrankError(f"TOML syntax error: {exc}", file=path) from None
    except RecursionError:
        raise FrankError(NESTED_TOO_DEEP, file=path) from None


def validation_to_error(exc: ValidationError, file: Path, tag: str | None = None) -> FrankError:
    """The first validation error as ``file: field: message``.

    ``tag`` is the discriminator value pydantic puts first in a union's error location.
    """
    err = exc.errors()[0]
    loc = [str(p) for p in err["loc"]]
    if tag is not None and loc and loc[0] == tag:
        loc = loc[1:]
    kind = err["type"]
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        loc, message = ["kind"], err["msg"]
    elif kind == "extra_forbidden":
        message = "unknown field"
    elif kind == "missing":
        message = "required field is missing"
    else:
        message = err["msg"].removeprefix("Value error, ")
        if "input" in err and kind not in ("value_error",) and not isinstance(
            err["input"], dict | list
        ):
            got = err["input"]
            if isinstance(got, str) and "://" in got:  # a URL is shown without its secrets
                from frank.model.pins import redact_url

                got = redact_url(got)
            message += f" (got {got!r})"
    field = ".".join(loc) if loc else None
    return FrankError(message, file=file, field=field)
