"""What `frank run` and `frank warm` both start: the container engine, and the verified,
audited image of a target (kept apart so neither command imports the other)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from frank.assemble.engines import Engine, EngineName
from frank.cli.targets import built_image
from frank.errors import FrankError

if TYPE_CHECKING:
    from frank.image.verify import VerifiedImage


def engine_for(name: str, print_only: bool) -> Engine:
    """The engine to run with; ``--print --engine NAME`` also shows an engine not here."""
    from frank.assemble.engines import _runroot, detect, get_engine
    from frank.store.blobs import BlobStore

    if name == "auto" or not print_only:
        return get_engine(name)
    found = next((e for e in detect() if e.name == name), None)
    if found is not None:
        return found
    root = BlobStore().root / "containers" / name
    return Engine(cast(EngineName, name), shutil.which(name) or name, root, _runroot(root))


def runnable(target: str, what: str = "run it") -> tuple[VerifiedImage, dict[str, Any]]:
    """The verified, audited image of TARGET and the lock it carries (what `frank run` and
    `frank warm` start)."""
    from frank.image.verify import image_lock, verify_layout
    from frank.store.blobs import BlobStore

    layout, locked = built_image(target)
    stack_digest, stack = (locked.lock.digest, target) if locked else (None, None)
    # the developer's loop: blobs the stat ledger vouches for are not hashed again
    image = verify_layout(layout, ledger=BlobStore().ledger)
    if stack_digest is not None and image.lock_digest != stack_digest:
        raise FrankError(f"the image was built from lock {image.lock_digest}, the stack's lock "
                         f"is now {stack_digest} (run `frank compose {stack}`)", file=layout)
    from frank.audit.auditor import ensure_audited, stack_lock
    from frank.resolve.project import repo_root_for

    root = repo_root_for(Path(stack)) if stack and stack.endswith(".toml") \
        else repo_root_for(None)
    # against the stack's lock in the repo, never the image's own (issue 53)
    ensure_audited(layout, locked.lock if locked else stack_lock(layout, root), root,
                   what=what)
    lock = image_lock(image)
    return image, lock
