"""Which parts a stack may hold, by status: served and candidate ones only.

Why refuse the others everywhere, not only in the served stack: a parked or rejected part is
one a trial (or a person) took out of service; a stack that still holds it would build and
serve it with nothing saying so. `frank check` refuses it and `frank trial adopt` never
writes such a status while a stack holds the part.
"""

from __future__ import annotations

from frank.errors import FrankError
from frank.resolve.resolver import Resolved

SHELVED = ("parked", "rejected")


def shelved_part(resolved: Resolved) -> FrankError | None:
    """The error for the first parked or rejected part in a resolved stack, if any; it names
    the stack file and the field that put the part there."""
    for rp in sorted(resolved.parts, key=lambda rp: rp.name):
        part = rp.manifest.part
        if part.status in SHELVED:
            file, field = resolved.stack.origin[rp.name]
            return FrankError(
                f"{part.name} {part.version} is {part.status} ({rp.manifest.rel}): a parked "
                "or rejected part may not be in any stack; take it out of the stack, or set "
                "it back to candidate to try it again", file=file, field=field)
    return None
