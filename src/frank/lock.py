"""The lock: every resolved part, the hash of every input, and one stack digest.

The digest hashes the resolved content only (model, target, base image, flags, env,
plugins and each part's build-relevant fields and input hashes), never the stack's file
name or a part's history fields, so two stacks that resolve alike share a digest. The lock
file is canonical JSON with sorted keys: byte-identical on every run, clone and day.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from frank.errors import FrankError
from frank.fsutil import write_atomic
from frank.hashing import sha256_json
from frank.kinds.base import FlagValue, Strict
from frank.resolve import Resolved
from frank.tomlio import read_text, validation_to_error

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

    def part(self, name: str) -> LockedPart | None:
        """The locked part of that name, if present."""
        return next((p for p in self.parts if p.name == name), None)


def lock_path(stack_path: Path) -> Path:
    """The lock lives next to its stack: ``stacks/served.toml`` -> ``stacks/served.lock``."""
    return stack_path.with_suffix(".lock")


def impure_steps(resolved: Resolved) -> list[str]:
    """The parts whose build must run commands inside the image, and why."""
    from frank.kinds.engine import EngineBase
    from frank.kinds.package import Package
    from frank.kinds.patch import Patch

    parts = [rp.manifest.part for rp in resolved.parts]
    compiled = [p.name for p in parts if isinstance(p, Patch) and p.touches_compiled]
    out = []
    for part in parts:
        if isinstance(part, EngineBase) and part.image is None:
            if compiled:
                out.append(f"engine:{part.name}: source build ({', '.join(compiled)} "
                           "touch compiled code)")
            elif part.wheel is None:
                out.append(f"engine:{part.name}: vLLM's precompiled path (no release wheel)")
        if isinstance(part, Package) and part.git is not None:
            out.append(f"package:{part.name}: wheel built from git inside the image")
    return out


def build_lock(resolved: Resolved, python_closure: dict[str, str] | None = None) -> Lock:
    """The lock of a resolved stack (and of its Python closure, when it has one)."""
    parts = []
    digest_parts = []
    for rp in resolved.parts:
        spec = rp.build_spec()
        key = sha256_json({"spec": spec, "inputs": rp.inputs})
        m = rp.manifest
        parts.append(LockedPart(
            name=m.part.name, version=m.part.version, kind=m.part.kind, manifest=m.rel,
            manifest_sha256=m.sha256, inputs=rp.inputs, key=key,
            spec=m.part.model_dump(mode="json"),
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
    doc = {**body, "parts": digest_parts, "lock_version": LOCK_VERSION}
    if python_closure is not None:  # its content, not its file name (like the stack's)
        doc["python_closure"] = {k: v for k, v in python_closure.items() if k != "file"}
    impure = impure_steps(resolved)
    if impure:
        doc["impure"] = impure
    digest = "sha256:" + sha256_json(doc)
    return Lock(lock_version=LOCK_VERSION, stack=resolved.stack.name, digest=digest,
                parts=parts, python_closure=python_closure, impure=impure, **body)


def render_lock(lock: Lock) -> str:
    """Canonical text of a lock file."""
    return json.dumps(lock.model_dump(mode="json"), indent=2, sort_keys=True,
                      ensure_ascii=False) + "\n"


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
    try:
        return Lock.model_validate(raw)
    except ValidationError as exc:
        raise validation_to_error(exc, path) from None
