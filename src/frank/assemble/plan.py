"""The build plan: from a lock to an ordered list of image layers.

One layer per part that brings files or commands, in lock order (least often changed
first: engine, patches, packages, binaries, kernels, plugins, data), then frank's launcher,
then the lock itself. Each layer carries the key that decides whether it must be rebuilt.
Env switches and weights add no layer: env goes in the image config, weights are fetched
and verified at serve time.
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from packaging.utils import canonicalize_name
from pydantic import Field

from frank.errors import FrankError
from frank.hashing import sha256_bytes, sha256_json
from frank.image.spec import LOCK_IN_IMAGE as LOCK_IN_IMAGE
from frank.model.kinds import PART_ADAPTER
from frank.model.kinds.aot import Aot
from frank.model.kinds.base import PartBase, PartContext, Strict
from frank.model.kinds.derived import Derived
from frank.model.kinds.engine import EngineBase, torch_arch_list
from frank.model.kinds.extension import Extension
from frank.model.kinds.kernel import Kernel
from frank.model.kinds.package import Package
from frank.model.kinds.patch import Patch
from frank.resolve.lock import Lock, LockedPart, render_lock

PLAN_VERSION = 2
# Fixed, so that the same lock gives the same bytes on any day (ko uses 0; we use the
# zip epoch, 1980-01-01, which every tar and zip tool accepts).
SOURCE_DATE_EPOCH = 315532800
LAUNCHER_IN_IMAGE = "/opt/frank/bin/frank-launch"
# The launcher is run/'s code, but the plan only reads its text (it is a file in the image).
LAUNCHER_SOURCE = Path(__file__).parent.parent / "run" / "launch.py"
# Debian's python3.11 has this on sys.path; frank installs every wheel here.
SITE_PACKAGES = "/usr/local/lib/python3.11/dist-packages"
# Bump when the same wheels would be installed into different bytes.
INSTALL_FORMAT = "frank-install-1"
# how a layer takes a base distribution out: 2 whites out the folders only it installed into
WHITEOUT_FORMAT = "frank-whiteouts-2"
# Closure distributions that change least often come first; a wheel of at least
# OWN_LAYER_BYTES gets a layer of its own, the small ones of a group share one, so that a
# vLLM bump that keeps torch reuses nearly every byte (names are canonical, prefix match).
OWN_LAYER_BYTES = 10_000_000
CLOSURE_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("nvidia", ("nvidia-", "cuda-")),
    ("torch", ("torch", "triton")),
)

EngineStrategy = Literal["image", "release-wheel", "precompiled", "source"]


class CopyStep(Strict):
    """A repo file or tree placed at ``dest`` in the image."""

    src: str
    dest: str


class FetchedFile(Strict):
    """A file frank fetches on the host into the store by sha256 and places at ``dest``."""

    url: str
    sha256: str
    dest: str


class GeneratedFile(Strict):
    """A small file frank writes (a pinned requirements line, the lock)."""

    dest: str
    text: str


class WheelRef(Strict):
    """A wheel of the locked closure that frank installs into a layer tree on the host."""

    name: str
    version: str
    filename: str
    url: str
    sha256: str
    size: int | None = None


class PatchStep(Strict):
    """A Python-only patch applied on the host to the engine's installed files."""

    part: str
    source: str  # repo path or URL
    sha256: str
    # the engine's files: its pinned wheel's, or (None) the official engine image's own,
    # read from the base's layers (``base_dist`` names its distribution there)
    engine_wheel: WheelRef | None
    manifest: str  # the patch part's manifest (errors name it)
    declared_compiled: bool
    base_dist: str | None = Field(default=None, exclude_if=lambda v: v is None)
    # top-level folder of the diff outside the engine's packages -> image folder
    destinations: dict[str, str] = Field(default={}, exclude_if=lambda v: not v)


class SourceCheckout(Strict):
    """A git source frank checks out on the host (``frank.store.gitsource``) into the stage."""

    repo: str
    commit: str
    submodules: bool
    dest: str


class StageStep(Strict):
    """A builder stage: commands run on the image as built so far (in a container); only
    ``outputs`` are copied into this layer, then ``then`` runs in the image."""

    name: str  # the Dockerfile stage name
    run: list[str]
    outputs: list[str]
    then: list[str] = []
    source: SourceCheckout | None = None


class PlanLayer(Strict):
    """One image layer and everything that keys it."""

    index: int
    name: str
    part: str | None
    kind: str
    key: str
    inputs: dict[str, str]
    files: list[CopyStep]
    generated: list[GeneratedFile]
    pip_install: list[str]
    run: list[str]
    why: str
    # Host-side steps of the embedded builder (no command runs inside the image):
    wheels: list[WheelRef] = []  # installed into the layer tree by frank (`installer`)
    owns: list[str] = []  # the distributions this layer holds
    patch: PatchStep | None = None
    build_wheels: list[str] = []  # repo package folders built into wheels and installed
    kernel: dict[str, Any] | None = None  # a kernel part's spec, compiled on the host
    # an aot part's spec: its modules built on the host (frank.assemble.aot), one key each
    aot: dict[str, Any] | None = Field(default=None, exclude_if=lambda v: v is None)
    # an extension part's spec: its module built on the host (frank.assemble.extension)
    extension: dict[str, Any] | None = Field(default=None, exclude_if=lambda v: v is None)
    manifest: str | None = None  # the part's manifest, repo-relative (errors name it)
    impure: bool = False  # runs commands inside the image (a container engine), see `run`
    network: bool = False  # those commands reach the network (pip, git, apt-get, a URL)
    stage: StageStep | None = None  # built in a builder stage, its outputs copied in
    # distributions of the official engine image this layer takes out (an OCI whiteout of
    # every path its RECORD lists and of its dist-info, except paths the layer writes)
    base_remove: list[str] = Field(default=[], exclude_if=lambda v: not v)
    fetched: list[FetchedFile] = Field(default=[], exclude_if=lambda v: not v)


class EnginePath(Strict):
    """How the engine base gets into the image, and why that way."""

    strategy: EngineStrategy
    why: str


class ImageConfig(Strict):
    """The image config frank sets."""

    env: dict[str, str]
    entrypoint: list[str]
    cmd: list[str]
    labels: dict[str, str]


class BuildPlan(Strict):
    """What the builder makes, in order."""

    plan_version: int
    stack: str
    lock_digest: str
    source_date_epoch: int
    base_image: dict[str, str]
    engine: EnginePath | None
    layers: list[PlanLayer]
    config: ImageConfig
    site_packages: str = SITE_PACKAGES
    # the official engine image's inventory (its digest, the inventory's sha256): what a
    # layer's base_remove and a patch of the image's engine read
    base_python: dict[str, str] | None = Field(default=None, exclude_if=lambda v: v is None)

    # import smoke checks per part (argv lists), run by the launcher before the engine
    checks: dict[str, list[list[str]]] = {}

    @property
    def needs_run(self) -> bool:
        """Whether some layer must run commands inside the image (needs a container build)."""
        return any(layer.run or layer.stage for layer in self.layers)

    @property
    def impure(self) -> list[str]:
        """The layers that run a command inside the image (recorded, never silent)."""
        return [layer.name for layer in self.layers if layer.impure or layer.run
                or layer.stage]


def engine_path(lock: Lock) -> EnginePath | None:
    """Choose the engine's install path from the engine base and its patches."""
    parts = [PART_ADAPTER.validate_python(p.spec) for p in lock.parts]
    engine = next((p for p in parts if isinstance(p, EngineBase)), None)
    if engine is None:
        return None
    compiled = [p.name for p in parts if isinstance(p, Patch) and p.touches_compiled]
    if engine.image is not None and compiled:  # resolve refuses it; a hand-made lock too
        raise FrankError(f"{', '.join(compiled)} touch compiled code, which the official "
                         f"engine image {engine.image} holds prebuilt", field="touches_compiled")
    if engine.image is not None:
        return EnginePath(strategy="image", why=f"official engine image {engine.image}")
    if compiled:
        return EnginePath(strategy="source", why=f"{', '.join(compiled)} touch compiled code: "
                          "vLLM is built from source at the pinned commit")
    if engine.wheel is not None:
        return EnginePath(strategy="release-wheel", why="release wheel pinned by sha256; "
                          "no patch touches compiled code")
    return EnginePath(strategy="precompiled", why="no patch touches compiled code: "
                      f"VLLM_USE_PRECOMPILED with commit {engine.commit}")


def _source_build_run(engine: EngineBase, patches: list[str]) -> list[str]:
    archs = torch_arch_list(engine.cuda_arch_list)
    steps = [
        f"git clone --filter=blob:none {engine.repo} /opt/frank/vllm-src",
        f"git -C /opt/frank/vllm-src checkout --detach {engine.commit}",
        *[f"git -C /opt/frank/vllm-src apply /opt/frank/patches/{p}.patch" for p in patches],
        f"cd /opt/frank/vllm-src && TORCH_CUDA_ARCH_LIST='{archs}' pip install --no-deps .",
    ]
    return steps


def closure_wheels(lock: Lock, root: Path, closure: bytes | None = None) -> list[WheelRef]:
    """The target's wheels from the lock's pylock (or ``closure``, its text not yet
    written), whose sha256 must be the locked one."""
    from frank.resolve.closure import ClosureRequest, select_wheels

    info = lock.python_closure
    if info is None:
        return []
    path = root / info["file"]
    try:
        raw = closure if closure is not None else path.read_bytes()
    except FileNotFoundError:
        raise FrankError("the lock names this Python closure but it is missing (run "
                         "`frank lock`)", file=path) from None
    if sha256_bytes(raw) != info["sha256"]:
        raise FrankError("the Python closure changed since the lock was written (run "
                         "`frank lock`)", file=path)
    python = next((str(p.spec.get("python")) for p in lock.parts if p.kind == "engine"),
                  "3.11")
    key = (info["sha256"], python, str(path.parent))  # local wheels are relative to it
    if key not in _WHEELS:  # `frank diff served candidate`: two stacks, one pylock's bytes
        try:
            doc = tomllib.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise FrankError(f"not a valid pylock: {exc}", file=path) from None
        _WHEELS[key] = [WheelRef(name=w.name, version=w.version, filename=w.filename,
                                 url=w.url, sha256=w.sha256, size=w.size)
                        for w in select_wheels(doc, ClosureRequest(python=python), file=path)]
    return list(_WHEELS[key])


# The wheels chosen from a pylock, by (its sha256, the target Python, its folder): parsed once
# per process. WheelRef is frozen, so sharing the items is safe.
_WHEELS: dict[tuple[str, str, str], list[WheelRef]] = {}


def _wheel_layer(name: str, kind: str, part: str | None, wheels: list[WheelRef],
                 why: str, inputs: dict[str, str] | None = None) -> PlanLayer:
    key = sha256_json({"format": INSTALL_FORMAT, "site": SITE_PACKAGES,
                       "wheels": sorted(w.sha256 for w in wheels)})
    return PlanLayer(index=0, name=name, part=part, kind=kind, key=key,
                     inputs=inputs or {w.filename: w.sha256 for w in wheels}, files=[],
                     generated=[], pip_install=[], run=[], why=why, wheels=wheels,
                     owns=[f"{w.name}=={w.version}" for w in wheels])


def _group_of(name: str) -> str:
    for group, prefixes in CLOSURE_GROUPS:
        if name.startswith(prefixes):
            return group
    return "deps"


def _hermetic_engine_layers(lock: Lock, root: Path, parts: Sequence[tuple[LockedPart, PartBase]],
                            closure: bytes | None = None
                            ) -> tuple[list[PlanLayer], dict[str, PlanLayer]]:
    """Layers of the Python closure: shared groups first, then one per owning part.

    Returns the closure's shared layers (nvidia, torch, deps) and, per owning part name,
    the layer holding the distributions that part owns (the engine's own wheel, a
    package part's wheel). On an official engine image, a distribution the image already
    holds at the locked version is left out (it is there), and one it holds at another
    version is taken out by the layer that installs the locked one.
    """
    wheels = closure_wheels(lock, root, closure)
    base = dict((lock.base_python or {}).get("dists") or {})
    wheels = [w for w in wheels if base.get(w.name) != w.version]
    owner: dict[str, str] = {}
    for locked, part in parts:
        ctx = PartContext(root=root, manifest=root / locked.manifest)
        for dist in part.python_needs(ctx).owns:
            owner[canonicalize_name(dist)] = locked.name
    groups: dict[str, list[WheelRef]] = {}
    owned: dict[str, list[WheelRef]] = {}
    for w in wheels:
        if w.name in owner:
            owned.setdefault(owner[w.name], []).append(w)
        else:
            groups.setdefault(_group_of(w.name), []).append(w)
    shared = []
    for g in ("nvidia", "torch", "deps"):
        small = [w for w in groups.get(g, []) if (w.size or 0) < OWN_LAYER_BYTES]
        # a big wheel gets a layer of its own: a bump that moves one big wheel (vLLM
        # 0.24 -> 0.25 moves flashinfer-cubin) rebuilds that layer alone
        shared += [_wheel_layer(f"python:{w.name}", "closure", None, [w],
                                f"{w.filename} ({(w.size or 0) / 1e6:.0f} MB) of the locked "
                                "closure, a layer of its own")
                   for w in groups.get(g, []) if (w.size or 0) >= OWN_LAYER_BYTES]
        if small:
            name = "python:deps" if g == "deps" else f"python:{g}-rest"
            shared.append(_wheel_layer(name, "closure", None, small,
                                       f"{len(small)} small wheels of the locked closure ({g})"))
    by_part: dict[str, PlanLayer] = {}
    for locked, _ in parts:
        if locked.name in owned:
            by_part[locked.name] = _wheel_layer(
                f"{locked.kind}:{locked.name}", locked.kind, locked.name, owned[locked.name],
                "wheel pinned by sha256, installed on the host from the locked closure",
                inputs=locked.inputs)
    if base:
        shared = [_replacing(x, base, lock) for x in shared]
        by_part = {k: _replacing(x, base, lock) for k, x in by_part.items()}
    return shared, by_part


def _replacing(layer: PlanLayer, base: dict[str, str], lock: Lock) -> PlanLayer:
    """A wheel layer over an official engine image, installed into the image's own site
    folder: each distribution the image holds at another version is taken out by this
    layer (as pip would uninstall it first)."""
    assert lock.base_python is not None
    old = sorted(w.name for w in layer.wheels if w.name in base)
    said = ", ".join(f"{n} {base[n]}" for n in old)
    return layer.model_copy(update={
        "base_remove": old,
        "key": sha256_json({"own": layer.key, "site": lock.base_python["site"],
                            "base_remove": old, "inventory": lock.base_python["inventory"],
                            **({"whiteouts": WHITEOUT_FORMAT} if old else {})}),
        "why": layer.why + (f"; replaces the engine image's {said}" if old else "")})


def _unseen_network_said(layers: list[PlanLayer]) -> list[PlanLayer]:
    """Each layer whose commands run in a container and need no network says that they may
    reach it all the same, in ways the lock cannot see (a setup.py that downloads a prebuilt
    wheel): one container build runs with the network on when any of its layers needs it,
    and with it cut only where this user may make a network namespace (issue 54)."""
    def runs(layer: PlanLayer) -> bool:
        return bool(layer.run or layer.pip_install or layer.stage) and not (
            layer.wheels or layer.patch or layer.build_wheels or layer.kernel
            or layer.base_remove or layer.fetched)

    online = [x.name for x in layers if runs(x) and x.network]
    said = (f"; the build runs with the network on (for {', '.join(online)}), so these "
            "commands could reach it in ways the lock cannot see (a setup.py that downloads)"
            if online else "; its commands need no network, which is cut where this user may "
            "make a network namespace; where not, the build log says so and they could reach "
            "it in ways the lock cannot see (a setup.py that downloads)")
    return [x.model_copy(update={"why": x.why + said}) if runs(x) and not x.network else x
            for x in layers]


def _removal_layer(locked: LockedPart, part: Package, lock: Lock) -> PlanLayer | None:
    """A package part's ``remove`` on an official engine image: the distributions the image
    holds taken out (whiteouts of every RECORD path and the dist-info)."""
    assert lock.base_python is not None
    base = lock.base_python.get("dists") or {}
    gone = sorted({str(canonicalize_name(d)) for d in part.remove} & set(base))
    if not gone:
        return None
    key = sha256_json({"format": INSTALL_FORMAT, "base_remove": gone,
                       "inventory": lock.base_python["inventory"], "whiteouts": WHITEOUT_FORMAT})
    return PlanLayer(index=0, name=f"{locked.kind}:{locked.name}", part=locked.name,
                     kind=locked.kind, key=key, inputs=locked.inputs, files=[], generated=[],
                     pip_install=[], run=[], base_remove=gone, manifest=locked.manifest,
                     why="takes the engine image's "
                         f"{', '.join(f'{n} {base[n]}' for n in gone)} out: a whiteout of "
                         "every path its RECORD lists and of its dist-info")


def _base_patch_layer(locked: LockedPart, part: Patch, engine: EngineBase,
                      lock: Lock) -> PlanLayer:
    """A Python-only patch of the official engine image's own engine files: the diff
    fetched on the host (a URL one into the store, by sha256), applied on the host to the
    files read from the image's layers; the layer holds the files it changes."""
    assert lock.base_python is not None
    source = part.file if part.file is not None else str(part.url)
    sha = part.sha256 or locked.inputs[str(part.file)]
    dist = str(canonicalize_name(engine.distribution))
    step = PatchStep(part=part.name, source=source, sha256=sha, engine_wheel=None,
                     manifest=locked.manifest, declared_compiled=part.touches_compiled,
                     base_dist=dist, destinations=part.destinations)
    key = sha256_json({"format": INSTALL_FORMAT, "patch": sha, "base_dist": dist,
                       "inventory": lock.base_python["inventory"],
                       **({"destinations": part.destinations} if part.destinations else {})})
    return PlanLayer(index=0, name=f"patch:{part.name}", part=part.name, kind="patch", key=key,
                     inputs=locked.inputs, files=[], generated=[], pip_install=[], run=[],
                     why=f"Python-only patch applied on the host to the engine image's {dist} "
                         "files (read from its layers); the layer holds the files it changes",
                     patch=step)


def _patch_layer(locked: LockedPart, part: Patch, engine_layer: PlanLayer) -> PlanLayer:
    engine_wheel = engine_layer.wheels[0]
    source = part.file if part.file is not None else str(part.url)
    assert part.sha256 is not None or part.file is not None
    sha = part.sha256 or locked.inputs[str(part.file)]
    step = PatchStep(part=part.name, source=source, sha256=sha, engine_wheel=engine_wheel,
                     manifest=locked.manifest, declared_compiled=part.touches_compiled,
                     destinations=part.destinations)
    key = sha256_json({"format": INSTALL_FORMAT, "site": SITE_PACKAGES, "patch": sha,
                       "engine": engine_wheel.sha256,
                       **({"destinations": part.destinations} if part.destinations else {})})
    return PlanLayer(index=0, name=f"patch:{part.name}", part=part.name, kind="patch", key=key,
                     inputs=locked.inputs, files=[], generated=[], pip_install=[], run=[],
                     why=f"Python-only patch applied on the host to {engine_wheel.filename}; "
                         "the layer holds the files it changes", patch=step)


def _part_layer(locked: LockedPart, part: PartBase, root: Path) -> PlanLayer | None:
    """The layer of a part that copies files, builds a wheel or compiles a kernel."""
    contribution = part.layer(PartContext(root=root, manifest=root / locked.manifest,
                                          verified=dict(locked.verified)))
    if contribution is None:
        return None
    build_wheels = list(contribution.build_wheels)
    kernel = locked.spec if isinstance(part, Kernel) else None
    aot = locked.spec if isinstance(part, Aot) else None
    extension = locked.spec if isinstance(part, Extension) else None
    run = [] if (build_wheels or kernel) else list(contribution.run)
    pip = [] if (build_wheels or kernel) else list(contribution.pip_install)
    stage = None
    if contribution.stage is not None:
        src = contribution.stage.source
        stage = StageStep(name=f"build-{locked.name}", run=list(contribution.stage.run),
                          outputs=list(contribution.stage.outputs),
                          then=list(contribution.stage.then),
                          source=SourceCheckout(repo=src.repo, commit=src.commit,
                                                submodules=src.submodules, dest=src.dest)
                          if src is not None else None)
    fetched = [FetchedFile(url=u, sha256=h, dest=d) for u, h, d in contribution.fetched]
    if not (contribution.files or contribution.generated or pip or run or build_wheels
            or kernel or aot or extension or stage or fetched):
        return None
    # The part's key, and how frank turns it into a layer: a change to either is a
    # different layer, so a cached layer is never reused for other content.
    key = sha256_json({"part": locked.key, "files": [(f.src, f.dest) for f in
                                                     contribution.files],
                       "generated": contribution.generated, "run": run, "pip_install": pip,
                       "build_wheels": build_wheels, "kernel": kernel,
                       "stage": stage.model_dump() if stage else None,
                       **({"aot": aot} if aot else {}),
                       **({"extension": extension} if extension else {}),
                       **({"fetched": [f.model_dump() for f in fetched]} if fetched else {}),
                       "format": INSTALL_FORMAT, "site": SITE_PACKAGES})
    return PlanLayer(
        index=0, name=f"{locked.kind}:{locked.name}", part=locked.name,
        kind=locked.kind, key=key, inputs=locked.inputs,
        files=[CopyStep(src=f.src, dest=f.dest) for f in contribution.files],
        generated=[GeneratedFile(dest=d, text=t) for d, t in contribution.generated],
        pip_install=pip, run=run, why=contribution.why, build_wheels=build_wheels,
        kernel=kernel, aot=aot, extension=extension, manifest=locked.manifest,
        impure=bool(run or stage), stage=stage,
        network=contribution.network, fetched=fetched)


def _derived_layer(locked: LockedPart, part: Derived, root: Path) -> PlanLayer:
    """A derived part's output, kept in the store at lock time (``resolve.derive``), read
    back and checked against the lock's sha256, placed at ``dest`` as a generated file (so
    the embedded builder and a Dockerfile context place it alike, and the key covers it)."""
    from frank.resolve.derive import placed_bytes

    sha = str(locked.derived.get("sha256"))
    text = placed_bytes(part, locked.derived, locked.inputs, root / locked.manifest,
                        root).decode("utf-8")
    return PlanLayer(
        index=0, name=f"derived:{locked.name}", part=locked.name, kind=locked.kind,
        key=sha256_json({"part": locked.key, "dest": part.dest, "output": sha}),
        inputs={**locked.inputs, f"output:{part.output}": sha}, files=[],
        generated=[GeneratedFile(dest=part.dest, text=text)], pip_install=[], run=[],
        why=f"derived at lock time by {part.program.path}/{part.program.main}; its output "
            f"(sha256 {sha[:16]}...) placed as it is", manifest=locked.manifest)


def _key_stages_on_below(layers: list[PlanLayer], base: dict[str, str]) -> list[PlanLayer]:
    """A builder stage runs on the image below it, so its layer's key covers every layer
    below and the base image as well as its own inputs: the same inputs on another image
    are another build (and the key is what its kept outputs are found by, ``stepcache``)."""
    out: list[PlanLayer] = []
    for layer in layers:
        if layer.stage is not None:
            layer = layer.model_copy(update={"key": sha256_json(
                {"own": layer.key, "below": [x.key for x in out], "base": base})})
        out.append(layer)
    return out


def _checks(parts: Sequence[tuple[LockedPart, PartBase]]) -> dict[str, list[list[str]]]:
    return {locked.name: part.check.commands() for locked, part in parts
            if part.check is not None}


def build_plan(lock: Lock, root: Path, closure: bytes | None = None) -> BuildPlan:
    """The ordered layers and image config for a lock (``closure``: its pylock's text, when
    that is not yet written)."""
    path = engine_path(lock)
    parts = [(locked, PART_ADAPTER.validate_python(locked.spec)) for locked in lock.parts]
    hermetic = path is not None and path.strategy == "release-wheel" \
        and lock.python_closure is not None
    # an official engine image whose distributions the lock read: the package parts'
    # wheels installed, removals taken out and patches applied on the host, over it
    on_base = path is not None and path.strategy == "image" and lock.base_python is not None
    layers: list[PlanLayer] = []
    owned: dict[str, PlanLayer] = {}
    if (hermetic or on_base or path is None) and lock.python_closure is not None:
        shared, owned = _hermetic_engine_layers(lock, root, parts, closure)
        layers += shared
    source_patches: list[str] = []
    engine_layer: PlanLayer | None = None
    for locked, part in parts:
        if on_base and isinstance(part, Package) and part.remove:
            removal = _removal_layer(locked, part, lock)
            if removal is not None:
                layers.append(removal)
        if locked.name in owned:
            layers.append(owned[locked.name])
            if isinstance(part, EngineBase):
                engine_layer = owned[locked.name]
            continue
        if on_base and isinstance(part, Patch):
            image_engine = next(p for _, p in parts if isinstance(p, EngineBase))
            layers.append(_base_patch_layer(locked, part, image_engine, lock))
            continue
        if on_base and (isinstance(part, EngineBase)
                        or (isinstance(part, Package) and part.git is None)):
            continue  # the image is the engine; a package's wheel is in the closure
        if hermetic and isinstance(part, Patch):
            assert engine_layer is not None
            layers.append(_patch_layer(locked, part, engine_layer))
            continue
        if hermetic and (isinstance(part, EngineBase)
                         or (isinstance(part, Package) and part.git is None)):
            continue  # nothing of its own in the closure (overrides/removals only)
        layer = _derived_layer(locked, part, root) if isinstance(part, Derived) \
            else _part_layer(locked, part, root)
        if layer is None:
            continue
        if path is not None and path.strategy == "source":
            if isinstance(part, Patch):
                source_patches.append(part.name)
                what = "touches compiled code" if part.touches_compiled else "Python only"
                layer = layer.model_copy(update={
                    "run": [r for r in layer.run if not r.startswith("patch ")],
                    "why": f"patch ({what}) staged for the engine's source build: "
                           "applied to the source tree at the pinned commit before vLLM "
                           "is built"})
            elif isinstance(part, EngineBase):
                continue  # built after the patches are in place
        layers.append(layer)
    if path is not None and path.strategy == "source":
        engine_lock = next(p for p in lock.parts if p.kind == "engine")
        engine = PART_ADAPTER.validate_python(engine_lock.spec)
        assert isinstance(engine, EngineBase)
        run = _source_build_run(engine, source_patches)
        # Built once its patches are staged, and before anything that sits on the engine.
        after = max((i for i, x in enumerate(layers) if x.kind == "patch"), default=-1) + 1
        layers.insert(after, PlanLayer(
            index=0, name=f"engine:{engine.name}", part=engine.name, kind="engine",
            key=sha256_json({"run": run, "engine": engine_lock.key}), inputs=engine_lock.inputs,
            files=[], generated=[], pip_install=[], run=run, why=path.why, impure=True,
            network=True))
    layers = _key_stages_on_below(layers, lock.base_image)
    layers = _unseen_network_said(layers)
    layers = [x.model_copy(update={"index": i}) for i, x in enumerate(layers, 1)]
    launcher_text = LAUNCHER_SOURCE.read_text(encoding="utf-8")
    launcher_hash = sha256_bytes(launcher_text.encode())
    layers.append(PlanLayer(
        index=len(layers) + 1, name="frank:launcher", part=None, kind="launcher",
        key=launcher_hash, inputs={"frank/launch.py": launcher_hash}, files=[],
        generated=[GeneratedFile(dest=LAUNCHER_IN_IMAGE, text=launcher_text)],
        pip_install=[], run=[], why="the entrypoint: reads the lock, builds the engine command",
    ))
    lock_text = render_lock(lock)
    layers.append(PlanLayer(
        index=len(layers) + 1, name="frank:lock", part=None, kind="lock",
        key=sha256_bytes(lock_text.encode()), inputs={"lock": sha256_bytes(lock_text.encode())},
        files=[], generated=[GeneratedFile(dest=LOCK_IN_IMAGE, text=lock_text)], pip_install=[],
        run=[], why="the lock, read by the launcher and by `frank inspect`",
    ))
    env = dict(lock.env)
    env["VLLM_PLUGINS"] = ",".join(lock.plugins)
    env["FRANK_LOCK"] = LOCK_IN_IMAGE
    labels = {
        "org.opencontainers.image.title": lock.stack,
        "dev.frank.stack": lock.stack,
        "dev.frank.lock.digest": lock.digest,
        "dev.frank.parts": ",".join(f"{p.name}@{p.version}" for p in lock.parts),
    }
    return BuildPlan(
        plan_version=PLAN_VERSION, stack=lock.stack, lock_digest=lock.digest,
        source_date_epoch=SOURCE_DATE_EPOCH, base_image=lock.base_image, engine=path,
        layers=layers, checks=_checks(parts),
        site_packages=str(lock.base_python["site"]) if on_base and lock.base_python
        else SITE_PACKAGES,
        base_python={"image": str(lock.base_python["image"]),
                     "inventory": str(lock.base_python["inventory"])}
        if on_base and lock.base_python else None,
        config=ImageConfig(env=dict(sorted(env.items())),
                           entrypoint=["python3", LAUNCHER_IN_IMAGE, "--lock", LOCK_IN_IMAGE],
                           cmd=[], labels=labels),
    )
