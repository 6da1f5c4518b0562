"""Hand a build plan to an image builder: the embedded OCI writer or a container engine.

``auto`` uses the embedded, daemonless builder whenever no layer needs a command run
inside the image; otherwise the first container engine found (buildah, podman, docker),
building the Dockerfile context compose wrote. Either way the result is an OCI layout.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from frank.context import stage_layer
from frank.errors import FrankError
from frank.hashing import sha256_json
from frank.plan import BuildPlan, PlanLayer

Builder = Literal["auto", "oci", "buildah", "podman", "docker"]
# Debian's python3 (any 3.x) has this on sys.path; pure-Python plugins land here.
SITE_PACKAGES = "/usr/lib/python3/dist-packages"
OCI_BUILDER_VERSION = 1


@dataclass(frozen=True)
class BuildResult:
    """What was built, by which builder, and why that one."""

    digest: str
    layout: Path
    builder: str
    why: str
    layers_built: int
    layers_reused: int


def choose_builder(plan: BuildPlan, requested: Builder) -> tuple[str, str]:
    """(builder, why) for the plan; a request the plan cannot honour is an error."""
    from frank.image.engines import detect

    running = [layer.name for layer in plan.layers if layer.run]
    if requested == "oci":
        if running:
            raise FrankError(f"the embedded builder cannot run commands, and {running[0]} "
                             "needs some; use --builder auto, buildah, podman or docker",
                             field="--builder")
        return "oci", "requested"
    if requested == "auto" and not running:
        return "oci", "no layer runs a command: embedded daemonless builder"
    engines = detect()
    if requested != "auto":
        if not any(e.name == requested for e in engines):
            raise FrankError(f"{requested} is not available here (install it, e.g. "
                             f"apt-get install {requested})", field="--builder")
        return requested, "requested"
    if not engines:
        raise FrankError(f"{running[0]} runs commands inside the image and no container "
                         "engine was found: install buildah (apt-get install buildah) or "
                         "podman, or run a Docker daemon", field="--builder")
    return engines[0].name, f"{running[0]} runs commands inside the image; " \
                            f"{engines[0].name} is the first engine found"


def _install_packages(layer: PlanLayer, rootfs: Path) -> None:
    """pip-install the layer's pure-Python packages into the image's site-packages."""
    target = rootfs / SITE_PACKAGES.lstrip("/")
    for dest in layer.pip_install:
        source = rootfs / dest.lstrip("/")
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
             "--no-build-isolation", "--no-cache-dir", "--disable-pip-version-check",
             "--target", str(target), str(source)],
            capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            lines = (proc.stderr or proc.stdout).strip().splitlines()
            raise FrankError(f"installing {dest} failed: {lines[-1] if lines else 'pip failed'}",
                             field=layer.name)
        shutil.rmtree(source)  # the source was staged only to be installed
    # pip records where it installed from: a temp path that would make the layer
    # differ between two builds. Drop it and its RECORD line.
    for direct in target.glob("*.dist-info/direct_url.json"):
        record = direct.with_name("RECORD")
        direct.unlink()
        if record.is_file():
            lines = [x for x in record.read_text().splitlines(keepends=True)
                     if "direct_url.json" not in x]
            record.write_text("".join(lines))


def build_oci(plan: BuildPlan, root: Path, out: Path) -> BuildResult:
    """Build with the embedded writer: one layer per plan layer, reused by key."""
    from frank.image.base import resolve_base
    from frank.image.layer import index_key
    from frank.image.oci import build_image
    from frank.image.spec import ImageSpec, LayerInput
    from frank.image.store import BlobStore

    store = BlobStore()
    base = resolve_base(root / "images" / f"{plan.base_image['name']}.toml", store)
    built = reused = 0
    with tempfile.TemporaryDirectory(prefix="frank-stage-") as tmp:
        layers = []
        for layer in plan.layers:
            staging = Path(tmp) / f"{layer.index:02d}"
            staging.mkdir()
            key = sha256_json({"plan_layer": layer.key, "site": SITE_PACKAGES,
                               "builder": OCI_BUILDER_VERSION})
            spec_layer = LayerInput(name=layer.name, key=key, entries=((staging, "/"),))
            if store.get_layer(index_key(spec_layer, plan.source_date_epoch)) is None:
                stage_layer(layer, root, staging)
                _install_packages(layer, staging)
                built += 1
            else:
                reused += 1
            layers.append(spec_layer)
        spec = ImageSpec(
            base_layout=base.layout, base_digest=base.digest, layers=tuple(layers),
            env=plan.config.env, entrypoint=plan.config.entrypoint, cmd=plan.config.cmd,
            labels=plan.config.labels,
            annotations={"dev.frank.lock.digest": plan.lock_digest,
                         "dev.frank.stack": plan.stack},
            source_date_epoch=plan.source_date_epoch,
        )
        digest = build_image(spec, store, out, ref_name=plan.stack)
    return BuildResult(digest=digest, layout=out, builder="oci", why="", layers_built=built,
                       layers_reused=reused)


def build_with_engine(plan: BuildPlan, root: Path, context: Path, out: Path,
                      engine_name: str) -> BuildResult:
    """Build the Dockerfile context with a container engine, exported as an OCI layout."""
    from frank.image.base import resolve_base
    from frank.image.engines import build_dockerfile, get_engine
    from frank.image.store import BlobStore

    store = BlobStore()
    base = resolve_base(root / "images" / f"{plan.base_image['name']}.toml", store)
    engine = get_engine(engine_name, store)
    digest = build_dockerfile(engine, context, out, base_layout=base.layout,
                              base_digest=base.digest,
                              source_date_epoch=plan.source_date_epoch)
    return BuildResult(digest=digest, layout=out, builder=engine_name, why="",
                       layers_built=len(plan.layers), layers_reused=0)


def build(plan: BuildPlan, root: Path, out_dir: Path, requested: Builder) -> BuildResult:
    """Build the plan's image into ``out_dir/image`` with the chosen builder."""
    name, why = choose_builder(plan, requested)
    layout = out_dir / "image"
    if name == "oci":
        result = build_oci(plan, root, layout)
    else:
        result = build_with_engine(plan, root, out_dir / "context", layout, name)
    return BuildResult(digest=result.digest, layout=result.layout, builder=name, why=why,
                       layers_built=result.layers_built, layers_reused=result.layers_reused)
