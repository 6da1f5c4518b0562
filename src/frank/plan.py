"""The build plan: from a lock to an ordered list of image layers.

One layer per part that brings files or commands, in lock order (least often changed
first: engine, patches, packages, binaries, kernels, plugins, data), then frank's launcher,
then the lock itself. Each layer carries the key that decides whether it must be rebuilt.
Env switches and weights add no layer: env goes in the image config, weights are fetched
and verified at serve time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from frank.hashing import sha256_bytes, sha256_json
from frank.kinds import PART_ADAPTER
from frank.kinds.base import PartContext, Strict
from frank.kinds.engine import EngineBase
from frank.kinds.patch import Patch
from frank.lock import Lock, render_lock

PLAN_VERSION = 1
# Fixed, so that the same lock gives the same bytes on any day (ko uses 0; we use the
# zip epoch, 1980-01-01, which every tar and zip tool accepts).
SOURCE_DATE_EPOCH = 315532800
LOCK_IN_IMAGE = "/etc/frank/frank.lock"
LAUNCHER_IN_IMAGE = "/opt/frank/bin/frank-launch"
LAUNCHER_SOURCE = Path(__file__).with_name("launch.py")

EngineStrategy = Literal["image", "release-wheel", "precompiled", "source"]


class CopyStep(Strict):
    """A repo file or tree placed at ``dest`` in the image."""

    src: str
    dest: str


class GeneratedFile(Strict):
    """A small file frank writes (a pinned requirements line, the lock)."""

    dest: str
    text: str


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

    @property
    def needs_run(self) -> bool:
        """Whether some layer must run commands inside the image (needs a container build)."""
        return any(layer.run for layer in self.layers)


def engine_path(lock: Lock) -> EnginePath | None:
    """Choose the engine's install path from the engine base and its patches."""
    parts = [PART_ADAPTER.validate_python(p.spec) for p in lock.parts]
    engine = next((p for p in parts if isinstance(p, EngineBase)), None)
    if engine is None:
        return None
    compiled = [p.name for p in parts if isinstance(p, Patch) and p.touches_compiled]
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
    archs = ";".join(engine.cuda_arch_list)
    steps = [
        f"git clone --filter=blob:none {engine.repo} /opt/frank/vllm-src",
        f"git -C /opt/frank/vllm-src checkout --detach {engine.commit}",
        *[f"git -C /opt/frank/vllm-src apply /opt/frank/patches/{p}.patch" for p in patches],
        f"cd /opt/frank/vllm-src && TORCH_CUDA_ARCH_LIST='{archs}' pip install --no-deps .",
    ]
    return steps


def build_plan(lock: Lock, root: Path) -> BuildPlan:
    """The ordered layers and image config for a lock."""
    path = engine_path(lock)
    layers: list[PlanLayer] = []
    source_patches: list[str] = []
    for locked in lock.parts:
        part = PART_ADAPTER.validate_python(locked.spec)
        contribution = part.layer(PartContext(root=root, manifest=root / locked.manifest))
        if contribution is None:
            continue
        run = list(contribution.run)
        if path is not None and path.strategy == "source":
            if isinstance(part, Patch):
                source_patches.append(part.name)
                run = [r for r in run if not r.startswith("patch ")]
            elif isinstance(part, EngineBase):
                continue  # built after the patches are in place
        if not (contribution.files or contribution.generated or contribution.pip_install
                or run):
            continue
        # The part's key, and how frank turns it into a layer: a change to either is a
        # different layer, so a cached layer is never reused for other content.
        key = sha256_json({"part": locked.key, "files": [(f.src, f.dest) for f in
                                                         contribution.files],
                           "generated": contribution.generated, "run": run,
                           "pip_install": contribution.pip_install})
        layers.append(PlanLayer(
            index=len(layers) + 1, name=f"{locked.kind}:{locked.name}", part=locked.name,
            kind=locked.kind, key=key, inputs=locked.inputs,
            files=[CopyStep(src=f.src, dest=f.dest) for f in contribution.files],
            generated=[GeneratedFile(dest=d, text=t) for d, t in contribution.generated],
            pip_install=list(contribution.pip_install), run=run, why=contribution.why,
        ))
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
            files=[], generated=[], pip_install=[], run=run, why=path.why))
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
        layers=layers,
        config=ImageConfig(env=dict(sorted(env.items())),
                           entrypoint=["python3", LAUNCHER_IN_IMAGE, "--lock", LOCK_IN_IMAGE],
                           cmd=[], labels=labels),
    )
