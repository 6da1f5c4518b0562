"""`frank trial`: plan, seal, run, record, decide and adopt a pre-registered A/B trial."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from frank.cli.output import SECONDS


@click.group()
def trial() -> None:
    """A part goes in only through a test whose rule was written before it ran."""


@trial.command()
@click.argument("a")
@click.argument("b")
@click.option("--name", required=True, help="Trial name: trials/NAME.toml.")
@click.option("--metric", required=True,
              help="Expression over Prometheus series deltas and json:KEY, e.g. "
                   "'vllm:e2e_request_latency_seconds_sum - vllm:request_queue_time_seconds_sum'.")
@click.option("--label", default=None, help="The metric in words (default: the expression).")
@click.option("--direction", type=click.Choice(["lower", "higher"]), required=True,
              help="Which way is better.")
@click.option("--design", "kind", type=click.Choice(["blocks", "balanced", "permutation"]),
              default="blocks", show_default=True)
@click.option("--blocks", type=click.IntRange(min=1), default=None,
              help="Blocks (blocks and permutation designs).")
@click.option("--starts-per-arm", type=click.IntRange(min=1), default=None,
              help="n of the balanced design's n + n starts (default 4).")
@click.option("--alpha", type=click.FloatRange(min=0, max=1, min_open=True, max_open=True),
              default=0.05, show_default=True)
@click.option("--seed", type=click.IntRange(min=0), default=None,
              help="Seed of the run order (default: drawn and recorded).")
@click.option("--subject", default=None,
              help="The part the trial is about; refused unless it is the one part B changes.")
@click.option("--seal", "do_seal", is_flag=True, help="Seal the plan right away.")
def plan(a: str, b: str, name: str, metric: str, label: str | None, direction: str,
         kind: str, blocks: int | None, starts_per_arm: int | None, alpha: float,
         seed: int | None, subject: str | None, do_seal: bool) -> None:
    """Write trials/NAME.toml comparing stack A (current) with stack B (candidate).

    B must be A with one part added, removed or at another version: that part and its change
    are the trial's [subject], sealed with the rule, and the only part adopt may touch.
    """
    from frank.trial.plan import plan as make_plan

    path = make_plan(a, b, name=name, metric=metric, label=label,
                     direction=direction,  # type: ignore[arg-type]
                     kind=kind,  # type: ignore[arg-type]
                     blocks=blocks, alpha=alpha, seed=seed, starts_per_arm=starts_per_arm,
                     seal=do_seal, subject=subject)
    from frank.trial.model import read_trial

    about = read_trial(path).subject
    click.echo(f"wrote {path}{' (sealed)' if do_seal else ''}"
               f"{f'; subject: {about.describe()}' if about else ''}")


@trial.command()
@click.argument("name")
def seal(name: str) -> None:
    """Seal the rule and the order: content hash and UTC time; later edits are refused."""
    from frank.trial.model import trial_path
    from frank.trial.seal import seal_file

    sealed = seal_file(trial_path(name))
    assert sealed.seal is not None
    click.echo(f"sealed {name}: {sealed.seal.hash} at {sealed.seal.time}")


@trial.command()
@click.argument("name")
@click.option("--workload", required=True,
              help="Shell command run against each start (env FRANK_TRIAL_BASE_URL).")
@click.option("--ready-timeout", type=SECONDS, default=600.0, show_default=True)
@click.option("--workload-timeout", type=float, default=3600.0, show_default=True)
@click.option("--stop-timeout", type=float, default=60.0, show_default=True)
@click.option("--keep-going", is_flag=True, help="Go on after a crashed start.")
@click.option("--no-progress", is_flag=True, help="No progress bar (logs, CI).")
@click.option("--from", "source", type=click.Choice(["image", "host"]), default="image",
              show_default=True,
              help="image: start each arm's built image (out/<stack>/image, its digest "
                   "recorded per start); host: the launcher with the host's packages.")
@click.option("--engine", "engine_name", default="auto", show_default=True,
              type=click.Choice(["auto", "buildah", "podman", "docker"]),
              help="Container engine for image starts; auto: the first found.")
@click.option("--hub-cache", type=click.Path(path_type=Path), default=None,
              help="Host hub cache mounted for image starts (default: HF_HUB_CACHE / "
                   "HF_HOME, the stack's env over yours).")
def run(name: str, workload: str, ready_timeout: float, workload_timeout: float,
        stop_timeout: float, keep_going: bool, no_progress: bool, source: str,
        engine_name: str, hub_cache: Path | None) -> None:
    """Run the sealed order: start each start's arm, run the workload, record it.

    Each arm starts from its image (`frank compose` it first), which must be built from the
    lock the plan seals; every blob is re-hashed before each start and the image's digest
    is recorded with the start. The workload runs once per start with FRANK_TRIAL_BASE_URL,
    OPENAI_BASE_URL, FRANK_TRIAL_ARM, FRANK_TRIAL_BLOCK, FRANK_TRIAL_START (and, from an
    image, FRANK_TRIAL_IMAGE) set. Starts already recorded are skipped, so running again
    resumes after a crash.
    """
    from frank.run.supervise import Interrupted
    from frank.trial.model import trial_path
    from frank.trial.run import RunOptions, run_trial

    opts = RunOptions(workload=workload, ready_timeout=ready_timeout,
                      workload_timeout=workload_timeout, stop_timeout=stop_timeout,
                      keep_going=keep_going,
                      source="host" if source == "host" else "image",
                      engine=engine_name, hub_cache=hub_cache)
    try:
        new = run_trial(trial_path(name), opts, progress=not no_progress)
    except Interrupted as exc:
        click.echo(f"frank: interrupted (signal {exc.signum}): the start in flight was not "
                   "recorded and its container is removed; run again to resume", err=True)
        sys.exit(128 + exc.signum)
    crashed = sum(1 for r in new if r.status == "crash")
    click.echo(f"ran {len(new)} start(s), {crashed} crashed")
    if crashed:  # --keep-going: all recorded, but the trial cannot be decided as it stands
        sys.exit(1)


@trial.command("render")
@click.argument("name")
@click.option("--workload", required=True,
              help="Shell command each start's Job runs against its engine (as for run).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=None,
              help="Write one file per Job here (default: one stream on stdout).")
@click.option("--registry", default=None, metavar="HOST/REPO",
              help="Use the arms' images pushed there (default: each lock's latest push).")
@click.option("--namespace", default=None, help="metadata.namespace of every object.")
@click.option("--node", default=None,
              help="Run every start on this node (kubernetes.io/hostname), as a local trial "
                   "runs every start on one machine.")
@click.option("--workload-image", default=None,
              help="Image of the workload container (default: the arm's image).")
@click.option("--weights-size", default="200Gi", show_default=True)
@click.option("--storage-class", default=None)
@click.option("--weights-claim", default=None, help="An existing claim holding the weights.")
@click.option("--ready-timeout", type=SECONDS, default=1800.0, show_default=True)
@click.option("--workload-timeout", type=float, default=3600.0, show_default=True)
def render_cmd(name: str, workload: str, out_dir: Path | None, registry: str | None,
               namespace: str | None, node: str | None, workload_image: str | None,
               weights_size: str, storage_class: str | None, weights_claim: str | None,
               ready_timeout: float, workload_timeout: float) -> None:
    """One Kubernetes Job per start of the sealed order (and the arms' weights claims).

    Each Job is the arm's engine pod (its pushed image by digest, the same weights check,
    GPUs and probes) with the workload beside it; the start's seal and order are its
    annotations. Run the Jobs one at a time in order and collect each one's log (`kubectl
    logs job/NAME -c workload > DIR/NAME.log`); `frank trial record NAME DIR` imports them.
    """
    from frank.resolve.lock import Lock
    from frank.ship.pushes import pushed_image
    from frank.ship.render.files import render_files, report, write_dir
    from frank.ship.render.k8s import ImageRef, RenderOptions, check_renderable, stream, to_data
    from frank.ship.render.k8s import weights_claim as claim_of
    from frank.trial.jobs import JobOptions, trial_jobs
    from frank.trial.model import repo_of, trial_path
    from frank.trial.run import current_locks
    from frank.trial.seal import load_sealed

    path = trial_path(name)
    sealed, digest = load_sealed(path)
    root = repo_of(path)
    locks = {arm: Lock.model_validate(data) for arm, data in current_locks(sealed, path).items()}
    opts = RenderOptions(namespace=namespace, weights_size=weights_size,
                         storage_class=storage_class, weights_claim=weights_claim,
                         ready_timeout=ready_timeout)
    for lock in locks.values():
        check_renderable(lock, opts)
    images = {}
    for arm, lock in locks.items():
        stem = Path(getattr(sealed.arms, arm).stack).stem
        push = pushed_image(root, stem, lock.digest, registry)
        images[arm] = ImageRef(repository=push.repository, digest=push.digest)
    jobs = trial_jobs(sealed, digest, locks, images, opts,
                      JobOptions(workload=workload, workload_image=workload_image,
                                 workload_timeout=workload_timeout, node=node))
    claims: dict[str, dict[str, Any]] = {}
    for arm in ("A", "B"):
        claim = claim_of(locks[arm], images[arm], opts)
        if claim is not None:
            data = to_data(claim)
            claims.setdefault(data["metadata"]["name"], data)
    objects = [*claims.values(), *jobs]
    lock_a = locks["A"]
    if out_dir is None:
        click.echo(stream(lock_a, objects), nl=False)
        return
    for line in report(out_dir, *write_dir(out_dir, render_files(lock_a, objects))):
        click.echo(line)
    click.echo(f"{len(jobs)} Jobs for {sealed.name} ({digest}); run them one at a time in "
               "the sealed order")


@trial.command()
@click.argument("name")
@click.argument("results", type=click.Path(path_type=Path))
def record(name: str, results: Path) -> None:
    """Import starts measured elsewhere for the same sealed plan: a CSV or JSON file, or the
    logs of the Jobs `frank trial render` made (a .log file or a folder of them)."""
    from frank.trial.model import trial_path
    from frank.trial.record import record_file
    from frank.trial.seal import load_sealed

    path = trial_path(name)
    sealed, digest = load_sealed(path)
    new = record_file(path, sealed, digest, results)
    click.echo(f"recorded {len(new)} start(s) from {results}")


@trial.command()
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the decision as JSON.")
def decide(name: str, as_json: bool) -> None:
    """Apply the sealed rule with its exact test and print the table users publish; the
    starts and the verdict are drawn beside it in trials/NAME.decision.svg."""
    from frank.trial.chart import write_chart
    from frank.trial.decide import decide_file, render
    from frank.trial.model import trial_path

    path = trial_path(name)
    decision = decide_file(path)
    chart = write_chart(decision, path)
    if as_json:
        click.echo(json.dumps({**decision.to_json(), "chart": str(chart)}, indent=2,
                              sort_keys=True))
    else:
        render(decision)
        click.echo(f"chart: {chart}")


@trial.command()
@click.argument("name")
@click.option("--into", "into", default="stacks/served.toml", show_default=True,
              help="The served stack the candidate part goes into if adopted.")
@click.option("--rejected", is_flag=True,
              help="If not adopted, mark the part rejected (default: parked).")
def adopt(name: str, into: str, rejected: bool) -> None:
    """Write the decision into the part's manifest and, if adopted, the served stack."""
    from frank.trial.adopt import adopt as do_adopt
    from frank.trial.model import trial_path

    click.echo(do_adopt(trial_path(name), into, rejected=rejected))
