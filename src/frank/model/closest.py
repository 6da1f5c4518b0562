"""The closest real name to one that is not there, for a one-line error (issue 54: a
``remove = ["flashinfer-cubim"]`` typo was accepted and did nothing). difflib's ratio, the
standard library's, is enough for names a person typed."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(name: str, real: Iterable[str]) -> str | None:
    """The real name most like ``name``, or None when none is alike at all."""
    found = difflib.get_close_matches(name, sorted(set(real)), n=1, cutoff=0.6)
    return found[0] if found else None


def did_you_mean(name: str, real: Iterable[str]) -> str:
    """``"; the closest is X"`` (or ``""``): the tail of a message about ``name``."""
    near = closest(name, real)
    return f"; the closest is {near}" if near else ""
