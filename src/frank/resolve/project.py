"""Finding the repo, its stacks and their locks from what a user typed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from frank.errors import FrankError
from frank.fsutil import find_repo_root
from frank.model.catalog import Catalog
from frank.model.stackfiles import stack_files
from frank.resolve.lock import (
    Lock,
    build_lock,
    lock_path,
    read_lock,
    scm_versions,
    verify_fetched,
)
from frank.resolve.resolver import Resolved, resolve

if TYPE_CHECKING:
    from frank.image.inventory import Inventory

# How lock_stack treats the stack's Python closure (pylock.<stack>.toml):
#   use      the pylock must be current (offline); a stale one is an error
#   check    offline; a stale or missing pylock is reported in Locked.closure_stale
#   resolve  re-resolve with uv only when the request changed (network then)
#   upgrade  always re-resolve
ClosureMode = Literal["use", "check", "resolve", "upgrade"]


@dataclass
class Locked:
    """A stack resolved and locked in memory (nothing written but, if asked, its pylock)."""

    resolved: Resolved
    lock: Lock
    lock_file: Path
    closure_file: Path | None = None
    closure_stale: bool = False
    closure_resolved: bool = False


def stack_path(arg: str, root: Path) -> Path:
    """A stack given by path (``stacks/served.toml``) or by name (``served``)."""
    direct = Path(arg)
    if direct.suffix == ".toml" or "/" in arg:
        if not direct.is_file():
            raise FrankError("stack file not found", file=arg)
        return _inside(direct, find_repo_root(direct.absolute().parent))
    named = root / "stacks" / f"{arg}.toml"
    if not named.is_file():
        raise FrankError(f"no stack named {arg!r} (looked for stacks/{arg}.toml)")
    return _inside(named, root)


def _inside(given: Path, root: Path) -> Path:
    """The stack file, resolved, when it is inside the repo it was named in: a link to
    another repository's stack would make compose write that repository's lock and out/."""
    path = given.resolve()
    if not path.is_relative_to(root.resolve()):
        raise FrankError(f"links to {path}, outside the repo; a stack must be inside the repo "
                         "it is locked and composed in", file=given)
    return path


def repo_root_for(path: Path | None = None) -> Path:
    """The repo holding ``path`` (a stack file) or the current directory."""
    return find_repo_root(path.parent if path is not None else Path.cwd())


def lock_stack(arg: str, catalog: Catalog | None = None, closure: ClosureMode = "use", *,
               offline: bool = False) -> Locked:
    """Resolve and lock a stack named or given by path, with its Python closure
    (``offline``: an official base's contents only as kept or as its lock recorded them)."""
    root = repo_root_for(Path(arg) if arg.endswith(".toml") else None)
    path = stack_path(arg, root)
    root = repo_root_for(path)
    return lock_resolved(resolve(path, root, catalog), path, root, closure, offline=offline)


def _previous_lock(path: Path) -> Lock | None:
    """The lock file as it is, when it reads (its recorded checks may be reused)."""
    if not path.is_file():
        return None
    try:
        return read_lock(path)
    except FrankError:
        return None


def _recorded_current(previous: Lock | None, request: str, pylock: Path, root: Path) -> bool:
    """Whether the stack's own lock says ``pylock``, byte for byte, was resolved from this
    request. frank writes a lock only once its pylock is current, so this answers what
    parsing the pylock's ``[tool.frank] request`` would (a pylock of 200 wheels takes
    tens of ms to parse; hashing it, one)."""
    from frank.resolve.closure import file_digest

    recorded = previous.python_closure if previous is not None else None
    return (recorded is not None and recorded.get("request") == request
            and pylock.is_relative_to(root)
            and recorded.get("file") == pylock.relative_to(root).as_posix()
            and pylock.is_file() and recorded.get("sha256") == file_digest(pylock))


def _edited_since(previous: Lock | None, request: str, pylock: Path) -> bool:
    """Whether the pylock is not the file the stack's lock recorded for this same request:
    frank writes a pylock only by resolving, so other bytes for the same request are an
    edit by hand (a wheel's hash, say), which its ``[tool.frank] request`` cannot show."""
    from frank.resolve.closure import file_digest

    recorded = previous.python_closure if previous is not None else None
    return (recorded is not None and recorded.get("request") == request
            and recorded.get("sha256") not in (None, "missing") and pylock.is_file()
            and recorded.get("sha256") != file_digest(pylock))


def lock_resolved(resolved: Resolved, path: Path, root: Path, closure: ClosureMode = "use",
                  closure_out: Path | None = None,
                  known: list[dict[str, Any]] | None = None, *,
                  offline: bool = False) -> Locked:
    """Lock a resolved stack as the stack file ``path``, whose Python closure lives beside
    it. The resolution may come from a staged copy of that file (an edit being checked
    before it is written): the closure and the lock file are still the real stack's.
    ``closure_out`` is a copy of the real pylock to read and re-resolve instead (an edit
    being checked writes nothing real); the lock still names the real one."""
    from frank.resolve import closure as pyclosure

    own = lock_path(path)
    previous = _previous_lock(own)

    def siblings() -> list[Lock]:
        return [lock for other in stack_files(root, ".lock") if other.resolve() != own.resolve()
                if (lock := _previous_lock(other)) is not None]

    verified = verify_fetched(resolved, previous, siblings, known)
    for name, found in scm_versions(resolved, previous).items():
        verified.setdefault(name, {}).update(found)
    derived = None
    if any(rp.manifest.part.kind == "derived" for rp in resolved.parts):
        from frank.resolve.derive import derive_outputs  # only a stack that has one pays

        derived = derive_outputs(resolved, previous, siblings, closure)
    base = engine_image_inventory(resolved, offline=offline or closure == "check",
                                  previous=previous)
    base_python = None if base is None else {
        "image": base.image, "inventory": base.sha256, "site": "/" + (base.site() or ""),
        "dists": base.versions()}
    request = pyclosure.request_for(resolved, base)
    if request is None:
        return Locked(resolved=resolved, lock=build_lock(resolved, verified=verified,
                                                         derived=derived,
                                                         base_python=base_python),
                      lock_file=lock_path(path))
    real = pyclosure.pylock_path(path)
    pylock = closure_out or real
    fresh = closure != "upgrade" and (
        (closure_out is None and _recorded_current(previous, request.digest(), pylock, root))
        or (not _edited_since(previous, request.digest(), pylock)
            and pyclosure.current(request, pylock)))
    stale = resolved_now = False
    if not fresh:
        if closure == "resolve" and pyclosure.copy_sibling(request, pylock, real):
            pass  # another stack here asked for the same closure: reuse it, offline
        elif closure in ("resolve", "upgrade"):
            pyclosure.resolve(request, pylock, stack_file=path)
            resolved_now = True
        elif closure == "check":
            stale = True
        elif (sibling := pyclosure.find_sibling(request, pylock, real)) is not None:
            pylock = sibling  # a read command on a new stack: another stack's is the same
        else:
            raise FrankError("the Python closure is stale or missing for this stack "
                             "(run `frank lock`)", file=pylock)
    named = real if pylock == closure_out else pylock
    info = {"file": named.relative_to(root).as_posix() if named.is_relative_to(root)
            else str(named), "request": request.digest(),
            "sha256": pyclosure.file_digest(pylock) if pylock.is_file() else "missing"}
    return Locked(resolved=resolved, lock=build_lock(resolved, info, verified, derived,
                                                     base_python),
                  lock_file=lock_path(path),
                  closure_file=pylock, closure_stale=stale, closure_resolved=resolved_now)


def engine_image_inventory(resolved: Resolved, *, offline: bool = False,
                           previous: Lock | None = None) -> Inventory | None:
    """What the official engine image the stack sits on holds, when a package part changes
    its Python distributions (read from its layers once per digest, frank.image.inventory;
    ``offline``: `frank lock --check`, which never downloads the image); None for every
    other stack."""
    from frank.model.kinds.base import PartContext, PythonNeeds
    from frank.model.kinds.engine import EngineBase

    engine = next((rp.manifest.part for rp in resolved.parts
                   if isinstance(rp.manifest.part, EngineBase)), None)
    if not isinstance(engine, EngineBase) or engine.image is None:
        return None
    if all(rp.manifest.part.python_needs(PartContext(root=resolved.root,
                                                     manifest=rp.manifest.path))
           == PythonNeeds() for rp in resolved.parts):
        return None
    from frank.image.inventory import inventory_for, kept_inventory
    from frank.store.blobs import BlobStore

    definition = resolved.root / "images" / f"{resolved.base_image['name']}.toml"
    # kept by digest, or as the lock recorded it for this same pin: the registry (or the
    # layout) is asked only for a base never read here and never locked (issue 54)
    inventory = kept_inventory(definition, BlobStore()) or _recorded_inventory(
        previous, resolved) or inventory_for(definition, offline=offline)
    if inventory.site() is None:
        raise FrankError(f"the engine image {engine.image} holds no Python distribution in a "
                         "site-packages folder, so package parts cannot change it",
                         file=definition, field="ref")
    return inventory


def _recorded_inventory(previous: Lock | None, resolved: Resolved) -> Inventory | None:
    """The base's distributions as the stack's lock recorded them (name, version, site and
    the inventory's sha256), when it pins the same image: what an offline command (`frank
    check`) needs of a base whose contents are not here. Never for a build: the build reads
    the image and holds it to that sha256 (``frank.assemble.base.plan_inventory``)."""
    from frank.image.inventory import BaseDist, Inventory

    if previous is None or previous.base_python is None or previous.base_image.get("ref") \
            != resolved.base_image.get("ref"):
        return None
    recorded = previous.base_python
    site = str(recorded.get("site", "")).strip("/")
    dists = tuple(BaseDist(name, version, f"{site}/{name}-{version}.dist-info", ())
                  for name, version in sorted((recorded.get("dists") or {}).items()))
    return Inventory(image=str(recorded["image"]), dists=dists,
                     sha256=str(recorded["inventory"]))


def load_lock_any(arg: str) -> Lock:
    """A lock from a ``.lock`` file, or by locking a stack (name or path) in memory."""
    if arg.endswith(".lock"):
        return read_lock(Path(arg))
    return lock_stack(arg).lock
