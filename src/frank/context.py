"""Write a build plan out as a Dockerfile build context any container engine can build.

Layout of the output folder::

    plan.json            the build plan
    frank.lock           the lock it came from
    context/Dockerfile   one COPY/RUN group per plan layer, in plan order
    context/layers/NN-name/rootfs/...   each layer's files at their image paths

Written to a temp folder and renamed into place, so a failure leaves the old output whole.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from string import Template

from frank.hashing import tree_files
from frank.lock import Lock, render_lock
from frank.plan import BuildPlan, PlanLayer


def layer_dir(layer: PlanLayer) -> str:
    """A layer's folder name in the context."""
    return f"{layer.index:02d}-{layer.name.replace(':', '-')}"


def stage_layer(layer: PlanLayer, root: Path, rootfs: Path) -> None:
    """Place a layer's repo files and generated files under ``rootfs`` at their image paths."""
    for step in layer.files:
        src = root / step.src
        dest = rootfs / step.dest.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            for file in tree_files(src):  # exactly the files the lock hashed
                target = dest / file.relative_to(src)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(file, target)
        else:
            shutil.copy2(src, dest)
    for gen in layer.generated:
        dest = rootfs / gen.dest.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(gen.text, encoding="utf-8")


def _layer_steps(layer: PlanLayer, staged: set[int], pip: bool = True) -> list[str]:
    lines = [f"# layer {layer.index}: {layer.name} (key {layer.key[:16]}): {layer.why}"]
    if layer.index in staged:
        lines.append(f"COPY layers/{layer_dir(layer)}/rootfs/ /")
    steps = [*layer.run, *(f"pip install --no-deps {d}" for d in layer.pip_install if pip)]
    if steps:
        lines.append("RUN " + " \\\n && ".join(steps))
    return lines


def template_text(root: Path) -> str:
    """The repo's ``images/Dockerfile.tmpl``, or frank's own when the repo has none."""
    own = root / "images" / "Dockerfile.tmpl"
    if own.is_file():
        return own.read_text(encoding="utf-8")
    return (Path(__file__).parent / "templates" / "Dockerfile.tmpl").read_text(encoding="utf-8")


def render_dockerfile(plan: BuildPlan, staged: set[int], template: str) -> str:
    """A multi-stage Dockerfile: the engine stage, one build stage per kernel (compiled
    against the engine stage's torch), and a final stage that copies each kernel's built
    tree and adds plugins, data, the launcher and the lock."""
    base = plan.base_image.get("ref", f"frank-base/{plan.base_image['name']}")
    first_kernel = next((x.index for x in plan.layers if x.kind == "kernel"), None)
    engine_part, kernel_stages, final_part = [], [], []
    for layer in plan.layers:
        if first_kernel is None or layer.index < first_kernel:
            engine_part += [*_layer_steps(layer, staged), ""]
        elif layer.kind == "kernel":
            stage = f"kernel-{layer.part}"
            kernel_stages += [f"FROM engine AS {stage}", *_layer_steps(layer, staged, pip=False),
                              ""]
            src = layer.files[0].dest if layer.files else f"/opt/frank/kernels/{layer.part}"
            final_part += [f"# kernel {layer.part}: built in stage {stage}",
                           f"COPY --from={stage} {src}/ {src}/"]
            if layer.pip_install:
                final_part.append("RUN " + " \\\n && ".join(
                    f"pip install --no-deps {d}" for d in layer.pip_install))
            final_part.append("")
        else:
            final_part += [*_layer_steps(layer, staged), ""]
    env = plan.config.env
    config = []
    if env:
        config.append("ENV " + " \\\n    ".join(f"{k}={json.dumps(v)}" for k, v in env.items()))
    labels = plan.config.labels
    config.append("LABEL " + " \\\n      ".join(
        f"{k}={json.dumps(v)}" for k, v in labels.items()))
    config.append(f"ENTRYPOINT {json.dumps(plan.config.entrypoint)}")
    config.append(f"CMD {json.dumps(plan.config.cmd)}")
    engine_path = (f"{plan.engine.strategy}: {plan.engine.why}" if plan.engine
                   else "none (no engine part)")
    return Template(template).substitute(
        stack=plan.stack, lock_digest=plan.lock_digest, base_image=base,
        source_date_epoch=plan.source_date_epoch, engine_path=engine_path,
        engine_layers="\n".join(engine_part).rstrip(),
        kernel_stages="\n".join(kernel_stages).rstrip(),
        final_layers="\n".join(final_part).rstrip(), config="\n".join(config),
    ).replace("\n\n\n", "\n\n")


def write_context(plan: BuildPlan, lock: Lock, root: Path, out: Path) -> Path:
    """Write plan, lock and a complete build context to ``out`` (replaced whole)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        (tmp / "plan.json").write_text(
            json.dumps(plan.model_dump(mode="json"), indent=2, sort_keys=True) + "\n")
        (tmp / "frank.lock").write_text(render_lock(lock))
        context = tmp / "context"
        staged = set()
        for layer in plan.layers:
            if layer.files or layer.generated:
                stage_layer(layer, root, context / "layers" / layer_dir(layer) / "rootfs")
                staged.add(layer.index)
        (context / "Dockerfile").write_text(
            render_dockerfile(plan, staged, template_text(root)))
        if out.exists():
            old = out.with_name(f".{out.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
