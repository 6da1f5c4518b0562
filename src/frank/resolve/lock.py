"""The lock: every resolved part, the hash of every input, and one stack digest.

The digest hashes the resolved content only (model, target, base image, flags, env,
plugins and each part's build-relevant fields and input hashes), never the stack's file
name or a part's history fields, so two stacks that resolve alike share a digest. The lock
file is canonical JSON with sorted keys: byte-identical on every run, clone and day.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from frank.errors import NESTED_TOO_DEEP, FrankError
from frank.fsutil import write_atomic
from frank.hashing import sha256_json
from frank.model.kinds.base import FlagValue, Strict
from frank.model.tomlio import read_text, validation_to_error
from frank.resolve.resolver import Resolved

if TYPE_CHECKING:
    from frank.model.kinds.package import Package

LOCK_VERSION = 1


class LockedPart(Strict):
    """One part as locked."""

    name: str
    version: str
    kind: str
    manifest: str
    manifest_sha256: str
    inputs: dict[str, str]
    key: str  # hash of the part's build spec and inputs: keys its image layer
    spec: dict[str, Any]
    # claims checked on fetched content when the lock was written (a URL patch's
    # touches_compiled): claim -> what was found; left out of the file when empty
    verified: dict[str, str] = {}
    # a derived part's output, made at lock time (resolve.derive): its key, sha256 and
    # size; covered by ``key``; left out of the file when empty
    derived: dict[str, Any] = {}


class Lock(Strict):
    """A lock file's content."""

    lock_version: int
    stack: str  # informational: not part of the digest
    digest: str
    model: dict[str, Any]
    target: dict[str, Any]
    base_image: dict[str, str]
    command: list[str]
    flags: dict[str, FlagValue]
    env: dict[str, str]
    plugins: list[str]
    parts: list[LockedPart]
    # the stack's Python closure: pylock file (repo-relative), its sha256, the request hash
    python_closure: dict[str, str] | None = None
    # build steps that run a command inside the image (a container engine, the network):
    # recorded so that an impure image is never mistaken for a hermetic one
    impure: list[str] = []
    # package indexes besides PyPI (the stack's [indexes] and [from_index]): name -> its URL
    # and the distributions that come from it; left out of the file and digest when none
    indexes: dict[str, dict[str, Any]] = {}
    # an official engine image's own Python distributions, read from its layers
    # (frank.image.inventory): its digest, the inventory's sha256, the site folder and
    # name -> version; left out of the file when the stack has none
    base_python: dict[str, Any] | None = None

    def part(self, name: str) -> LockedPart | None:
        """The locked part of that name, if present."""
        return next((p for p in self.parts if p.name == name), None)


def lock_path(stack_path: Path) -> Path:
    """The lock lives next to its stack: ``stacks/served.toml`` -> ``stacks/served.lock``."""
    return stack_path.with_suffix(".lock")


def impure_steps(resolved: Resolved, closure: bool = False, base: bool = False) -> list[str]:
    """The parts whose build must run commands inside the image, what each runs and what it
    reaches: exactly the layers the plan runs in a container (``closure``: the lock has a
    Python closure, so a release-wheel engine, its Python-only patches and pinned package
    wheels are installed on the host instead; ``base``: the stack sits on an official engine
    image whose distributions were read, so its package parts and Python-only patches are
    installed and applied on the host too)."""
    from frank.model.kinds.engine import EngineBase, PinnedWheel
    from frank.model.kinds.package import Package
    from frank.model.kinds.patch import Patch
    from frank.model.kinds.step import Step

    parts = [rp.manifest.part for rp in resolved.parts]
    compiled = [p.name for p in parts if isinstance(p, Patch) and p.touches_compiled]
    engine = next((p for p in parts if isinstance(p, EngineBase)), None)
    hermetic = (engine is not None and engine.image is None and not compiled
                and engine.wheel is not None and closure) or base
    out = []
    for part in parts:
        if isinstance(part, EngineBase) and part.image is None:
            if compiled:
                out.append(f"engine:{part.name}: source build ({', '.join(compiled)} "
                           "touch compiled code)")
            elif part.wheel is None:
                out.append(f"engine:{part.name}: vLLM's precompiled path (no release wheel)")
            elif not hermetic:
                out.append(f"engine:{part.name}: release wheel installed by pip in the image, "
                           "its dependencies from the index (reaches the network)")
        if isinstance(part, Patch) and engine is not None and not hermetic:
            where = "fetched by URL on the host (into the store, by sha256), " if part.url \
                else ""
            if not part.touches_compiled:
                out.append(f"patch:{part.name}: {where}applied with patch to the installed "
                           "engine in the image (off the network)")
        if isinstance(part, Package) and isinstance(part.wheel, PinnedWheel) and not hermetic:
            out.append(f"package:{part.name}: wheel installed by pip --require-hashes in the "
                       "image (reaches the network)")
        if isinstance(part, Package) and part.git is not None:
            out.append(f"package:{part.name}: wheel built from git {part.git.repo} at "
                       f"{part.git.commit} (checked out by frank on the host) in a builder "
                       f"stage (a container engine; {_stage_reach(part)})")
        if isinstance(part, Step):
            out.append(f"step:{part.name}: runs in a container on the image below (off the "
                       "network unless another part's build needs it); its outputs "
                       f"{', '.join(part.outputs)} are the layer")
    return out


def _stage_reach(part: Package) -> str:
    """What a source build's stage reaches, as its commands do (source_build_layer): apt-get
    for Debian build packages, pip for pinned build requirements or an isolated build's
    backend; nothing else."""
    from frank.model.kinds.package import SourceBuild

    build = part.build or SourceBuild()
    tools = [tool for tool, used in (("apt-get", bool(build.system_packages)),
                                     ("pip", bool(build.requires or build.isolation)))
             if used]
    if not tools:
        return "off the network: no build packages, no build isolation"
    return f"its {' and '.join(tools)} {'reach' if len(tools) > 1 else 'reaches'} the network"


def verify_fetched(resolved: Resolved, previous: Lock | None,
                   siblings: Callable[[], list[Lock]] = list,
                   known: list[dict[str, Any]] | None = None) -> dict[str, dict[str, str]]:
    """Check each URL patch's ``touches_compiled`` on the diff itself, fetched (store,
    mirror, then the network) and verified by its sha256: the claim decides the engine's
    install path, so a URL part is held to it exactly as a file part is. The verdict is a
    function of the pinned bytes, so one the previous lock recorded for the same URL and
    sha256 is reused without fetching again, as is one another lock of the repo recorded
    (``siblings``, read only when needed: a new stack extending served), or one a revert kept
    in the history for its undo (``known``: name, inputs, verified of the parts it took out;
    after reverting a URL patch no lock holds its check); the build checks the diff once more
    when it applies it."""
    from frank.model.kinds.patch import Patch, touches_compiled

    out: dict[str, dict[str, str]] = {}
    for rp in resolved.parts:
        part = rp.manifest.part
        if not isinstance(part, Patch) or part.url is None or part.sha256 is None:
            continue
        claim = "true" if part.touches_compiled else "false"
        verdict = f"{claim}: checked on the fetched diff (sha256 {part.sha256})"
        if _recorded(previous, part.name, rp.inputs, verdict) \
                or _kept(known, part.name, rp.inputs, verdict) or any(
                _recorded(other, part.name, rp.inputs, verdict) for other in siblings()):
            out[part.name] = {"touches_compiled": verdict}
            continue
        from frank.store.fetch import Fetcher, Pinned, mirror_dirs

        try:
            path = Fetcher(mirrors=mirror_dirs()).fetch(Pinned(str(part.url), part.sha256))
        except FrankError as exc:
            raise FrankError(f"checking touches_compiled: {exc.message}",
                             file=rp.manifest.path, field="url") from None
        actual = touches_compiled(path.read_text(encoding="utf-8", errors="replace"))
        if actual != part.touches_compiled:
            raise FrankError(
                f"declared {part.touches_compiled} but the diff fetched from {part.url} "
                f"{'touches' if actual else 'does not touch'} compiled code",
                file=rp.manifest.path, field="touches_compiled")
        out[part.name] = {"touches_compiled": verdict}
    return out


def scm_versions(resolved: Resolved, previous: Lock | None) -> dict[str, dict[str, str]]:
    """The version each source build that asks for it (``build.scm_version``) gets: what
    setuptools-scm would read from git at the pinned commit (``gitsource.scm_version``:
    its history and tags, fetched into frank's cache). A version depends on the tags as
    well as the commit, so it is pinned here: the one the previous lock recorded for the
    same inputs is kept without fetching anything."""
    from frank.model.kinds.package import SCM_VERSION, Package

    out: dict[str, dict[str, str]] = {}
    for rp in resolved.parts:
        part = rp.manifest.part
        if not isinstance(part, Package) or part.git is None or part.build is None \
                or not part.build.scm_version:
            continue
        old = previous.part(part.name) if previous is not None else None
        if old is not None and old.inputs == rp.inputs and SCM_VERSION in old.verified:
            out[part.name] = {SCM_VERSION: old.verified[SCM_VERSION]}
            continue
        from frank.store.blobs import BlobStore
        from frank.store.gitsource import scm_version

        store = BlobStore()
        try:
            version = scm_version(part.git.repo, part.git.commit, root=resolved.root,
                                  cache=store.root, log=store.root / "logs" / "git.log")
        except FrankError as exc:
            raise FrankError(f"reading the version of {part.git.commit[:12]}: {exc.message}",
                             file=rp.manifest.path, field="build.scm_version") from None
        out[part.name] = {SCM_VERSION: version}
    return out


def _recorded(lock: Lock | None, name: str, inputs: dict[str, str], verdict: str) -> bool:
    old = lock.part(name) if lock is not None else None
    return old is not None and old.inputs == inputs \
        and old.verified.get("touches_compiled") == verdict


def _kept(known: list[dict[str, Any]] | None, name: str, inputs: dict[str, str],
          verdict: str) -> bool:
    """``_recorded`` for the checks a revert kept in its history line (name, inputs,
    verified of each part it took out)."""
    return any(k.get("name") == name and k.get("inputs") == inputs
               and (k.get("verified") or {}).get("touches_compiled") == verdict
               for k in known or [])


def build_lock(resolved: Resolved, python_closure: dict[str, str] | None = None,
               verified: dict[str, dict[str, str]] | None = None,
               derived: dict[str, dict[str, Any]] | None = None,
               base_python: dict[str, Any] | None = None) -> Lock:
    """The lock of a resolved stack (and of its Python closure, when it has one); a
    derived part's output (``derived``) is part of its key, so of the digest."""
    parts = []
    digest_parts = []
    for rp in resolved.parts:
        spec = rp.build_spec()
        made = (derived or {}).get(rp.name, {})
        checked = (verified or {}).get(rp.name, {})
        # a source's version is what its build is told: another version, another layer
        scm = {k: v for k, v in checked.items() if k == "scm_version"}
        key = sha256_json({"spec": spec, "inputs": rp.inputs,
                           **({"derived": made} if made else {}), **scm})
        m = rp.manifest
        parts.append(LockedPart(
            name=m.part.name, version=m.part.version, kind=m.part.kind, manifest=m.rel,
            manifest_sha256=m.sha256, inputs=rp.inputs, key=key,
            spec=m.part.model_dump(mode="json"), verified=(verified or {}).get(m.part.name, {}),
            derived=made,
        ))
        digest_parts.append({"name": m.part.name, "key": key})
    body = {
        "model": resolved.stack.model.model_dump(mode="json"),
        "target": resolved.stack.target.model_dump(mode="json", exclude_defaults=True),
        "base_image": resolved.base_image,
        "command": resolved.stack.command,
        "flags": resolved.flags,
        "env": resolved.env,
        "plugins": resolved.plugins,
    }
    indexes = {name: {"url": url, "distributions": sorted(
        d for d, n in resolved.stack.from_index.items() if n == name)}
        for name, url in sorted(resolved.stack.indexes.items())}
    doc = {**body, "parts": digest_parts, "lock_version": LOCK_VERSION}
    if indexes:  # a stack without keeps its digest
        doc["indexes"] = indexes
    if python_closure is not None:  # its content, not its file name (like the stack's)
        doc["python_closure"] = {k: v for k, v in python_closure.items() if k != "file"}
    impure = impure_steps(resolved, closure=python_closure is not None,
                          base=base_python is not None)
    if impure:
        doc["impure"] = impure
    if base_python is not None:
        doc["base_python"] = base_python
    digest = "sha256:" + sha256_json(doc)
    return Lock(lock_version=LOCK_VERSION, stack=resolved.stack.name, digest=digest,
                parts=parts, python_closure=python_closure, impure=impure, indexes=indexes,
                base_python=base_python, **body)


def render_lock(lock: Lock) -> str:
    """Canonical text of a lock file."""
    doc = lock.model_dump(mode="json")
    if not doc["indexes"]:
        del doc["indexes"]
    if doc["base_python"] is None:
        del doc["base_python"]
    for part in doc["parts"]:
        for empty in ("verified", "derived"):
            if not part[empty]:
                del part[empty]
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_lock(lock: Lock, path: Path) -> bool:
    """Write the lock atomically; returns whether the file changed."""
    text = render_lock(lock)
    if lock_is_current(path, text):
        return False
    write_atomic(path, text)
    return True


def lock_is_current(path: Path, text: str) -> bool:
    """Whether the lock file at ``path`` holds exactly ``text`` (compared as bytes, so a
    file that is not UTF-8 is simply stale)."""
    return path.is_file() and path.read_bytes() == text.encode()


def _no_constant(name: str) -> Any:
    """json.loads takes NaN and Infinity, which are not JSON: a lock never holds them."""
    raise ValueError(f"{name} is not JSON")


def read_lock(path: Path) -> Lock:
    """Load a lock file; a missing, corrupt or foreign file is a one-line error."""
    text = read_text(path, missing="lock file not found (run `frank lock`)")
    try:
        raw = json.loads(text, parse_constant=_no_constant)
    except ValueError as exc:  # JSONDecodeError, or NaN/Infinity
        raise FrankError(f"not valid JSON: {exc}", file=path) from None
    except RecursionError:
        raise FrankError(NESTED_TOO_DEEP, file=path) from None
    try:
        return Lock.model_validate(raw)
    except ValidationError as exc:
        raise validation_to_error(exc, path) from None
