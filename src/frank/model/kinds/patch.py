"""Source patch: a diff against the engine's source, pinned by sha256 (Spack-style).

The patch file either lives in this repo (``file``) or is fetched at build time from
``url``; either way its sha256 is part of what keys the engine layer. Whether it touches
compiled code is declared and checked against the diff itself, because it decides whether
the engine can take the precompiled path.
"""

from __future__ import annotations

import re
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from frank.errors import FrankError
from frank.model.kinds.base import FileCopy, LayerContribution, PartBase, PartContext, Slug
from frank.model.pins import Commit, GitUrl, ImagePath, SafeHttpUrl, Sha256
from frank.model.pins import Digest as WheelDigest

# Paths whose change means vLLM must be compiled (VLLM.md, "Building vLLM").
COMPILED_PATHS = re.compile(
    r"^(csrc/|cmake/|CMakeLists\.txt$|setup\.py$|vllm/_custom_ops\.py$)|\.(cu|cuh|cpp|cc|h|hpp)$"
)
_DIFF_PATH = re.compile(r"^(?:\+\+\+|---) (?:[ab]/)?(\S+)", re.MULTILINE)


def touched_paths(diff_text: str) -> list[str]:
    """Paths a unified diff changes (``/dev/null`` left out)."""
    return sorted({p for p in _DIFF_PATH.findall(diff_text) if p != "/dev/null"})


def touches_compiled(diff_text: str) -> bool:
    """Whether the diff changes code vLLM compiles (so the precompiled path is wrong).

    Changing or deleting an existing compiled path counts, and so does touching the build
    (CMake, setup.py). A *new* source file counts only together with such a change: vLLM's
    CMake lists its sources by name, so a file nothing names is never compiled (vLLM-Moet's
    patch set adds such files under csrc/ and tools/ for reference).
    """
    from frank.model.diffs import split_diff

    parts = split_diff(diff_text)
    if not parts:  # not a per-file diff: judge by every path it names
        return any(COMPILED_PATHS.search(p) for p in touched_paths(diff_text))
    changed = [p for p in parts if not p.created and COMPILED_PATHS.search(p.path)]
    return bool(changed)


def patch_dest(part_name: str) -> str:
    """Where a patch file lands in the image."""
    return f"/opt/frank/patches/{part_name}.patch"


class Patch(PartBase):
    """A source patch on the engine base."""

    layer_rank: ClassVar[int] = 20
    artifact_fields: ClassVar[tuple[str, ...]] = ("sha256",)

    kind: Literal["patch"]
    source_repo: GitUrl
    source_commit: Commit | None = None
    file: str | None = None
    url: SafeHttpUrl | None = None
    sha256: Sha256 | None = None
    # the engine commits (or engine wheels, "sha256:<hex>") the diff was made against
    applies_to: list[Commit | WheelDigest]
    touches_compiled: bool
    # where a new file outside the engine's packages goes: the diff's top-level folder
    # (csrc, tools) -> an image folder; any other file outside them fails the build
    destinations: dict[Slug, ImagePath] = Field(default={}, exclude_if=lambda v: not v)

    @model_validator(mode="after")
    def _one_source(self) -> Patch:
        if self.file is not None and self.url is not None:
            raise ValueError("give the patch as file or url, not both")
        if self.status in ("served", "candidate") and self.file is None and self.url is None:
            raise ValueError("a served or candidate patch needs file or url")
        return self

    def inputs(self, ctx: PartContext) -> dict[str, str]:
        if self.file is None:
            assert self.sha256 is not None
            return {str(self.url): self.sha256}  # verified when the build fetches it
        digest = ctx.file_hash(self.file, "file", expected=self.sha256)
        actual = touches_compiled(ctx.path(self.file, "file").read_text(errors="replace"))
        if actual != self.touches_compiled:
            raise FrankError(
                f"declared {self.touches_compiled} but the diff "
                f"{'touches' if actual else 'does not touch'} compiled code",
                file=ctx.manifest, field="touches_compiled",
            )
        return {self.file: digest}

    def layer(self, ctx: PartContext) -> LayerContribution | None:
        files: tuple[FileCopy, ...] = ()
        fetched: tuple[tuple[str, str, str], ...] = ()
        if self.file is None:  # fetched on the host into the store, never in the image
            assert self.sha256 is not None
            fetched = ((str(self.url), self.sha256, patch_dest(self.name)),)
        else:
            files = (FileCopy(self.file, patch_dest(self.name)),)
        apply = (
            "patch -p1 --forward -d \"$(python3 -c 'import os,vllm;"
            "print(os.path.dirname(os.path.dirname(vllm.__file__)))')\" "
            f"< {patch_dest(self.name)}"
        )
        if self.touches_compiled:  # applied to the source tree before the engine is built
            return LayerContribution(files=files, run=(apply,), fetched=fetched,
                                     why="patch of compiled code, staged for the engine's "
                                         "source build at the pinned commit")
        return LayerContribution(files=files, run=(apply,), fetched=fetched,
                                 why="Python-only patch applied to the installed engine")
