"""The container commands that run a verified image: one plan, printed or executed.

Why a plan first: ``frank run --print`` must show exactly what would run, so the commands
are built once, as argv lists (nothing goes through a shell), and the runner executes the
same lists. Per engine:

- buildah: ``buildah from oci:LAYOUT`` makes a working container, ``buildah run
  --isolation chroot`` runs the image's entrypoint in it (``podman run`` fails on setrlimit
  in unprivileged CI containers, buildah does not). Chroot isolation shares the host's
  network, so the engine's port is on 127.0.0.1 as it is; ``buildah rm`` removes it.
- podman: ``podman create oci:LAYOUT``, then ``podman start --attach`` (between the two its
  root is checked against the layout, as buildah's is). It publishes the port on 127.0.0.1
  (``-p``), or shares the host's network when the lock binds the engine to loopback, which a
  published port cannot reach. GPUs: ``--device nvidia.com/gpu=all`` (podman, buildah, CDI).
- docker: through the ``docker`` SDK, not the CLI (``run.dockerrun``): the layout streamed
  into the daemon, the container made from the id the daemon reports (checked against the
  config digest), the same network rule, ``/dev/shm`` sized, the lock's GPUs as a device
  request. ``run`` then holds the equivalent ``docker run`` line, to read, and ``docker``
  what the SDK is given.

The weights never enter the image: the host's hub cache (or a model folder) is mounted
read-only at a fixed path and the launcher is pointed at it, offline.
"""

from __future__ import annotations

import os
import re
import shlex
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from frank.assemble.engines import Engine
from frank.errors import FrankError
from frank.image.oci import layout_manifests
from frank.image.verify import VerifiedImage
from frank.run import launch
from frank.run.dockerrun import DEFAULT_SHM, OWNER_LABEL, DockerSpec, cli_line, owner
from frank.run.warmcache import IN_CONTAINER as WARM_IN_CONTAINER
from frank.store.tmpdirs import owned_name

HUB_IN_CONTAINER = "/frank/hub"
RUN_ENV = "FRANK_RUN"  # the container's name, in the environment of every process in it
# A path engines accept as an image name (they name an image pulled from oci:PATH after PATH).
_TAME = re.compile(r"(/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)+")
_LOOPBACK = ("127.", "localhost", "::1")


# A writable folder per image digest, kept between runs of that image (frank's cache).
RUN_CACHE_IN_CONTAINER = "/frank/cache"
PYCACHE_IN_CONTAINER = f"{RUN_CACHE_IN_CONTAINER}/pycache"
VLLM_CACHE_IN_CONTAINER = f"{RUN_CACHE_IN_CONTAINER}/vllm"


@dataclass(frozen=True)
class Mount:
    """A host folder the container sees read-only."""

    host: str
    container: str

    def spec(self) -> str:
        return f"{self.host}:{self.container}:ro"


@dataclass(frozen=True)
class Weights:
    """How the weights reach the launcher: mounts, launcher arguments, environment, and
    the host folder that must hold every locked file (checked before a real run)."""

    mounts: list[Mount] = field(default_factory=list)
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    host_folder: Path | None = None
    mount_root: Path | None = None


@dataclass(frozen=True)
class RunPlan:
    """Everything ``frank run`` does, as argv lists."""

    engine: str
    engine_args: list[str]  # the engine and its global flags (private storage, vfs)
    image: str
    layout: str
    stack: str
    lock_digest: str
    container: str
    url: str
    prepare: list[list[str]]
    run: list[str]
    cleanup: list[list[str]]
    mounts: list[Mount]
    env: dict[str, str]
    gpus: int
    serve: bool = True  # wait for /health; False when ARGS make the entrypoint a one-off
    link: str | None = None  # a tame-named link to the layout, made for the run
    docker: DockerSpec | None = None  # the container the SDK makes (engine docker)
    run_cache: str | None = None  # the writable per-image folder at RUN_CACHE_IN_CONTAINER
    warm_dir: str | None = None  # the writable warm cache folder at /frank/warm (run.warmuse)
    warm_note: str = ""  # what the ready line says of the warm cache

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    def as_text(self) -> str:
        ready = f"ready when {self.url} answers 200" if self.serve else "its output and exit code"
        lines = [f"# {self.stack} image {self.image} through {self.engine}; {ready}"]
        if self.docker is not None:
            lines.append(f"# the layout is streamed into the Docker daemon (docker SDK) as "
                         f"{docker_tag(self.image)}; the container starts from the image id "
                         "the daemon reports, checked to be the image's config digest")
        if self.link:
            lines.append(f"# {self.link}: a layout listing only {self.image} of {self.layout} "
                         "(its blobs linked)")
        lines += [shlex.join(c) for c in [*self.prepare, self.run, *self.cleanup]]
        return "\n".join(lines)


def warm_mounts(plan: RunPlan) -> list[tuple[str, str, bool]]:
    """The warm cache folder as a writable mount (host, container, read-only), if any."""
    return [(plan.warm_dir, WARM_IN_CONTAINER, False)] if plan.warm_dir else []


def warm_suffix(plan: RunPlan) -> str:
    """What the ready line adds about the warm cache: ``; warm cache sha256:... (made on
    ...)`` or why none was used."""
    return f"; {plan.warm_note}" if plan.warm_note else ""


def weights(lock: dict[str, Any], *, hub_cache: Path | None, model_dir: Path | None,
            env: dict[str, str]) -> Weights:
    """Mount the weights the lock pins where the launcher in the container will look.

    A local-directory part is mounted at its locked (absolute) path. Hub weights: the hub
    cache is mounted at /frank/hub and the launcher gets ``--cache-dir /frank/hub``;
    ``--model-dir`` instead mounts one folder of the files as the pinned snapshot there.
    """
    spec = launch.weights_part(lock)
    if spec is None:
        if hub_cache or model_dir:
            raise FrankError("the image's lock has no weights part to mount",
                             field="--model-dir" if model_dir else "--hub-cache")
        return Weights()
    if spec.get("path"):
        if hub_cache:
            raise FrankError(f"weights {spec['name']} are a local directory, not hub files "
                             "(use --model-dir)", field="--hub-cache")
        host = _folder(model_dir or Path(spec["path"]))
        return Weights([Mount(str(host), str(spec["path"]))], host_folder=host, mount_root=host)
    offline = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": HUB_IN_CONTAINER}
    args = ["--cache-dir", HUB_IN_CONTAINER]
    if model_dir:
        host = _folder(model_dir)
        inside = launch.weights_folder(spec, {}, HUB_IN_CONTAINER)
        return Weights([Mount(str(host), str(inside))], args, offline, host, host)
    engine_env = launch.engine_env(lock, env)
    cache = _folder(hub_cache or launch.hub_cache(engine_env, None))
    folder = launch.weights_folder(spec, {}, str(cache))
    return Weights([Mount(str(cache), HUB_IN_CONTAINER)], args, offline, folder, cache)


def _folder(path: Path) -> Path:
    return Path(path).expanduser().absolute()


def check_weights(lock: dict[str, Any], w: Weights, *, files: bool) -> None:
    """Before a real run: every mounted folder exists and, with ``files``, every locked file
    is in the host folder and inside what is mounted (a hub snapshot's links must point into
    the mounted cache, not out of it). The hashes are the launcher's job, in the container."""
    for m in w.mounts:
        if not Path(m.host).is_dir():
            raise FrankError(f"no such folder to mount at {m.container} (give the weights' "
                             "hub cache with --hub-cache, HF_HUB_CACHE or HF_HOME, or their "
                             "folder with --model-dir)", file=m.host)
    spec = launch.weights_part(lock)
    if not files or spec is None or w.host_folder is None or w.mount_root is None:
        return
    root = w.mount_root.resolve()
    for name in sorted(spec.get("files", {})):
        path = w.host_folder / name
        if not path.is_file():
            raise FrankError(f"weights {launch.weights_source(spec)}: {name} is not here "
                             "(fetch them into this hub cache, or pass --hub-cache or "
                             "--model-dir)", file=path)
        if not path.resolve().is_relative_to(root):
            raise FrankError(f"weights {launch.weights_source(spec)}: {name} links out of "
                             f"the mounted folder {root}, the container could not read it "
                             "(pass the hub cache it links into, or a folder of real files)",
                             file=path)


def _network(engine: str, host: str, port: int) -> list[str]:
    if engine == "buildah":
        return []  # chroot isolation: the host's network
    if host.startswith(_LOOPBACK):
        return ["--network", "host"]  # a published port cannot reach the container's loopback
    return ["-p", f"127.0.0.1:{port}:{port}"]


def _gpu_args(engine: str, gpus: int) -> list[str]:
    if gpus <= 0:
        return []
    return ["--device", "nvidia.com/gpu=all"]  # CDI; docker's are device requests


def docker_tag(digest: str) -> str:
    """The name a run gives the image in a Docker daemon (the id is what is started)."""
    return f"frank-run:{digest.split(':', 1)[1]}"


def plan(image: VerifiedImage, lock: dict[str, Any], engine: Engine, *, w: Weights,
         extra_env: dict[str, str], args: list[str], shm_size: str = DEFAULT_SHM,
         ipc: str = "private", warm_dir: Path | None = None,
         warm_env: dict[str, str] | None = None, warm_note: str = "") -> RunPlan:
    """The commands that run ``image`` with ``engine``: entrypoint, then the launcher's
    weight arguments and ``args`` (in place of the image's cmd). ``warm_dir``: mounted
    writable at ``warmcache.IN_CONTAINER`` with ``warm_env`` pointing the engine's caches
    there (``run.warmuse``)."""
    tag = uuid.uuid4().hex[:12]
    ctr, layout = f"frank-run-{tag}", str(image.layout)
    if engine.name == "buildah":
        # a name per image digest: buildah keeps the image it imported under it, so the
        # next run of the same (verified) image starts without importing gigabytes again
        link: str | None = f"/tmp/frank-oci-{image.digest.split(':')[1][:24]}/image"
    else:  # a view when the path is no image name or the layout lists more (attestations)
        link = None if _TAME.fullmatch(layout) and len(layout_manifests(image.layout)) == 1 \
            else f"{owned_name('oci')}/image"  # this run's own (``store.tmpdirs``)
    ref = f"oci:{link or layout}"
    flags = lock.get("flags", {})
    host, port = str(flags.get("host") or "0.0.0.0"), int(flags.get("port", 8000))
    poll = host if host.startswith(_LOOPBACK) else "127.0.0.1"
    url = f"http://{poll}:{port}/health"
    gpus = int((lock.get("target") or {}).get("gpus", 0) or 0)
    # Layers hold no bytecode (a .pyc embeds an mtime; images stay byte-reproducible), so a
    # fresh container compiles every module it imports: 12 s of vLLM's start on a CPU. And
    # vLLM inspects the model class in a subprocess (another torch import, ~5 s) unless its
    # cache root holds that class's info from an earlier start. Both go to a folder of
    # frank's cache per image digest, kept between runs, as the host's ~/.cache does.
    run_cache = engine.root.parent.parent / "run-cache" / image.digest.split(":")[1][:24]
    for sub in ("pycache", "vllm"):
        (run_cache / sub).mkdir(parents=True, exist_ok=True)
    os.utime(run_cache)  # when this image last ran: ``frank gc`` keeps its import that long
    # The container's name in its processes' environment: ``frank gc`` finds an engine whose
    # run and client are gone by it (``run.reap``), and ``run.watchdog`` need not find them
    defaults = {"PYTHONPYCACHEPREFIX": PYCACHE_IN_CONTAINER, RUN_ENV: ctr}
    if "VLLM_CACHE_ROOT" not in (lock.get("env") or {}):  # the stack's own choice wins
        defaults["VLLM_CACHE_ROOT"] = VLLM_CACHE_IN_CONTAINER
    env = {**w.env, **defaults, **(warm_env or {}), **extra_env}
    base = engine.base_args()
    flags_out: list[str] = ["--volume", f"{run_cache}:{RUN_CACHE_IN_CONTAINER}"]
    if warm_dir is not None:
        flags_out += ["--volume", f"{warm_dir}:{WARM_IN_CONTAINER}"]
    for m in w.mounts:
        flags_out += ["--volume", m.spec()]
    for k in sorted(env):
        flags_out += ["--env", f"{k}={env[k]}"]
    flags_out += _gpu_args(engine.name, gpus)
    tail = [*w.args, *args]
    prepare: list[list[str]] = []
    spec: DockerSpec | None = None
    if engine.name == "docker":
        net = _network(engine.name, host, port)
        spec = DockerSpec(command=tail, network="publish" if "-p" in net else "host",
                          port=port, shm_size=shm_size, ipc=ipc, gpus=gpus,
                          labels={"dev.frank.image": image.digest, OWNER_LABEL: owner()})
        mounts = [(str(run_cache), RUN_CACHE_IN_CONTAINER, False),
                  *([(str(warm_dir), WARM_IN_CONTAINER, False)] if warm_dir else []),
                  *((m.host, m.container, True) for m in w.mounts)]
        run = cli_line(spec, name=ctr, image=docker_tag(image.digest), env=env, mounts=mounts)
        cleanup = [["docker", "rm", "-f", ctr]]
    elif engine.name == "buildah":
        prepare.append([*base, "from", "--quiet", "--pull=false", "--name", ctr, ref])
        argv = [*image.entrypoint, *(tail or image.cmd)]
        if not argv:
            raise FrankError("the image has no entrypoint or cmd to run", file=layout)
        run = [*base, "run", "--isolation", "chroot", *flags_out, ctr, "--", *argv]
        cleanup = [[*base, "rm", ctr]]
    else:  # made first, so that its root is checked against the layout before it starts
        prepare.append([*base, "create", "--pull=always", "--name", ctr,
                        *_network(engine.name, host, port), *flags_out, ref, *tail])
        run = [*base, "start", "--attach", ctr]
        cleanup = [[*base, "rm", "-f", ctr]]
    return RunPlan(engine=engine.name, engine_args=base, image=image.digest, layout=layout,
                   stack=str(lock.get("stack", "")), lock_digest=str(lock["digest"]),
                   container=ctr, url=url, prepare=prepare, run=run, cleanup=cleanup,
                   mounts=list(w.mounts), env=env, gpus=gpus, serve=not args,
                   link=None if engine.name == "docker" else link, docker=spec,
                   run_cache=str(run_cache), warm_dir=str(warm_dir) if warm_dir else None,
                   warm_note=warm_note)
