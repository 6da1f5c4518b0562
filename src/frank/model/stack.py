"""Stack files and their inheritance.

A root stack lists its parts in ``[parts]`` (name = version). A stack that ``extends``
another never restates them; it changes them, keyed by part name:

- ``[add]``      name = version: the part must not be in the parent;
- ``remove``     [names]: each must be in the parent;
- ``[replace]``  name = version: must be in the parent, at another version;
- ``[flags]`` / ``[env]``: merged key by key over the parent's; ``remove_flags`` /
  ``remove_env`` drop inherited keys; ``[model]``, ``[target]``, ``[image]`` override
  field by field.

A name may appear in only one of add/remove/replace. Every violation is an error naming
the stack file, the field and the other side (the parent file that has or lacks the part).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator

from frank.errors import FrankError
from frank.fsutil import find_repo_root
from frank.model.kinds.base import (
    FlagName,
    FlagValue,
    Slug,
    Strict,
    check_flag_values,
    check_slug,
    refuse_case_clash,
)
from frank.model.kinds.env import EnvName, EnvValue
from frank.model.kinds.kernel import Arch
from frank.model.pins import Distribution, IndexUrl, OneLine
from frank.model.tomlio import read_toml, validation_to_error

# How deep ``extends`` may go: far past any real stack, well short of a runaway chain.
MAX_EXTENDS_DEPTH = 32


class ModelSpec(Strict):
    """The model the stack serves (its weights come from a weights part)."""

    name: OneLine


class Target(Strict):
    """The machine the stack is built for (``arch = "cpu"`` for CPU-only smoke stacks)."""

    arch: Arch | Literal["cpu"]
    gpus: int = Field(ge=0)  # per node: one pod's ``nvidia.com/gpu`` limit
    # Kubernetes shape (``frank render k8s``): pods per engine group (more than one: a
    # LeaderWorkerSet) and copies of the engine. Locked only when set to something other
    # than 1, so stacks that say nothing keep their digest.
    nodes: int = Field(default=1, ge=1, le=64)
    replicas: int = Field(default=1, ge=0, le=1000)


class ImageChoice(Strict):
    """Which base image definition (``images/<base>.toml``) the image starts from."""

    base: Slug


class WarmWorkload(Strict):
    """The short workload ``frank warm`` sends after the engine is ready, so the caches that
    fill only on requests (Triton kernels a prefill or decode selects, JIT modules, autotuning
    of a shape) are in the warm cache too. Not part of the lock or the image: it shapes the
    warm cache, which records it (``dev.frank.warm.workload``)."""

    # one chat request per entry: its prompt length in words (capped at a quarter of
    # max-model-len)
    prompts: list[Annotated[int, Field(ge=1, le=1_000_000)]] = Field(
        default=[8, 128, 512], min_length=1, max_length=64)
    max_tokens: int = Field(default=16, ge=1, le=4096)  # tokens each request generates


class StackFile(Strict):
    """One stack file as written; see the module docstring for the merge rules."""

    description: str | None = None
    extends: str | None = None
    model: dict[str, Any] | None = None
    target: dict[str, Any] | None = None
    image: dict[str, Any] | None = None
    # engine command before the model; default vllm serve (an empty list is refused)
    command: list[OneLine] | None = Field(default=None, min_length=1)
    flags: dict[FlagName, FlagValue] = {}
    env: dict[EnvName, EnvValue] = {}
    parts: dict[Slug, Slug] | None = None
    add: dict[Slug, Slug] = {}
    remove: list[Slug] = []
    replace: dict[Slug, Slug] = {}
    remove_flags: list[FlagName] = []
    remove_env: list[EnvName] = []
    # package indexes besides PyPI, and which distributions come from which (explicit)
    indexes: dict[Slug, IndexUrl] = {}
    from_index: dict[Distribution, Slug] = {}
    # the workload `frank warm` sends (default: a few chat requests); merged field by field
    warm: WarmWorkload | None = None

    @field_validator("flags")
    @classmethod
    def _flags(cls, value: dict[str, FlagValue]) -> dict[str, FlagValue]:
        check_flag_values(value)
        refuse_case_clash(value, "flags")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        refuse_case_clash(value, "variables")
        return value


@dataclass
class Stack:
    """A stack after inheritance: what resolve works from."""

    path: Path
    name: str
    model: ModelSpec
    target: Target
    image: ImageChoice
    command: list[str]
    flags: dict[str, FlagValue]
    env: dict[str, str]
    parts: dict[str, str]
    # part name -> (stack file, field) that put it there at its current version
    origin: dict[str, tuple[Path, str]] = field(default_factory=dict)
    chain: list[Path] = field(default_factory=list)
    indexes: dict[str, str] = field(default_factory=dict)  # name -> URL
    # canonical distribution name -> index name, and the (stack file, field) that mapped it
    from_index: dict[str, str] = field(default_factory=dict)
    index_origin: dict[str, tuple[Path, str]] = field(default_factory=dict)
    warm: WarmWorkload = field(default_factory=WarmWorkload)


def load_stack_file(path: Path) -> StackFile:
    """Parse and validate one stack file (no inheritance)."""
    try:  # the file name becomes the stack's name: image labels, out/<name>, tags
        check_slug(path.stem)
    except ValueError as exc:
        raise FrankError(f"the stack file's name: {exc}", file=path) from None
    raw = read_toml(path)
    try:
        sf = StackFile.model_validate(raw)
    except ValidationError as exc:
        raise validation_to_error(exc, path) from None
    if sf.extends is None:
        for name in ("add", "remove", "replace", "remove_flags", "remove_env"):
            if getattr(sf, name):
                raise FrankError("only a stack that extends another may use it",
                                 file=path, field=name)
        for name in ("parts", "model", "target", "image"):
            if getattr(sf, name) is None:
                raise FrankError("a root stack (no extends) needs it", file=path, field=name)
    elif sf.parts is not None:
        raise FrankError("a stack that extends another changes parts with add/remove/replace",
                         file=path, field="parts")
    seen: dict[str, str] = {}
    for field_name, names in (("add", sf.add), ("remove", sf.remove), ("replace", sf.replace)):
        for name in names:
            if name in seen:
                raise FrankError(f"{name!r} is in both {seen[name]} and {field_name}",
                                 file=path, field=f"{field_name}.{name}")
            seen[name] = field_name
    return sf


def _sub_model(cls: type[Strict], raw: dict[str, Any], path: Path, field_name: str) -> Any:
    try:
        return cls.model_validate(raw)
    except ValidationError as exc:
        err = validation_to_error(exc, path)
        err.field = f"{field_name}.{err.field}" if err.field else field_name
        raise err from None


def load_stack(path: Path) -> Stack:
    """Load a stack file and everything it extends, applying the merge rules.

    The chain is read child first without recursion (a long chain is an error, not a
    RecursionError), then merged root first.
    """
    path = path.resolve()
    root = find_repo_root(path.parent)
    chain: list[tuple[Path, StackFile]] = []
    while True:
        if any(path == p for p, _ in chain):
            cycle = " -> ".join(p.name for p in [*(p for p, _ in chain), path])
            raise FrankError(f"inheritance cycle: {cycle}", file=chain[-1][0], field="extends")
        if len(chain) == MAX_EXTENDS_DEPTH:
            raise FrankError(f"extends goes more than {MAX_EXTENDS_DEPTH} stacks deep",
                             file=chain[0][0], field="extends")
        sf = load_stack_file(path)
        chain.append((path, sf))
        if sf.extends is None:
            break
        path = _parent_path(path, sf.extends, root)
    top_path, top = chain.pop()
    stack = _root_stack(top_path, top)
    for child_path, child in reversed(chain):
        stack = _apply(stack, child, child_path)
    return stack


def _parent_path(path: Path, extends: str, root: Path) -> Path:
    """The stack ``extends`` names, relative to ``path``'s folder and inside the repo."""
    if Path(extends).is_absolute():
        raise FrankError(f"{extends!r} must be relative to the stack's folder", file=path,
                         field="extends")
    parent = (path.parent / extends).resolve()
    if not parent.is_relative_to(root):
        raise FrankError(f"{extends!r} is outside the repo", file=path, field="extends")
    if not parent.is_file():
        raise FrankError(f"{extends!r} does not exist", file=path, field="extends")
    return parent


def _with_indexes(stack: Stack, sf: StackFile, path: Path) -> Stack:
    """``stack`` with ``sf``'s indexes and mappings merged over what it has; each mapping
    must name an index of the stack, each index must serve a distribution."""
    from packaging.utils import canonicalize_name

    stack.indexes = {**stack.indexes, **sf.indexes}
    stack.from_index, stack.index_origin = dict(stack.from_index), dict(stack.index_origin)
    written: dict[str, str] = {}
    for dist, name in sf.from_index.items():
        key, where = canonicalize_name(dist), f"from_index.{dist}"
        if key in written:
            raise FrankError(f"the same distribution as {written[key]!r}", file=path,
                             field=where)
        if name not in stack.indexes:
            raise FrankError(f"{name!r} is not an index of this stack (declare it in "
                             "[indexes])", file=path, field=where)
        written[key] = dist
        stack.from_index[key], stack.index_origin[key] = name, (path, where)
    for name in stack.indexes:
        if name not in stack.from_index.values():
            raise FrankError("no distribution comes from it (map one to it in [from_index]; "
                             "an index is explicit, like uv's)", file=path,
                             field=f"indexes.{name}")
    return stack


def _root_stack(path: Path, sf: StackFile) -> Stack:
    """A stack without ``extends``: its own model, target, image and parts."""
    assert sf.parts is not None and sf.model and sf.target and sf.image
    return _with_indexes(Stack(
        path=path, name=path.stem,
        model=_sub_model(ModelSpec, sf.model, path, "model"),
        target=_sub_model(Target, sf.target, path, "target"),
        image=_sub_model(ImageChoice, sf.image, path, "image"),
        command=sf.command or ["vllm", "serve"], flags=dict(sf.flags), env=dict(sf.env),
        parts=dict(sf.parts),
        origin={n: (path, f"parts.{n}") for n in sf.parts}, chain=[path],
        warm=sf.warm or WarmWorkload(),
    ), sf, path)


def _apply(parent: Stack, sf: StackFile, path: Path) -> Stack:
    parts, origin = dict(parent.parts), dict(parent.origin)
    for n, version in sf.add.items():
        if n in parts:
            raise FrankError(f"{n!r} is already in {parent.path.name} (use replace)",
                             file=path, field=f"add.{n}")
        parts[n], origin[n] = version, (path, f"add.{n}")
    for n in sf.remove:
        if n not in parts:
            raise FrankError(f"{n!r} is not in {parent.path.name}", file=path,
                             field=f"remove.{n}")
        del parts[n]
        origin.pop(n)
    for n, version in sf.replace.items():
        if n not in parts:
            raise FrankError(f"{n!r} is not in {parent.path.name} (use add)", file=path,
                             field=f"replace.{n}")
        if parts[n] == version:
            raise FrankError(f"{n!r} is already at {version!r} in {parent.path.name}",
                             file=path, field=f"replace.{n}")
        parts[n], origin[n] = version, (path, f"replace.{n}")
    flags = {**parent.flags, **sf.flags}
    for key in sf.remove_flags:
        if key not in flags:
            raise FrankError(f"{key!r} is not an inherited flag", file=path, field="remove_flags")
        del flags[key]
    env = {**parent.env, **sf.env}
    for key in sf.remove_env:
        if key not in env:
            raise FrankError(f"{key!r} is not an inherited variable", file=path,
                             field="remove_env")
        del env[key]

    def merged(cls: type[Strict], current: Strict, raw: dict[str, Any] | None, f: str) -> Any:
        return current if raw is None else _sub_model(cls, {**current.model_dump(), **raw},
                                                      path, f)

    return _with_indexes(Stack(
        path=path, name=path.stem,
        model=merged(ModelSpec, parent.model, sf.model, "model"),
        target=merged(Target, parent.target, sf.target, "target"),
        image=merged(ImageChoice, parent.image, sf.image, "image"),
        command=sf.command or parent.command, flags=flags, env=env, parts=parts,
        origin=origin, chain=[*parent.chain, path],
        indexes=parent.indexes, from_index=parent.from_index, index_origin=parent.index_origin,
        warm=parent.warm if sf.warm is None else parent.warm.model_copy(
            update=sf.warm.model_dump(include=sf.warm.model_fields_set)),
    ), sf, path)
