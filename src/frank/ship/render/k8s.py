"""A lock as Kubernetes objects that keep every pin: image by digest, weights by revision.

Built with the official ``kubernetes`` client's models (``V1Deployment``, ``V1Service``...)
and turned into plain data by ``ApiClient().sanitize_for_serialization``; the
LeaderWorkerSet, a custom resource the client has no model for, is a dict around pod
templates built with those models and checked against its CRD's published schema
(``frank/render/crd.py``). Output is byte-deterministic: sorted keys, one YAML style, no
time or host in it, so the same lock and image give the same bytes on any machine.

What a stack becomes:

- ``target.nodes`` 1: a Deployment (``strategy: Recreate``: two engines never share the
  GPUs), ``target.replicas`` copies; more than 1: a LeaderWorkerSet of that group size,
  ``RecreateGroupOnPodRestart``, whose Service selects the leaders;
- the image as ``repo@sha256:`` of the push ``frank push`` recorded for this lock;
- the engine command, flags and env from the lock (``VLLM_PLUGINS`` exactly the stack's),
  ``nvidia.com/gpu`` limits from ``target.gpus``, a nodeSelector from ``target.arch`` in
  GPU Feature Discovery's labels, ``/dev/shm`` in memory, startup and readiness probes on
  ``/health``;
- the weights: an init step runs the image's own launcher (``--fetch-only``), which fetches
  exactly the locked revision into a hub-cache volume (a PVC) and checks every file's
  sha256; the engine then reads that volume read-only with ``HF_HUB_OFFLINE=1``;
- annotations with the stack digest and image digest; labels selecting by stack and part.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import yaml
from kubernetes import client as k8s

from frank.assemble.plan import LAUNCHER_IN_IMAGE, LOCK_IN_IMAGE
from frank.errors import FrankError
from frank.resolve.lock import Lock
from frank.run import launch, warmcache
from frank.ship.render.warm import WarmMount

LWS_API = "leaderworkerset.x-k8s.io/v1"
LABEL = "frank.dev"  # label and annotation prefix
PART_LABEL = "part.frank.dev"
HUB_MOUNT = "/frank/hub"
ENGINE = "engine"
HTTP = "http"
# LeaderWorkerSet's pod label that is "0" on each group's leader
LWS_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class ImageRef:
    """The image a pod runs: ``repository@digest`` (the registry's manifest digest)."""

    repository: str
    digest: str

    @property
    def reference(self) -> str:
        """``host/repo@sha256:...``."""
        return f"{self.repository}@{self.digest}"


@dataclass(frozen=True)
class RenderOptions:
    """What the lock does not say: where the objects go and how big the weights volume is."""

    namespace: str | None = None
    weights_size: str = "200Gi"
    storage_class: str | None = None
    weights_claim: str | None = None  # an existing PVC to use instead of rendering one
    ready_timeout: float = 1800.0  # seconds the startup probe allows before /health
    offline_weights: bool = False  # the volume is filled already: the init step only checks
    warm: WarmMount | None = None  # the warm cache the pods mount (``render.warm``)


def check_options(opts: RenderOptions) -> None:
    """Options as Kubernetes will read them; a bad one is one line naming the option."""
    if opts.namespace is not None and not _DNS_LABEL.match(opts.namespace):
        raise FrankError(f"{opts.namespace!r} is not a namespace name (a DNS label)",
                         field="--namespace")
    if not _QUANTITY.match(opts.weights_size):
        raise FrankError(f"{opts.weights_size!r} is not a storage quantity (e.g. 200Gi)",
                         field="--weights-size")
    if opts.weights_claim is not None and not _DNS_LABEL.match(opts.weights_claim):
        raise FrankError(f"{opts.weights_claim!r} is not a claim name", field="--weights-claim")
    if not opts.ready_timeout > 0:
        raise FrankError("must be more than 0 seconds", field="--ready-timeout")


def check_renderable(lock: Lock, opts: RenderOptions) -> None:
    """What a stack or the options get wrong, found before any image is looked for."""
    check_options(opts)
    labels(lock, name_of(lock))
    _port(lock)


def name_of(lock: Lock) -> str:
    """The objects' name: the stack's name, which must be a DNS label."""
    name = lock.stack.replace(".", "-").replace("_", "-")
    # a Service's name is a DNS-1035 label: a letter first (``1served`` is refused there)
    if not _DNS_1035.match(name) or len(name) > 52:  # leaves room for suffixes
        raise FrankError(f"the stack name {lock.stack!r} cannot name Kubernetes objects "
                         "(a DNS label of at most 52 characters)", field="stack")
    return name


def _label_value(value: str, what: str) -> str:
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        raise FrankError(f"{value!r} cannot be a Kubernetes label value (at most 63 "
                         "letters, digits, '-', '_', '.')", field=what)
    return value


def labels(lock: Lock, name: str) -> dict[str, str]:
    """Labels on every object and pod: by stack, and by part (``part.frank.dev/NAME:
    VERSION``), so ``kubectl get pods -l part.frank.dev/rs8`` finds the engines running it."""
    out = {"app.kubernetes.io/name": name, "app.kubernetes.io/component": ENGINE,
           "app.kubernetes.io/managed-by": "frank", f"{LABEL}/stack": name}
    for part in lock.parts:
        key = part.name
        if len(key) > 63 or not _LABEL_VALUE.match(key):
            raise FrankError(f"part name {key!r} cannot be a label key", field="parts")
        out[f"{PART_LABEL}/{key}"] = _label_value(part.version, f"parts.{part.name}.version")
    return out


def selector(name: str) -> dict[str, str]:
    """The labels a Deployment selects (immutable, so only the stack's name)."""
    return {f"{LABEL}/stack": name}


def pin_annotations(lock: Lock, image: ImageRef) -> dict[str, str]:
    """The pins a reader checks against ``frank inspect`` and the lock file."""
    out = {f"{LABEL}/stack-digest": lock.digest, f"{LABEL}/image": image.reference,
           f"{LABEL}/image-digest": image.digest, f"{LABEL}/stack": lock.stack}
    spec = launch.weights_part(lock.model_dump(mode="json"))
    if spec is not None:
        out[f"{LABEL}/weights"] = launch.weights_source(spec)
    return out


def node_selector(lock: Lock) -> dict[str, str]:
    """The closure is linux x86_64; a GPU arch becomes GPU Feature Discovery's compute
    capability labels (``sm_120`` -> major "12", minor "0"; ``sm_90a`` -> "9", "0")."""
    out = {"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
    arch = str(lock.target.get("arch", "cpu"))
    m = re.fullmatch(r"sm_([0-9]+)([0-9])[af]?", arch)
    if m is not None:
        out["nvidia.com/gpu.compute.major"] = m.group(1)
        out["nvidia.com/gpu.compute.minor"] = m.group(2)
    return out


def _port(lock: Lock) -> int:
    host = lock.flags.get("host")
    if isinstance(host, str) and host in _LOOPBACK:
        raise FrankError(f"{host}: in a pod the probes and the Service reach the "
                         "pod's IP, so the engine must listen on it; set host = \"0.0.0.0\" in "
                         "the stack (or in a stack that extends it)", field="flags.host")
    port = lock.flags.get("port", 8000)
    if isinstance(port, bool) or not isinstance(port, int | str) or not str(port).isdigit() \
            or not 0 < int(port) < 65536:
        raise FrankError(f"{port!r} is not a port", field="flags.port")
    return int(port)


def _weights(lock: Lock) -> dict[str, Any] | None:
    return launch.weights_part(lock.model_dump(mode="json"))


def model_arg(lock: Lock) -> str:
    """What the engine is given as its model: the pinned snapshot's folder in the mounted hub
    cache (``models--OWNER--NAME/snapshots/REVISION``), a local part's directory, or the
    model's name when no weights part pins it."""
    spec = _weights(lock)
    if spec is None:
        return str(lock.model.get("name", ""))
    return str(launch.weights_folder(spec, {"HF_HUB_CACHE": HUB_MOUNT}, None))


def weights_mount(lock: Lock) -> str | None:
    """Where the weights volume is mounted (None: no weights part)."""
    spec = _weights(lock)
    if spec is None:
        return None
    return str(spec["path"]) if spec.get("path") else HUB_MOUNT


def engine_env(lock: Lock, warm: bool = False) -> list[Any]:
    """The lock's env, ``VLLM_PLUGINS`` exactly the stack's, and the hub cache the volume
    holds, offline: the engine never asks the hub. With a warm cache, every engine cache
    points into its folder (as `frank run` points them)."""
    env = launch.engine_env(lock.model_dump(mode="json"), {})
    if warm:
        env.update(warmcache.engine_env())
    if weights_mount(lock) == HUB_MOUNT:
        env.pop("HF_HOME", None)
        env.pop("HUGGINGFACE_HUB_CACHE", None)
        env["HF_HUB_CACHE"] = HUB_MOUNT
        env["HF_HUB_OFFLINE"] = "1"
    return [k8s.V1EnvVar(name=k, value=literal(v)) for k, v in sorted(env.items())]


def literal(value: str) -> str:
    """``value`` as Kubernetes passes it on: the kubelet expands ``$(VAR)`` in a container's
    command, args and env values and reduces ``$$`` to ``$``, so every ``$`` is doubled and
    the pod runs what the lock says, not what the node's variables make of it."""
    return value.replace("$", "$$")


def _probe(path: str, period: int, failures: int) -> Any:
    return k8s.V1Probe(http_get=k8s.V1HTTPGetAction(path=path, port=HTTP),
                       period_seconds=period, failure_threshold=failures, timeout_seconds=5)


def engine_container(lock: Lock, image: ImageRef, opts: RenderOptions, *,
                     extra_args: tuple[str, ...] = (), serves: bool = True) -> Any:
    """The engine: the lock's command, model folder and flags, GPUs, shm, weights, probes."""
    port = _port(lock)
    mounts = [k8s.V1VolumeMount(name="dshm", mount_path="/dev/shm")]
    mount = weights_mount(lock)
    if mount is not None:
        mounts.append(k8s.V1VolumeMount(name="weights", mount_path=mount, read_only=True))
    if opts.warm is not None:
        mounts.append(k8s.V1VolumeMount(name="warm", mount_path=warmcache.IN_CONTAINER))
    gpus = int(lock.target.get("gpus", 0))
    resources = k8s.V1ResourceRequirements(limits={"nvidia.com/gpu": str(gpus)}) if gpus \
        else None
    container = k8s.V1Container(
        name=ENGINE, image=image.reference, image_pull_policy="IfNotPresent",
        command=[literal(c) for c in lock.command],
        # frank's own extra args may name the pod's variables ($(LWS_WORKER_INDEX))
        args=[*(literal(a) for a in [model_arg(lock), *launch.flag_args(lock.flags)]),
              *extra_args],
        env=engine_env(lock, opts.warm is not None), resources=resources,
        volume_mounts=mounts)
    if serves:
        container.ports = [k8s.V1ContainerPort(name=HTTP, container_port=port,
                                               protocol="TCP")]
        container.startup_probe = _probe("/health", 10, max(1, math.ceil(
            opts.ready_timeout / 10)))
        container.readiness_probe = _probe("/health", 10, 3)
    return container


def weights_container(lock: Lock, image: ImageRef, opts: RenderOptions) -> Any | None:
    """The init step: the image's launcher fetches the locked revision (or finds it in the
    volume) and checks every file's sha256 before the engine may start."""
    mount = weights_mount(lock)
    if mount is None:
        return None
    args = ["--lock", LOCK_IN_IMAGE, "--fetch-only"]
    if mount == HUB_MOUNT:
        args += ["--cache-dir", HUB_MOUNT]
    return k8s.V1Container(
        name="weights", image=image.reference, image_pull_policy="IfNotPresent",
        command=["python3", LAUNCHER_IN_IMAGE], args=args,
        env=[k8s.V1EnvVar(name="HF_HUB_OFFLINE", value="1" if opts.offline_weights else "0")],
        volume_mounts=[k8s.V1VolumeMount(name="weights", mount_path=mount,
                                         read_only=opts.offline_weights)])


WARM_ARTIFACT_MOUNT = "/frank/warm-artifact"


def warm_container(image: ImageRef, opts: RenderOptions) -> Any | None:
    """The init step that puts the warm cache in ``/frank/warm``: ``warm_init.py`` run by
    the engine image's python3, reading the artifact from its image volume or pulling it by
    digest; every digest checked, or the pod does not start."""
    warm = opts.warm
    if warm is None:
        return None
    from importlib.resources import files

    program = files("frank.ship.render").joinpath("warm_init.py").read_text(encoding="utf-8")
    mounts = [k8s.V1VolumeMount(name="warm", mount_path=warmcache.IN_CONTAINER)]
    if warm.image_volume:
        args = ["volume", WARM_ARTIFACT_MOUNT, warm.layer, warmcache.IN_CONTAINER]
        mounts.append(k8s.V1VolumeMount(name="warm-artifact", mount_path=WARM_ARTIFACT_MOUNT,
                                        read_only=True))
    else:
        args = ["pull", warm.reference, warm.layer, warmcache.IN_CONTAINER]
    return k8s.V1Container(
        name="warm-cache", image=image.reference, image_pull_policy="IfNotPresent",
        command=["python3", "-c", literal(program)], args=[literal(a) for a in args],
        volume_mounts=mounts)


def claim_name(lock: Lock, opts: RenderOptions) -> str:
    """The weights volume's claim: the one given, or ``<stack>-weights``."""
    return opts.weights_claim or f"{name_of(lock)}-weights"


def volumes(lock: Lock, opts: RenderOptions) -> list[Any]:
    """``/dev/shm`` in memory and, with weights, the claim holding them."""
    out = [k8s.V1Volume(name="dshm", empty_dir=k8s.V1EmptyDirVolumeSource(medium="Memory"))]
    if weights_mount(lock) is not None:
        out.append(k8s.V1Volume(name="weights", persistent_volume_claim=(
            k8s.V1PersistentVolumeClaimVolumeSource(claim_name=claim_name(lock, opts)))))
    if opts.warm is not None:
        out.append(k8s.V1Volume(name="warm", empty_dir=k8s.V1EmptyDirVolumeSource()))
        if opts.warm.image_volume:
            out.append(k8s.V1Volume(name="warm-artifact", image=k8s.V1ImageVolumeSource(
                reference=opts.warm.reference, pull_policy="IfNotPresent")))
    return out


def pod_spec(lock: Lock, image: ImageRef, opts: RenderOptions, *, extra_args: tuple[str, ...]
             = (), serves: bool = True, restart_policy: str | None = None) -> Any:
    """One engine pod: init steps for the weights and the warm cache, the engine."""
    init = [c for c in (weights_container(lock, image, opts), warm_container(image, opts))
            if c is not None]
    return k8s.V1PodSpec(
        init_containers=init or None,
        containers=[engine_container(lock, image, opts, extra_args=extra_args, serves=serves)],
        volumes=volumes(lock, opts), node_selector=node_selector(lock),
        restart_policy=restart_policy, automount_service_account_token=False,
        enable_service_links=False, termination_grace_period_seconds=60)


def _meta(lock: Lock, image: ImageRef, opts: RenderOptions, name: str) -> Any:
    return k8s.V1ObjectMeta(name=name, namespace=opts.namespace,
                            labels=labels(lock, name_of(lock)),
                            annotations=pin_annotations(lock, image))


def deployment(lock: Lock, image: ImageRef, opts: RenderOptions) -> Any:
    """One node per engine: a Deployment, Recreate (the old engine frees the GPUs first)."""
    name = name_of(lock)
    return k8s.V1Deployment(
        api_version="apps/v1", kind="Deployment", metadata=_meta(lock, image, opts, name),
        spec=k8s.V1DeploymentSpec(
            replicas=int(lock.target.get("replicas", 1)),
            strategy=k8s.V1DeploymentStrategy(type="Recreate"),
            selector=k8s.V1LabelSelector(match_labels=selector(name)),
            template=k8s.V1PodTemplateSpec(
                metadata=k8s.V1ObjectMeta(labels=labels(lock, name),
                                          annotations=pin_annotations(lock, image)),
                spec=pod_spec(lock, image, opts))))


def leader_worker_set(lock: Lock, image: ImageRef, opts: RenderOptions) -> dict[str, Any]:
    """More than one node per engine: a LeaderWorkerSet of ``target.nodes`` pods per group.

    Every pod runs the lock's command; vLLM's multi-node flags join them: the leader serves
    (``--node-rank 0``), the workers run ``--headless`` at their LWS index, all pointed at
    the leader's address that LeaderWorkerSet puts in each pod's env.
    """
    name = name_of(lock)
    nodes = int(lock.target.get("nodes", 1))
    join = ("--nnodes", str(nodes), "--master-addr", "$(LWS_LEADER_ADDRESS)")
    def template(args: tuple[str, ...], serves: bool) -> dict[str, Any]:
        tmpl = k8s.V1PodTemplateSpec(
            metadata=k8s.V1ObjectMeta(labels=labels(lock, name),
                                      annotations=pin_annotations(lock, image)),
            spec=pod_spec(lock, image, opts, extra_args=args, serves=serves))
        return to_data(tmpl)

    meta = to_data(_meta(lock, image, opts, name))
    return {
        "apiVersion": LWS_API, "kind": "LeaderWorkerSet", "metadata": meta,
        "spec": {
            "replicas": int(lock.target.get("replicas", 1)),
            "startupPolicy": "LeaderReady",
            "rolloutStrategy": {"type": "RollingUpdate",
                                "rollingUpdateConfiguration": {"maxUnavailable": 1,
                                                               "maxSurge": 0}},
            "leaderWorkerTemplate": {
                "size": nodes,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": template((*join, "--node-rank", "0"), True),
                "workerTemplate": template(
                    (*join, "--node-rank", "$(LWS_WORKER_INDEX)", "--headless"), False),
            },
        },
    }


def service(lock: Lock, image: ImageRef, opts: RenderOptions) -> Any:
    """The engine's port; with a LeaderWorkerSet only the leaders (worker index 0)."""
    name = name_of(lock)
    select = selector(name)
    if int(lock.target.get("nodes", 1)) > 1:
        select = {**select, LWS_WORKER_INDEX: "0"}
    # only the stack's name: a new image or part version leaves the Service as it is
    meta = k8s.V1ObjectMeta(
        name=name, namespace=opts.namespace,
        labels={k: v for k, v in labels(lock, name).items() if not k.startswith(PART_LABEL)},
        annotations={f"{LABEL}/stack": lock.stack})
    return k8s.V1Service(
        api_version="v1", kind="Service", metadata=meta,
        spec=k8s.V1ServiceSpec(type="ClusterIP", selector=select, ports=[k8s.V1ServicePort(
            name=HTTP, port=_port(lock), target_port=HTTP, protocol="TCP")]))


def weights_claim(lock: Lock, image: ImageRef, opts: RenderOptions) -> Any | None:
    """The hub-cache volume (None when the stack has no weights or a claim is given).
    Shared by more than one pod (replicas, nodes), it must be ReadWriteMany."""
    if weights_mount(lock) is None or opts.weights_claim is not None:
        return None
    pods = int(lock.target.get("replicas", 1)) * int(lock.target.get("nodes", 1))
    return k8s.V1PersistentVolumeClaim(
        api_version="v1", kind="PersistentVolumeClaim",
        # only what the volume holds: a new image or part version leaves the claim as it is
        metadata=k8s.V1ObjectMeta(
            name=claim_name(lock, opts), namespace=opts.namespace,
            labels={k: v for k, v in labels(lock, name_of(lock)).items()
                    if not k.startswith(PART_LABEL)} | {"app.kubernetes.io/component": "weights"},
            annotations={k: v for k, v in pin_annotations(lock, image).items()
                         if k == f"{LABEL}/weights"}),
        spec=k8s.V1PersistentVolumeClaimSpec(
            access_modes=["ReadWriteMany" if pods > 1 else "ReadWriteOnce"],
            storage_class_name=opts.storage_class,
            resources=k8s.V1VolumeResourceRequirements(
                requests={"storage": opts.weights_size})))


def to_data(obj: Any) -> dict[str, Any]:
    """A client model (or a dict of them) as plain JSON data, ``None`` fields dropped."""
    data: dict[str, Any] = k8s.ApiClient().sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]
    return data


def render_objects(lock: Lock, image: ImageRef, opts: RenderOptions | None = None
                   ) -> list[dict[str, Any]]:
    """Every object of the stack as plain data, in apply order (claim, workload, service)."""
    opts = opts or RenderOptions()
    check_options(opts)
    out: list[dict[str, Any]] = []
    claim = weights_claim(lock, image, opts)
    if claim is not None:
        out.append(to_data(claim))
    if int(lock.target.get("nodes", 1)) > 1:
        from frank.ship.render.crd import validate_lws

        lws = leader_worker_set(lock, image, opts)
        validate_lws(lws)
        out.append(lws)
    else:
        out.append(to_data(deployment(lock, image, opts)))
    out.append(to_data(service(lock, image, opts)))
    return out


class _Dumper(yaml.SafeDumper):
    """PyYAML's safe dumper, writing a string of several lines as a literal block (``|``),
    so a program in a container's args reads as a program."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value and not any(c in value for c in "\t\r") \
        and value == value.rstrip(" ") else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump_yaml(obj: dict[str, Any]) -> str:
    """One object as YAML: sorted keys, block style, no line folding: the same bytes always."""
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=True, default_flow_style=False,
                     width=1 << 30, allow_unicode=False, explicit_start=False)


def file_name(obj: dict[str, Any]) -> str:
    """``deployment-served.yaml``: kind and name, so a directory holds one file per object."""
    return f"{str(obj['kind']).lower()}-{obj['metadata']['name']}.yaml"


def header(lock: Lock) -> str:
    """The first line of every rendered file: what made it."""
    return f"# rendered by frank render k8s from stack {lock.stack} ({lock.digest}); do not edit\n"


def stream(lock: Lock, objects: list[dict[str, Any]]) -> str:
    """All objects as one multi-document YAML stream (``kubectl apply -f -``)."""
    return header(lock) + "".join(f"---\n{dump_yaml(o)}" for o in objects)
