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
import os
import re
import shlex
import shutil
import tempfile
from pathlib import Path
from string import Template

from frank.assemble.plan import BuildPlan, PlanLayer
from frank.errors import FrankError
from frank.hashing import check_link_inside, tree_files
from frank.model.pins import CONTROL_CHARS
from frank.resolve.lock import Lock, render_lock

PLAIN_PATH = re.compile(r"[A-Za-z0-9_.+/-]+")


def host_built(layer: PlanLayer) -> bool:
    """Whether frank assembles this layer on the host (wheels, a patch, a kernel, files it
    fetches, whiteouts of an engine image's distributions)."""
    return bool(layer.wheels or layer.patch or layer.build_wheels or layer.kernel
                or layer.aot or layer.extension or layer.base_remove or layer.fetched)


def checked_out(layer: PlanLayer) -> bool:
    """Whether frank checks this builder stage's git source out on the host (gitsource)."""
    return layer.stage is not None and layer.stage.source is not None


def layer_dir(layer: PlanLayer) -> str:
    """A layer's folder name in the context."""
    return f"{layer.index:02d}-{layer.name.replace(':', '-')}"


def image_path_under(rootfs: Path, dest: str, layer: str) -> Path:
    """Where image path ``dest`` lands under ``rootfs``; one that would leave it (``..``)
    or name the root itself is refused, whatever the manifest validation let through."""
    rel = os.path.normpath(dest.lstrip("/"))
    if rel in (".", "") or rel == ".." or rel.startswith("../") or os.path.isabs(rel):
        raise FrankError(f"image path {dest!r} leaves the image root or names it", field=layer)
    return rootfs / rel


def copy_entry(file: Path, target: Path) -> None:
    """Copy one file of a tree; a symlink stays a symlink (as the tree hash counts it)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if file.is_symlink():
        os.symlink(os.readlink(file), target)
    else:
        shutil.copy2(file, target)


def stage_layer(layer: PlanLayer, root: Path, rootfs: Path) -> None:
    """Place a layer's repo files and generated files under ``rootfs`` at their image paths."""
    for step in layer.files:
        src = root / step.src
        dest = image_path_under(rootfs, step.dest, layer.name)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            for file in tree_files(src):  # exactly the files the lock hashed
                if file.is_symlink():
                    check_link_inside(file, src)
                copy_entry(file, dest / file.relative_to(src))
        else:
            shutil.copy2(src, dest)
    for gen in layer.generated:
        dest = image_path_under(rootfs, gen.dest, layer.name)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(gen.text, encoding="utf-8")


def dockerfile_word(value: str) -> str:
    """``value`` as one double-quoted Dockerfile word that every parser (BuildKit, the
    classic builder, buildah's imagebuilder) reads back literally: inside double quotes
    they expand ``$`` and treat a backslash as escaping only ``"``, ``$`` and ``\\``."""
    if CONTROL_CHARS.search(value):
        raise FrankError(f"{value!r} holds a control character; it cannot be written into a "
                         "Dockerfile")
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")
    return f'"{escaped}"'


def comment(text: str) -> str:
    """Text for a ``#`` line: a newline in it would start a Dockerfile instruction."""
    return " ".join(CONTROL_CHARS.sub(" ", text).split())


def plain(path: str) -> str:
    """A path written bare into a COPY line: only names of the portable character set (a
    space would split it, a ``$`` would be expanded)."""
    if not PLAIN_PATH.fullmatch(path):
        raise FrankError(f"{path!r} cannot be written into a Dockerfile COPY line as it is")
    return path


SECRET_MOUNTS = ("--mount=type=secret,id=frank-ca,target=/etc/ssl/certs/ca-certificates.crt "
                 "--mount=type=secret,id=frank-pip,target=/etc/pip.conf")


def run_instruction(steps: list[str], mounts: bool = True) -> str:
    """One RUN of shell steps joined by ``&&``; a step holding a newline would end the RUN
    and start an instruction of its own, so it is refused. Without ``mounts`` (an offline
    build by a builder that has no build secrets, Docker's legacy one) the RUN is plain."""
    for step in steps:
        if CONTROL_CHARS.search(step):
            raise FrankError(f"a build step holds a control character: {step!r}")
    # The host's CA bundle and index settings reach pip as build secrets: mounted for the
    # step only, never stored in a layer (a TLS-intercepting proxy needs the CA).
    return f"RUN {SECRET_MOUNTS + ' ' if mounts else ''}" + " \\\n && ".join(steps)


def pip_step(dest: str) -> str:
    """A shell step installing the package staged at ``dest``, quoted for the shell."""
    return f"pip install --no-deps {shlex.quote(dest)}"


def _layer_steps(layer: PlanLayer, staged: set[int], pip: bool = True,
                 mounts: bool = True) -> list[str]:
    lines = ["# " + comment(f"layer {layer.index}: {layer.name} (key {layer.key[:16]}): "
                            f"{layer.why}")]
    if layer.index in staged or host_built(layer):
        # a host-built layer's rootfs is there only once frank staged it (container builds)
        lines.append(f"COPY {plain(f'layers/{layer_dir(layer)}/rootfs/')} /")
    steps = [*layer.run, *(pip_step(d) for d in layer.pip_install if pip)]
    if steps:
        lines.append(run_instruction(steps, mounts))
    return lines


def _stage_lines(layer: PlanLayer, staged: set[int], current: str, n: int,
                 reused: bool = False, mounts: bool = True) -> list[str]:
    """A builder stage on ``current`` (the image so far), then the next stage of the final
    chain (``frank-<n>``) taking only the stage's outputs, then its ``then`` steps. With
    ``reused``, the outputs kept from an earlier build of the same key (``stepcache``) are
    copied from the context instead and the builder stage is left out. The chain stage's
    last step names the layer's key, which is how ``stepcache`` finds it in the image."""
    from frank.assemble.stepcache import marker

    stage = layer.stage
    assert stage is not None
    lines = ["# " + comment(f"layer {layer.index}: {layer.name} (key {layer.key[:16]}): "
                            f"{layer.why}")]
    if reused:
        lines += ["# " + comment("its outputs are those kept from an earlier build of this "
                                 "key: the stage is not run again"),
                  f"FROM {current} AS frank-{n}"]
        for out in stage.outputs:  # as the stage's copies are made: the same image history
            lines.append(f"COPY {plain(f'layers/{layer_dir(layer)}/outputs{out}')} {plain(out)}")
    else:
        lines.append(f"FROM {current} AS {stage.name}")
        if layer.index in staged or host_built(layer) or checked_out(layer):
            # the stage's inputs, not the image's (a git source: frank's checkout on the host)
            lines.append(f"COPY {plain(f'layers/{layer_dir(layer)}/rootfs/')} /")
        lines.append(run_instruction(stage.run, mounts))
        lines.append(f"FROM {current} AS frank-{n}")
        for out in stage.outputs:
            lines.append(f"COPY --from={stage.name} {plain(out)} {plain(out)}")
    # (a RUN without the secret mounts when there is nothing else to run: a mount point
    # could otherwise be left in the layer)
    lines.append(run_instruction([*stage.then, marker(layer)], mounts) if stage.then
                 else f"RUN {marker(layer)}")
    return lines


def template_text(root: Path) -> str:
    """The repo's ``images/Dockerfile.tmpl``, or frank's own when the repo has none."""
    own = root / "images" / "Dockerfile.tmpl"
    if own.is_file():
        return own.read_text(encoding="utf-8")
    return (Path(__file__).parent / "templates" / "Dockerfile.tmpl").read_text(encoding="utf-8")


def host_note(plan: BuildPlan, staged: set[int]) -> str:
    """Which builder this context is for: host-built layers need frank to stage them."""
    host = [x for x in plan.layers if host_built(x) or checked_out(x)]
    if not host:
        return "Builds with buildah, podman or docker as it is."
    if all(x.index in staged for x in host):
        return (f"{len(host)} layers were assembled on the host by frank and staged here: "
                "builds with buildah, podman or docker as it is.")
    return (f"For frank's builders only: {len(host)} layers (wheels, patches, kernels, git "
            "sources) are assembled on the host by frank; `frank compose --builder oci` "
            "builds them, and `--builder buildah|podman|docker` stages them here first.")


def render_dockerfile(plan: BuildPlan, staged: set[int], template: str,
                      reused: frozenset[int] = frozenset(), mounts: bool = True) -> str:
    """A multi-stage Dockerfile: the engine stage, one build stage per kernel (compiled
    against the engine stage's torch), and a final stage that copies each kernel's built
    tree and adds plugins, data, the launcher and the lock. ``mounts``: whether RUN steps
    get the build secrets (``run_instruction``)."""
    base = plan.base_image.get("ref", f"frank-base/{plan.base_image['name']}")
    # a kernel built in the image gets a stage of its own; one frank compiled on the host
    # is a layer like any other
    first_kernel = next((x.index for x in plan.layers if (x.kind == "kernel"
                         and not host_built(x)) or x.stage is not None), None)
    engine_part: list[str] = []
    kernel_stages: list[str] = []
    final_part: list[str] = []
    # builder stages (a source-built wheel, a post-install step) each start from the image
    # as built so far, so the final chain is named: frank-0, frank-1, ... (the template's
    # own `FROM engine` stage is then left empty)
    chained = any(x.stage is not None for x in plan.layers)
    current = "frank-0"
    if chained:
        final_part += ["FROM engine AS frank-0", ""]
    for layer in plan.layers:
        if first_kernel is None or layer.index < first_kernel:
            engine_part += [*_layer_steps(layer, staged, mounts=mounts), ""]
        elif layer.stage is not None:
            n = int(current.removeprefix("frank-")) + 1
            final_part += [*_stage_lines(layer, staged, current, n,
                                         reused=layer.index in reused, mounts=mounts), ""]
            current = f"frank-{n}"
        elif layer.kind == "kernel" and not host_built(layer):
            stage = f"kernel-{layer.part}"
            kernel_stages += [f"FROM engine AS {stage}",
                              *_layer_steps(layer, staged, pip=False, mounts=mounts), ""]
            src = layer.files[0].dest if layer.files else f"/opt/frank/kernels/{layer.part}"
            final_part += ["# " + comment(f"kernel {layer.part}: built in stage {stage}"),
                           f"COPY --from={stage} {plain(src)}/ {plain(src)}/"]
            if layer.pip_install:
                final_part.append(run_instruction([pip_step(d) for d in layer.pip_install],
                                                  mounts))
            final_part.append("")
        else:
            final_part += [*_layer_steps(layer, staged, mounts=mounts), ""]
    env = plan.config.env
    config = []
    if env:
        config.append("ENV " + " \\\n    ".join(
            f"{k}={dockerfile_word(v)}" for k, v in env.items()))
    labels = plan.config.labels
    config.append("LABEL " + " \\\n      ".join(
        f"{dockerfile_word(k)}={dockerfile_word(v)}" for k, v in labels.items()))
    config.append(f"ENTRYPOINT {json.dumps(plan.config.entrypoint)}")
    config.append(f"CMD {json.dumps(plan.config.cmd)}")
    for part, commands in plan.checks.items():
        config.append("# " + comment(f"check of {part} (run by frank-launch before the engine "
                                     f"starts, and by frank-launch --check): "
                                     f"{'; '.join(shlex.join(c) for c in commands)}"))
    engine_path = (f"{plan.engine.strategy}: {plan.engine.why}" if plan.engine
                   else "none (no engine part)")
    return Template(template).substitute(
        stack=comment(plan.stack), lock_digest=comment(plan.lock_digest),
        base_image=dockerfile_word(base), source_date_epoch=plan.source_date_epoch,
        engine_path=comment(engine_path),
        engine_layers="\n".join(engine_part).rstrip(),
        kernel_stages="\n".join(kernel_stages).rstrip(),
        final_layers="\n".join(final_part).rstrip(), config="\n".join(config),
        host_note=comment(host_note(plan, staged)),
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
