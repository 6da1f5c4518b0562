"""A sealed trial as Kubernetes Jobs: one Job per engine start, in the sealed order.

Each Job's pod is the arm's engine pod as ``frank render k8s`` makes it (the pushed image by
digest, the weights init step checking every sha256, GPUs, node selector, probes), with the
engine as a sidecar (an init container that keeps running, ``restartPolicy: Always``) and
the workload as the pod's one container: ``driver.py``'s program, which waits for
``/health``, reads the sealed metric's series, runs the workload and prints one
``frank-trial-result`` line. When it exits the Job is complete and the engine is stopped.
``backoffLimit: 0``: a failed start is not retried behind the trial's back.

The start's seal and place in the order are annotations (``frank.dev/trial-digest``,
``frank.dev/start``, ``frank.dev/block``, ``frank.dev/arm``, ``frank.dev/order``), and the
same values are the driver's env, so the result line says which start it measured.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from frank.errors import FrankError
from frank.resolve.lock import Lock
from frank.ship.render.k8s import (
    LABEL,
    ImageRef,
    RenderOptions,
    check_options,
    engine_container,
    labels,
    name_of,
    node_selector,
    pin_annotations,
    to_data,
    volumes,
    weights_container,
)
from frank.trial.design import Start
from frank.trial.metric import parse as parse_metric
from frank.trial.model import Trial

DRIVER = Path(__file__).with_name("driver.py")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class JobOptions:
    """How each start's Job runs its workload."""

    workload: str  # shell command, as `frank trial run --workload`
    workload_image: str | None = None  # default: the arm's own image (it has python3)
    workload_timeout: float = 3600.0
    node: str | None = None  # kubernetes.io/hostname every start runs on


def job_name(trial: Trial, start: Start) -> str:
    """``<trial>-start-007``: a DNS label of at most 63 characters."""
    base = re.sub(r"[^a-z0-9-]", "-", trial.name.lower()).strip("-")[:46].rstrip("-")
    name = f"{base}-start-{start.index:03d}"
    if not _DNS_LABEL.match(name):
        raise FrankError(f"the trial name {trial.name!r} cannot name a Job", field="name")
    return name


def start_job(trial: Trial, trial_digest: str, start: Start, lock: Lock, image: ImageRef,
              opts: RenderOptions, job: JobOptions) -> dict[str, Any]:
    """The Job of one start, as plain data."""
    check_options(opts)
    expr = parse_metric(trial.metric.expr)
    name = job_name(trial, start)
    engine = engine_container(lock, image, opts)
    engine.restart_policy = "Always"  # a sidecar: started before the workload, stopped after
    port = next(p.container_port for p in engine.ports)
    fields = {"FRANK_TRIAL_NAME": trial.name, "FRANK_TRIAL_DIGEST": trial_digest,
              "FRANK_TRIAL_START": str(start.index), "FRANK_TRIAL_BLOCK": str(start.block),
              "FRANK_TRIAL_ARM": start.arm, "FRANK_TRIAL_STACK": lock.stack,
              "FRANK_TRIAL_LOCK_DIGEST": lock.digest, "FRANK_TRIAL_IMAGE": image.digest}
    base_url = f"http://127.0.0.1:{port}"
    env = {**fields, "FRANK_TRIAL_BASE_URL": base_url, "OPENAI_BASE_URL": base_url + "/v1",
           "FRANK_TRIAL_WORKLOAD": job.workload, "FRANK_TRIAL_SERIES": ",".join(expr.series),
           "FRANK_TRIAL_READY_TIMEOUT": f"{opts.ready_timeout:g}",
           "FRANK_TRIAL_WORKLOAD_TIMEOUT": f"{job.workload_timeout:g}"}
    workload = k8s.V1Container(
        name="workload", image=job.workload_image or image.reference,
        image_pull_policy="IfNotPresent",
        command=["python3", "-c", DRIVER.read_text(encoding="utf-8")],
        env=[k8s.V1EnvVar(name=k, value=v) for k, v in sorted(env.items())])
    init = [c for c in (weights_container(lock, image, opts), engine) if c is not None]
    select = node_selector(lock)
    if job.node is not None:
        select["kubernetes.io/hostname"] = job.node
    pod_labels = {**labels(lock, name_of(lock)), f"{LABEL}/trial": trial.name,
                  f"{LABEL}/arm": start.arm, "app.kubernetes.io/component": "trial-start"}
    notes = {**pin_annotations(lock, image), f"{LABEL}/trial": trial.name,
             f"{LABEL}/trial-digest": trial_digest, f"{LABEL}/start": str(start.index),
             f"{LABEL}/block": str(start.block), f"{LABEL}/arm": start.arm,
             f"{LABEL}/order": f"{start.index}/{len(trial.order)}"}
    deadline = int(opts.ready_timeout + job.workload_timeout + 600)
    return to_data(k8s.V1Job(
        api_version="batch/v1", kind="Job",
        metadata=k8s.V1ObjectMeta(name=name, namespace=opts.namespace, labels=pod_labels,
                                  annotations=notes),
        spec=k8s.V1JobSpec(
            backoff_limit=0, completions=1, parallelism=1, active_deadline_seconds=deadline,
            template=k8s.V1PodTemplateSpec(
                metadata=k8s.V1ObjectMeta(labels=pod_labels, annotations=notes),
                spec=k8s.V1PodSpec(
                    init_containers=init, containers=[workload], restart_policy="Never",
                    volumes=volumes(lock, opts), node_selector=select,
                    automount_service_account_token=False, enable_service_links=False,
                    termination_grace_period_seconds=60)))))


def trial_jobs(trial: Trial, trial_digest: str, locks: dict[str, Lock],
               images: dict[str, ImageRef], opts: RenderOptions, job: JobOptions
               ) -> list[dict[str, Any]]:
    """Every start's Job, in the sealed order."""
    for lock in locks.values():
        if int(lock.target.get("nodes", 1)) > 1:
            raise FrankError(f"{lock.stack} runs on {lock.target['nodes']} nodes: a trial "
                             "start is one pod (LeaderWorkerSet trials are not rendered)",
                             field="target.nodes")
    return [start_job(trial, trial_digest, s, locks[s.arm], images[s.arm], opts, job)
            for s in trial.starts()]
