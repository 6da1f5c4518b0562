"""Post-install step: a command whose outputs must land in the final image.

JIT-precompiling a module, building a torch extension from a file a patch adds, editing or
deleting a file of an installed package: each is a step with declared inputs (repo files
or folders, hashed like any part's, copied into the step's stage only), a command run in a
container on the image as built so far, and declared outputs (image paths). Only the
outputs are copied from the step's stage into its layer; an output the command did not
produce stops the build with a line naming the step and the path, and so does a change it
made anywhere else (a file it edited but did not declare would be dropped): the stage's
filesystem is compared before and after the command (``stepfs``), scratch left aside
(``/tmp``, the step's input folders and workdir, Python's bytecode caches). ``removes`` deletes
installed files (a whiteout in the layer); a path that is not there is an error too.

The layer is keyed by the step's spec, its inputs' hashes and every layer below it (the
command reads that image), and the step is recorded in the lock as impure: it runs a
command inside the image, so a container engine builds it (``--builder none`` writes the
Dockerfile context offline).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import ConfigDict, Field, model_validator

from frank.model.archs import Arch, ArchForm
from frank.model.kinds.base import (
    BuildStage,
    FileCopy,
    LayerContribution,
    PartBase,
    PartContext,
    Strict,
)
from frank.model.kinds.env import EnvName
from frank.model.kinds.package import SourceBuild, build_env
from frank.model.pins import ImagePath, OneLine


class StepInput(Strict):
    """A repo file or folder the step reads, placed at ``dest`` in the step's stage."""

    path: str
    dest: ImagePath


def step_dir(part_name: str) -> str:
    """Where a step's inputs land in its stage (not in the image)."""
    return f"/opt/frank/steps/{part_name}"


def check_dir(part_name: str) -> str:
    """Where frank's check of what a step changed keeps its script and state, in the stage."""
    return f"/opt/frank/step-check/{part_name}"


class Step(PartBase):
    """A typed post-install step (see the module docstring)."""

    # `inputs` is also the protocol's method: the field is `inputs_`, spelled `inputs` in
    # manifests and locks
    model_config = ConfigDict(extra="forbid", frozen=True, validate_by_name=True,
                              validate_by_alias=True, serialize_by_alias=True)
    layer_rank: ClassVar[int] = 85  # after packages, kernels, plugins and data it may read
    artifact_fields: ClassVar[tuple[str, ...]] = ()

    kind: Literal["step"]
    run: OneLine  # run by /bin/sh -c in the step's stage, from workdir
    workdir: ImagePath | None = None
    inputs_: list[StepInput] = Field(default=[], alias="inputs")
    outputs: list[ImagePath] = []
    removes: list[ImagePath] = []
    archs: list[Arch] = []
    arch_env: dict[EnvName, ArchForm] = {}
    variables: dict[EnvName, OneLine] = {}  # the command's environment (besides arch_env)

    @model_validator(mode="after")
    def _does_something(self) -> Step:
        if not self.outputs and not self.removes:
            raise ValueError("a step declares the image paths it produces (outputs) or "
                             "deletes (removes)")
        both = set(self.outputs) & set(self.removes)
        if both:
            raise ValueError(f"{sorted(both)[0]} is both an output and removed")
        if bool(self.archs) != bool(self.arch_env):
            raise ValueError("give archs and arch_env together")
        clash = set(self.arch_env) & set(self.variables)
        if clash:
            raise ValueError(f"{sorted(clash)[0]} is set by both arch_env and variables")
        return self

    def removed_distributions(self) -> list[str]:
        """The Python distributions this step takes out: each ``*.dist-info`` folder it
        removes (canonical names). diff and the audit count them as removed (issue 54: a
        step's deletion was invisible to both)."""
        return removed_distributions(self.removes)

    def inputs(self, ctx: PartContext) -> dict[str, str]:
        out: dict[str, str] = {}
        for i, item in enumerate(self.inputs_):
            where = ctx.path(item.path, f"inputs[{i}].path")
            if where.is_dir():
                out[f"{item.path}/"] = ctx.tree_hash(item.path, f"inputs[{i}].path")
            else:
                out[item.path] = ctx.file_hash(item.path, f"inputs[{i}].path")
        return out

    def layer(self, ctx: PartContext) -> LayerContribution | None:
        q = shlex.quote
        env = build_env(SourceBuild(archs=self.archs, arch_env=self.arch_env,
                                      variables=self.variables))
        workdir = self.workdir or step_dir(self.name)
        cd = f"cd {q(workdir)} && "
        # what the command changes outside its outputs is found, not dropped (stepfs)
        check = check_dir(self.name)
        script = f"{check}/stepfs.py"
        skip = [check, step_dir(self.name), *(i.dest for i in self.inputs_)]
        words = {"skip": skip, "allowed": [*self.outputs, *self.removes],
                 "new-scratch": [workdir], "step": [self.name]}
        need = q(f"frank: step {self.name} needs python3 in the image to check what it "
                 "changes")
        run = [f"{{ command -v python3 >/dev/null || {{ echo {need} >&2; exit 1; }}; }}",
               f"python3 {q(script)} save {q(check)}/before --skip {' '.join(map(q, skip))}",
               f"mkdir -p {q(workdir)}",
               f"{cd}{'env ' + ' '.join(env) + ' ' if env else ''}/bin/sh -c {q(self.run)}"]
        for path in self.outputs:
            why = q(f"frank: step {self.name} did not produce its output {path}")
            run.append(f"{{ test -e {q(path)} || {{ echo {why} >&2; exit 1; }}; }}")
        run.append(f"python3 {q(script)} check {q(check)}/before " + " ".join(
            f"--{k} {' '.join(map(q, v))}" for k, v in words.items() if v))
        then = []
        for path in self.removes:
            why = q(f"frank: step {self.name} removes {path}, which is not in the image")
            then.append(f"{{ test -e {q(path)} || {{ echo {why} >&2; exit 1; }}; }} "
                        f"&& rm -rf -- {q(path)}")
        files = tuple(FileCopy(i.path, i.dest) for i in self.inputs_)
        text = (Path(__file__).parent / "stepfs.py").read_text(encoding="utf-8")
        return LayerContribution(
            files=files, generated=((script, text),),
            stage=BuildStage(run=tuple(run), outputs=tuple(self.outputs), then=tuple(then)),
            why=f"post-install step run in a container; the layer holds "
                f"{', '.join(self.outputs) or 'no new files'}"
                f"{' and removes ' + ', '.join(self.removes) if self.removes else ''}")


def removed_distributions(removes: list[str]) -> list[str]:
    """Canonical names of the distributions whose ``*.dist-info`` folders ``removes`` (image
    paths, as a step's lock entry keeps them) names in a site folder."""
    from packaging.utils import canonicalize_name

    out = []
    for path in removes:
        parent, _, folder = path.rstrip("/").rpartition("/")
        if folder.endswith(".dist-info") and parent.endswith(("site-packages", "dist-packages")):
            out.append(str(canonicalize_name(folder[: -len(".dist-info")].rpartition("-")[0])))
    return sorted(set(out))
