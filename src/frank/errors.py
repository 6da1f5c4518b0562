"""The one error type frank raises for bad input, and the one place it becomes a message.

Every failure a user can cause (a malformed manifest, a stale lock, a missing tool) is a
``FrankError`` naming the file and the field; the CLI turns it into one line and exit 2.
"""

from __future__ import annotations

from pathlib import Path


def _display_path(file: Path | str) -> str:
    """A path as a user would type it: relative to the current folder when inside it."""
    path = Path(file)
    if path.is_absolute():
        try:
            return path.relative_to(Path.cwd()).as_posix()
        except ValueError:
            return str(path)
    return str(file)


class FrankError(Exception):
    """A user-facing failure: one line, names the file and the field, exit code 2."""

    exit_code = 2

    def __init__(self, message: str, *, file: Path | str | None = None, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.file = _display_path(file) if file is not None else None
        self.field = field

    def one_line(self) -> str:
        """``file: field: message`` with whatever parts are known, on a single line."""
        parts = [p for p in (self.file, self.field) if p]
        text = ": ".join([*parts, self.message])
        return " ".join(text.split("\n"))

    def __str__(self) -> str:
        return self.one_line()


def as_real_file(exc: FrankError, temp: Path | str, real: Path | str) -> FrankError:
    """``exc`` raised while checking a staged copy ``temp`` of ``real`` (a revert resolves
    the edited stack from a temp file beside it): the same error, naming the real file,
    since the temp file is gone by the time anyone reads the message."""
    temp, real = Path(temp), Path(real)
    out = FrankError(exc.message.replace(str(temp), str(real)).replace(temp.name, real.name),
                     file=real if exc.file == _display_path(temp) else exc.file,
                     field=exc.field)
    out.exit_code = exc.exit_code
    return out


# A value nested deeper than a parser along the way copes with (a RecursionError), one line.
NESTED_TOO_DEEP = "values nested too deeply to read (arrays or tables inside each other)"
