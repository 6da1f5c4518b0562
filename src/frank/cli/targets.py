"""What `run`, `attest` and `audit` take as IMAGE|STACK: a layout folder, or a stack whose
image compose wrote to ``out/<stack>/image``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from frank.errors import FrankError

if TYPE_CHECKING:
    from frank.resolve.project import Locked


def built_image(target: str) -> tuple[Path, Locked | None]:
    """(layout, the stack locked now) for a stack name or path; (layout, None) for a layout
    folder (or a folder holding ``image/``), which carries its own lock."""
    path = Path(target)
    for candidate in (path, path / "image"):
        if (candidate / "oci-layout").is_file():
            return candidate.absolute(), None
    if path.is_dir():
        raise FrankError("not an OCI layout (no oci-layout file) and not a stack", file=path)
    from frank.resolve.project import lock_stack  # a layout needs no resolver

    result = lock_stack(target)
    layout = result.resolved.root / "out" / result.lock.stack / "image"
    if not (layout / "oci-layout").is_file():
        raise FrankError(f"no image built for stack {result.lock.stack} "
                         f"(run `frank compose {target}`)", file=layout)
    return layout, result
