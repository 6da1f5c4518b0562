"""What every part has, and the small protocol every kind implements.

Like pre-commit's one module per language behind one interface: each kind's module says
what content keys it (``inputs``), what it adds to the image (``layer``), what env and
engine flags it adds (``env``, ``flags``). The common fields (provenance, status, evidence,
requires/conflicts/replaces, revert) live here once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from frank.errors import FrankError
from frank.fsutil import repo_path
from frank.hashing import left_out, sha256_file, sha256_tree
from frank.model.pins import check_one_line, matching
from frank.model.targets import TargetFacts

FlagValue = str | int | float | bool
check_flag_name = matching(r"[A-Za-z0-9][A-Za-z0-9_-]*",
                           "an engine flag name (letters, digits, '_', '-'; no leading dashes)")
FlagName = Annotated[str, AfterValidator(check_flag_name)]


def check_flag_values(flags: Mapping[str, FlagValue]) -> None:
    """Flag values become one argv word each and a JSON lock: a float must be finite (a
    NaN is not JSON) and a string one line (a NUL cannot be passed to a program)."""
    for key, value in flags.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{key!r} = {value!r}: a flag value must be a finite number")
        if isinstance(value, str):
            try:
                check_one_line(value)
            except ValueError as exc:
                raise ValueError(f"{key!r}: {exc}") from None


def case_clash(names: Iterable[str]) -> tuple[str, str] | None:
    """Two names that differ only in case (``Port`` and ``port``): the engine, or a
    case-insensitive environment, would see one of them and silently drop the other."""
    seen: dict[str, str] = {}
    for name in names:
        other = seen.setdefault(name.lower(), name)
        if other != name:
            return other, name
    return None


def refuse_case_clash(names: Iterable[str], what: str) -> None:
    """A validator step: two names that differ only in case are an error."""
    clash = case_clash(names)
    if clash is not None:
        raise ValueError(f"{what} {clash[0]!r} and {clash[1]!r} differ only in case")


# Names and versions are lower-case slugs: they become file names and layer names.
check_slug = matching(r"[a-z0-9][a-z0-9._-]*", "a lower-case slug ([a-z0-9][a-z0-9._-]*)")


Slug = Annotated[str, AfterValidator(check_slug)]
Status = Literal["served", "candidate", "parked", "rejected"]


class Strict(BaseModel):
    """Base of every model: unknown fields are refused, values are immutable. A model's
    validator is built when it is first used (``defer_build``), not when its module is
    imported: a read command builds only the models it validates."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class Provenance(Strict):
    """Where a part comes from and who to credit."""

    upstream: str | None = None
    credits: list[str] = []
    licence: str


class Evidence(Strict):
    """The rule written before the test, and what the test found."""

    rule: str
    result: str
    design: str | None = None
    trial: str | None = None


class Revert(Strict):
    """One step back for this part: remove it, or return to a named earlier version; or
    ``none``, for a part with no step back (the engine base pin: a stack without it does not
    build, and it has no earlier version), which ``rule`` must explain."""

    action: Literal["remove", "version", "none"]
    to: Slug | None = None
    rule: str | None = None

    @model_validator(mode="after")
    def _to_matches_action(self) -> Revert:
        if self.action == "version" and self.to is None:
            raise ValueError("revert.action 'version' needs revert.to (the earlier version)")
        if self.action in ("remove", "none") and self.to is not None:
            raise ValueError(f"revert.action {self.action!r} takes no revert.to")
        if self.action == "none" and not self.rule:
            raise ValueError("revert.action 'none' needs revert.rule (why there is no step back)")
        return self


@dataclass(frozen=True)
class FileCopy:
    """A file or tree from the repo (``src``, repo-relative) placed at ``dest`` in the image."""

    src: str
    dest: str


@dataclass(frozen=True)
class GitCheckout:
    """A git source checked out by frank on the host at a full commit (with its submodules)
    and placed at ``dest`` in a builder stage: the container never clones anything."""

    repo: str
    commit: str
    submodules: bool
    dest: str


@dataclass(frozen=True)
class BuildStage:
    """Commands run in a builder stage (FROM the image as built so far, in a container):
    only ``outputs`` (image paths) are copied from it into the part's layer, then ``then``
    runs in the image itself (installing a built wheel, removing a file)."""

    run: tuple[str, ...]
    outputs: tuple[str, ...]
    then: tuple[str, ...] = ()
    source: GitCheckout | None = None  # checked out on the host, copied into the stage


@dataclass(frozen=True)
class LayerContribution:
    """What a part adds to the image: files to copy, or commands that must run inside it."""

    files: tuple[FileCopy, ...] = ()
    generated: tuple[tuple[str, str], ...] = ()  # (dest in image, text) made by frank
    pip_install: tuple[str, ...] = ()  # dests in the image of pure-Python packages to install
    run: tuple[str, ...] = ()  # shell commands that must run inside the image
    why: str = ""
    build_wheels: tuple[str, ...] = ()  # repo package folders frank builds into wheels
    # a builder stage: ``files`` are its inputs (copied into the stage, not the image)
    stage: BuildStage | None = None
    # its commands reach the network (pip from an index, git clone, apt-get, a URL): a
    # container build of a plan where no such layer runs in the container is cut off from it
    network: bool = False
    # (url, sha256, dest in image): files frank fetches on the host into the store, checks
    # by sha256 and places in the layer, so no command in the image fetches them
    fetched: tuple[tuple[str, str, str], ...] = ()


@dataclass(frozen=True)
class PythonNeeds:
    """What a part asks of the stack's Python closure (resolved once, by uv, for all parts)."""

    requirements: tuple[str, ...] = ()  # PEP 508 lines
    overrides: tuple[str, ...] = ()  # versions forced over what the engine asks for
    excludes: tuple[str, ...] = ()  # distributions taken out of the closure
    local_wheels: tuple[tuple[Path, str], ...] = ()  # (wheel file, sha256) found by path
    pinned: tuple[tuple[str, str], ...] = ()  # (distribution, sha256 its wheel must have)
    owns: tuple[str, ...] = ()  # distributions whose wheels go into this part's own layer
    # PEP 508 lines installed without their dependencies (a part's ``no_deps``): resolved
    # on their own, and left out of the rest of the closure
    no_deps: tuple[str, ...] = ()


@dataclass
class PartContext:
    """Where a part's manifest lives, for resolving and hashing its repo paths."""

    root: Path
    manifest: Path
    notes: list[str] = field(default_factory=list)
    verified: dict[str, str] = field(default_factory=dict)  # the lock's, when there is one

    def path(self, value: str, field_name: str, must_exist: bool = True) -> Path:
        """A repo path named by a manifest field, checked to stay inside the repo."""
        return repo_path(self.root, value, file=self.manifest, field=field_name,
                         must_exist=must_exist)

    def file_hash(self, value: str, field_name: str, expected: str | None = None,
                  hash_field: str = "sha256") -> str:
        """sha256 of a repo file; a declared hash that does not match is an error.

        A missing file is named under the field that gives the path (``field_name``), a
        wrong hash under the field that declares it (``hash_field``)."""
        path = self.path(value, field_name)
        if not path.is_file():
            raise FrankError(f"{value!r} is not a file", file=self.manifest, field=field_name)
        actual = sha256_file(path)
        if expected is not None and actual != expected:
            raise FrankError(
                f"sha256 mismatch for {value}: manifest says {expected}, file has {actual}",
                file=self.manifest, field=hash_field,
            )
        return actual

    def tree_hash(self, value: str, field_name: str, *, every_file: bool = False) -> str:
        """Hash of a repo directory's content. ``every_file``: each file on disk is content
        (a folder of binaries), so one git ignores, or a cache folder's, is refused by name
        rather than silently left out of the hash and the image."""
        path = self.path(value, field_name)
        if not path.is_dir():
            raise FrankError(f"{value!r} is not a directory", file=self.manifest,
                             field=field_name)
        try:
            digest = sha256_tree(path)
            lost = left_out(path) if every_file else []
        except FrankError as exc:  # a symlink leading out of the tree
            raise FrankError(f"{value}: {exc.message}", file=self.manifest,
                             field=field_name) from None
        if lost:
            more = f" and {len(lost) - 3} more" if len(lost) > 3 else ""
            raise FrankError(
                f"{value}/: {', '.join(lost[:3])}{more} would be left out of the image "
                "(ignored by git, or a cache name); un-ignore them or move them out",
                file=self.manifest, field=field_name)
        return digest


check_module = matching(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*",
                        "a Python module name (dotted identifiers, as `import` takes it)")
ModuleName = Annotated[str, AfterValidator(check_module)]


class SmokeCheck(Strict):
    """What must hold once the part is installed: modules that import in the image's
    Python (``python3 -c 'import flashinfer'``). The launcher runs them before the engine
    starts, and alone with ``frank-launch --check``."""

    imports: list[ModuleName] = Field(min_length=1)

    def commands(self) -> list[list[str]]:
        """One argv per module: a failing import names its module."""
        return [["python3", "-c", f"import {m}"] for m in self.imports]


class PartBase(Strict):
    """Fields common to every kind of part."""

    # Subclasses set these; they drive layer order (least often changed first) and
    # which fields hold the artifact (may be empty only for parked/rejected parts).
    layer_rank: ClassVar[int] = 50
    artifact_fields: ClassVar[tuple[str, ...]] = ()

    kind: str
    name: Slug
    version: Slug
    summary: str
    provenance: Provenance
    status: Status
    # one [evidence] table, or [[evidence]] once trials append theirs (earlier ones stay)
    evidence: Evidence | list[Evidence] | None = None
    requires: list[Slug] = []
    conflicts: list[Slug] = []
    replaces: str | None = None
    revert: Revert
    # left out of the spec when absent, so a part without a check keeps its key
    check: SmokeCheck | None = Field(default=None, exclude_if=lambda v: v is None)
    # what the engine loads, selects and calls on a target family (frank.model.targets),
    # held to the image by `frank audit --require-target`; left out of the spec when none
    targets: list[TargetFacts] = Field(default=[], exclude_if=lambda v: not v)

    @model_validator(mode="after")
    def _artifact_present_unless_shelved(self) -> PartBase:
        if self.status in ("served", "candidate"):
            for name in self.artifact_fields:
                if getattr(self, name) is None:
                    raise ValueError(
                        f"{name} is required for a {self.status} part "
                        "(only parked or rejected parts may lack their artifact)"
                    )
        return self

    def missing_artifact(self) -> str | None:
        """The first artifact field left empty (such a part cannot go into a stack)."""
        return next((n for n in self.artifact_fields if getattr(self, n) is None), None)

    # --- the protocol every kind implements -------------------------------------------
    def inputs(self, ctx: PartContext) -> dict[str, str]:
        """Content hashes (label -> sha256) of the files this part brings, verified."""
        return {}

    def layer(self, ctx: PartContext) -> LayerContribution | None:
        """What this part adds to the image, or None when it adds only config."""
        return None

    def python_needs(self, ctx: PartContext) -> PythonNeeds:
        """What this part adds to the stack's Python closure."""
        return PythonNeeds()

    def env(self) -> dict[str, str]:
        """Environment variables the engine gets from this part."""
        return {}

    def flags(self) -> dict[str, FlagValue]:
        """Engine flags (without leading dashes) this part adds."""
        return {}

    def plugin_names(self) -> list[str]:
        """vLLM plugin entry-point names this part needs loaded (VLLM_PLUGINS)."""
        return []
