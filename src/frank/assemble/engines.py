"""Container engines for parts that need commands run inside the image.

The daemonless OCI writer (``frank.image.oci``) covers every part that is just files. When a
RUN step is needed (compiling a kernel against the image's torch) frank builds a Dockerfile
with whichever engine is present: buildah, podman, or docker (only if a daemon answers).
On CI machines without a daemon, Debian's buildah and podman build rootless-style with
``--isolation chroot --storage-driver vfs``: no overlayfs, no user namespaces, RUN steps
work. Engine storage lives under the frank cache, apart from the system's image store.

Docker builds through the SDK with the daemon's legacy builder (``build.dockerbuild``),
which has no build secrets (the CA bundle and pip config are ``--secret`` mounts for the
other engines, never layers): it builds only steps that need no network, and refuses one that
does before any work (checked on Debian's docker.io 20.10.24, which has no BuildKit).
Running images through Docker goes through the SDK too (``run.dockerrun``).

Every build gets a fixed time (as ``--timestamp``, which also sets every file time in the
layers the engine writes, and as the ``SOURCE_DATE_EPOCH`` build arg): SOURCE_DATE_EPOCH, or
the newest file time in the base when that is later (``newest_file_time``: a step's build
outputs must not be older than the base files they were built from), and the pinned
base as build args (``BASE_IMAGE``, a storage reference by digest, and ``BASE_DIGEST``);
layers are exported uncompressed (see ``frank.image.layer`` on why not gzip).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from frank.assemble.buildlog import build_failed, stream_logged
from frank.errors import FrankError
from frank.image.oci import (
    image_view,
    layout_blob_path,
    layout_manifests,
    normalize_layout,
    resolve_manifest,
)
from frank.store.blobs import BlobStore, check_digest
from frank.store.tmpdirs import owned

EngineName = Literal["buildah", "podman", "docker"]
ENGINE_ORDER: tuple[EngineName, ...] = ("buildah", "podman", "docker")
INSTALL_HINT = "apt-get install buildah (or podman), or start a Docker daemon"


@dataclass(frozen=True)
class Engine:
    """A usable engine and the private storage frank gives it."""

    name: EngineName
    exe: str
    root: Path
    runroot: Path
    driver: str = "vfs"

    def base_args(self) -> list[str]:
        """Global flags: private storage and its driver (see ``storage_driver``)."""
        if self.name == "docker":
            return [self.exe]
        return [self.exe, "--root", str(self.root), "--runroot", str(self.runroot),
                "--storage-driver", self.driver]


def storage_driver() -> str:
    """overlay where this kernel lets us mount it, else vfs (``FRANK_STORAGE_DRIVER`` wins).

    vfs works everywhere but stores every layer as a full copy of the tree below it: a
    10-layer 3 GB image takes tens of GB. overlay stores each layer once.
    """
    forced = os.environ.get("FRANK_STORAGE_DRIVER")
    if forced in ("overlay", "vfs"):
        return forced
    return "overlay" if _overlay_mounts() else "vfs"


@functools.cache
def _overlay_mounts() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    with tempfile.TemporaryDirectory(prefix="frank-ovl-") as tmp:
        for d in ("lower", "upper", "work", "merged"):
            os.mkdir(f"{tmp}/{d}")
        opts = f"lowerdir={tmp}/lower,upperdir={tmp}/upper,workdir={tmp}/work"
        try:
            proc = subprocess.run(["unshare", "--mount", "mount", "-t", "overlay", "overlay",
                                   "-o", opts, f"{tmp}/merged"], capture_output=True,
                                  timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return proc.returncode == 0


def _docker_answers() -> bool:
    """Whether a Docker daemon answers the ``docker`` SDK where the environment points
    (``DOCKER_HOST``, the CLI's context): frank needs no docker CLI, only a daemon."""
    from frank.assemble.dockerapi import answers

    return answers()


def _runroot(root: Path) -> Path:
    """A short runroot per storage root: podman refuses runroots over 50 characters, and
    runroot only holds locks and mount state, which belong in tmpfs-like places anyway.
    It names its storage root (``frank-storage``) so that ``reap_runroots`` can tell one
    whose storage is gone."""
    tag = hashlib.sha256(str(root.absolute()).encode()).hexdigest()[:12]
    runroot = Path("/tmp") / f"frank-run-{tag}"
    mark = runroot / _STORAGE_MARK
    with contextlib.suppress(OSError):
        if not mark.exists():
            runroot.mkdir(mode=0o700, exist_ok=True)
            tmp = runroot / f".{_STORAGE_MARK}.{os.getpid()}"
            tmp.write_text(str(root.absolute()))
            os.replace(tmp, mark)
    return runroot


_STORAGE_MARK = "frank-storage"
_RUNROOT = re.compile(r"frank-run-([0-9a-f]{12})")
ABANDONED_AFTER_S = 600  # a storage root without its layer records for this long is gone


def _abandoned(root: Path, mark: Path) -> bool:
    """Whether the engine storage at ``root`` is gone: deleted after use, or deleted but for what
    stayed mounted (no layer records left) for ``ABANDONED_AFTER_S``."""
    import time

    if not root.exists():
        # unless it was never made (an engine's argv worked out, never used: the run root
        # holds only the mark, which the next command would write again)
        return any(p != mark for p in mark.parent.iterdir())
    if any(root.glob("*-layers")):
        return False
    with contextlib.suppress(OSError):
        return time.time() - mark.stat().st_mtime > ABANDONED_AFTER_S
    return False


def reap_runroots(top: Path = Path("/tmp"), *, dry_run: bool = False) -> list[Path]:
    """Remove the run roots (``_runroot``) whose storage is gone, with what is still
    mounted in them or in what is left of the storage (a cache deleted while a container
    was mounted cannot be: "Device or resource busy"); the run roots removed."""
    from frank.store.tmpdirs import unmount_under

    gone = []
    for runroot in sorted(top.glob("frank-run-*")):
        tag = _RUNROOT.fullmatch(runroot.name)
        mark = runroot / _STORAGE_MARK
        try:
            root = Path(mark.read_text())
        except (OSError, ValueError):
            continue  # not one frank marked: not ours to judge
        if tag is None or hashlib.sha256(str(root).encode()).hexdigest()[:12] != tag[1] \
                or not _abandoned(root, mark):
            continue
        gone.append(runroot)
        if dry_run:
            continue
        for top_dir in (root, runroot):
            unmount_under(top_dir)
        shutil.rmtree(runroot, ignore_errors=True)
        if root.is_dir() and not any(p.is_file() or p.is_symlink() for p in root.rglob("*")):
            shutil.rmtree(root, ignore_errors=True)  # only the emptied mount points were left
            for up in (root.parent, root.parent.parent):  # <cache>/containers, the cache
                with contextlib.suppress(OSError):
                    up.rmdir()  # when empty: what the deletion that failed meant to remove
    return gone


# buildah names the containers it makes for a build after their image: ``<image>-working-
# container`` (``-N`` when taken).
_WORKING = re.compile(r".+-working-container(-\d+)?")


_RESULT = re.compile(r"localhost/frank-build-[0-9a-f]{12}")


def _build_lock(engine_args: list[str]) -> Path | None:
    if "--runroot" not in engine_args:
        return None
    return Path(engine_args[engine_args.index("--runroot") + 1]) / "frank-builds.lock"


def _building_here(engine_args: list[str]) -> bool:
    """Whether a live process is an engine build on this storage (one frank started
    before it took the build lock, or by hand)."""
    root = engine_args[engine_args.index("--root") + 1].encode()
    for p in Path("/proc").iterdir():
        if p.name.isdigit() and int(p.name) != os.getpid():
            with contextlib.suppress(OSError):
                argv = (p / "cmdline").read_bytes().split(b"\0")
                if root in argv and (b"bud" in argv or b"build" in argv):
                    return True
    return False


def _kill_inside(mountpoint: str) -> None:
    """SIGKILL the processes whose root is the container's (``mountpoint``): a killed
    build's RUN step lives on there after its ``buildah bud`` is gone. Their root is a bind
    of it (chroot isolation: ``/var/tmp/buildah*/mnt/rootfs``), so it is told by its
    device and inode, not its path."""
    import signal

    try:
        st = os.stat(mountpoint) if mountpoint else None
    except OSError:
        return
    if st is None:
        return
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            with contextlib.suppress(OSError):
                root = os.stat(p / "root")
                if (root.st_dev, root.st_ino) == (st.st_dev, st.st_ino):
                    os.kill(int(p.name), signal.SIGKILL)


def reap_builds(engine_args: list[str], *, dry_run: bool = False) -> list[str]:
    """Remove the working containers killed builds left in this storage (mounted, and with
    their RUN step's processes) and the results they tagged, when no build holds the
    storage's build lock and no process is a build on it; the names removed."""
    from frank.store.flock import opened, try_exclusive

    lock = _build_lock(engine_args)
    if lock is None or not Path(engine_args[engine_args.index("--root") + 1]).is_dir():
        return []
    buildah = Path(engine_args[0]).name == "buildah"
    with opened(lock) as fd:
        if not try_exclusive(fd) or _building_here(engine_args):
            return []
        listing = ["containers", "--all", "--format", "{{.ContainerName}}"] if buildah \
            else ["ps", "--all", "--external", "--format", "{{.Names}}"]
        proc = subprocess.run([*engine_args, *listing], capture_output=True, text=True,
                              check=False)
        names = [n for n in proc.stdout.split() if _WORKING.fullmatch(n)] \
            if proc.returncode == 0 else []
        images = subprocess.run([*engine_args, "images", "--format", "{{.Name}}" if buildah
                                 else "{{.Repository}}"], capture_output=True, text=True,
                                check=False)
        # a build's result, tagged when its compose was killed before taking it out
        results = sorted({n for n in images.stdout.split() if _RESULT.fullmatch(n)})
        if dry_run:
            return names + results
        gone = [n for n in results if subprocess.run(
            [*engine_args, "rmi", "-f", n], capture_output=True, check=False).returncode == 0]
        for name in names:
            where = subprocess.run([*engine_args, "inspect", "--type", "container", "--format",
                                    "{{.MountPoint}}" if buildah else "{{.Mountpoint}}",
                                    name], capture_output=True, text=True, check=False)
            _kill_inside(where.stdout.strip())
            rm = [*engine_args, "rm", name] if buildah else [*engine_args, "rm", "-f", name]
            if subprocess.run(rm, capture_output=True, check=False).returncode == 0:
                gone.append(name)
        return gone


@contextlib.contextmanager
def building(engine: Engine) -> Iterator[None]:
    """For one build: what killed builds left removed first, then the storage's build lock
    held shared for the block (it tells ``reap_builds`` that this build is alive)."""
    from frank.store.flock import held

    lock = _build_lock(engine.base_args())
    if lock is None:
        yield
        return
    for name in reap_builds(engine.base_args()):
        print(f"frank: removed {name}, the working container of a build that was killed",
              file=sys.stderr, flush=True)
    with held(lock, shared=True):
        yield


def detect(store: BlobStore | None = None) -> list[Engine]:
    """Engines usable here, in preference order (docker only if its daemon answers)."""
    store = store or BlobStore()
    found: list[Engine] = []
    for name in ENGINE_ORDER:
        exe = shutil.which(name)
        if name == "docker":
            if not _docker_answers():
                continue
            exe = exe or "docker"  # shown only; the SDK talks to the daemon
        if exe is None:
            continue
        driver = storage_driver()
        # one storage root per driver: a root cannot change driver once made
        root = store.root / "containers" / (name if driver == "vfs" else f"{name}-{driver}")
        found.append(Engine(name, exe, root, _runroot(root), driver))
    return found


def get_engine(name: str = "auto", store: BlobStore | None = None) -> Engine:
    """The named engine, or the first one found for ``auto``; none -> what to install."""
    engines = detect(store)
    if name == "auto":
        if not engines:
            raise FrankError(f"no container engine found; {INSTALL_HINT}", field="--builder")
        return engines[0]
    for e in engines:
        if e.name == name:
            return e
    if name == "docker":  # the daemon's own reason, and where frank looked for it
        from frank.assemble.dockerapi import client

        client(timeout=10).close()
    hint = "start a Docker daemon" if name == "docker" else f"apt-get install {name}"
    raise FrankError(f"container engine {name!r} is not available; {hint}", field="--builder")


def _run(args: list[str], what: str, *, input_text: str | None = None,
         timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(args, capture_output=True, text=True, input=input_text,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        raise FrankError(f"{what} timed out after {timeout} s") from None
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr + proc.stdout).strip().splitlines() if ln.strip()]
        tail = lines[-1] if lines else "?"
        raise FrankError(f"{what} failed (exit {proc.returncode}): {' '.join(tail.split())}")
    return proc


# Lines of a build log that say why it failed, best first.
def build_secrets(folder: Path) -> dict[str, Path]:
    """The host's CA bundle and an index-only pip.conf, as files for ``--secret``."""
    from frank.store.fetch import ca_bundle

    ca = folder / "ca.crt"
    bundle = ca_bundle()
    ca.write_bytes(Path(bundle).read_bytes() if bundle else b"")
    lines = ["[global]", "cert = /etc/ssl/certs/ca-certificates.crt"]
    proc = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                          text=True, check=False)
    for line in proc.stdout.splitlines():  # only indexes on the network reach a container
        key, _, value = line.partition("=")
        if key.endswith(("index-url", "extra-index-url")):
            urls = [u for u in value.strip("'\"").split() if u.startswith(("http://", "https://"))]
            if urls:
                lines.append(f"{key.split('.')[-1]} = {' '.join(urls)}")
    pip = folder / "pip.conf"
    pip.write_text("\n".join(lines) + "\n")
    return {"frank-ca": ca, "frank-pip": pip}


def run_logged(args: list[str], what: str, *, log: Path, timeout: float | None = None) -> None:
    """Run a build, streaming its output to ``log`` and a progress line; a failure names the
    log and quotes the lines that say why."""
    log.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace")
    assert proc.stdout is not None
    try:
        tail = stream_logged(proc.stdout, what, log=log, head="$ " + " ".join(args),
                             timeout=timeout)
    except FrankError:  # timed out
        proc.kill()
        raise
    code = proc.wait()
    if code != 0:
        raise build_failed(what, f"exit {code}", tail, log)


@contextlib.contextmanager
def _oci_ref(layout: Path, digest: str | None = None) -> Iterator[str]:
    """An ``oci:`` reference to image ``digest`` (the first listed without it) of ``layout``,
    through a view (``image_view``) in a folder with a tame name.

    Engines name an image pulled from ``oci:PATH`` after PATH, and reject paths that are not
    valid image names (``~/.cache``, upper case); and they refuse a layout listing more than
    one manifest (attestations sit beside the image): the view avoids all three.
    """
    # /tmp itself: compose points TMPDIR beside its output, a path engines may not take
    with owned("oci") as d:
        digest = digest or layout_manifests(layout)[0]["digest"]
        yield f"oci:{image_view(Path(layout), str(digest), d / 'image')}"


def load_base(engine: Engine, layout: Path, digest: str) -> str:
    """Put the pinned base into the engine's storage; return a reference to it by digest."""
    check_digest(digest, field="base_digest")
    got, _, _ = resolve_manifest(layout, digest)
    if got != digest:
        raise FrankError(f"base layout holds {got}, not the pinned {digest}", file=layout)
    name = f"localhost/frank-base-{digest.split(':')[1][:16]}"
    with _oci_ref(layout, digest) as ref:
        proc = _run([*engine.base_args(), "pull", "--quiet", ref],
                    f"{engine.name} pull of the base image")
    image_id = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    if not image_id:
        raise FrankError(f"{engine.name} pull of the base printed no image id", file=layout)
    _run([*engine.base_args(), "tag", image_id, name], f"{engine.name} tag of the base")
    return f"{name}@{digest}"


def newest_file_time(layout: Path, digest: str, kept: Path | None = None) -> int:
    """The newest mtime of any entry in the layers of image ``digest`` of ``layout``.

    Why: ``--timestamp`` (reproducible layers) sets every file an engine writes to one time.
    At SOURCE_DATE_EPOCH (1980) a step's build outputs would be older than the base's
    headers they were built from, and make, ninja or a JIT cache would rebuild them at first
    start; at no earlier than this time they are up to date (ties count as up to date), and
    the time is still a function of the pinned base alone.

    Reading a registry base's gzipped layers takes a while, so the answer is kept in
    ``kept`` by the base's digest (a file times are set from, never content).
    """
    import json

    record = kept / digest.split(":")[-1] if kept is not None else None
    if record is not None:
        try:
            doc = json.loads(record.read_text())
            if doc.get("digest") == digest and isinstance(doc.get("newest"), int):
                return int(doc["newest"])
        except (OSError, ValueError, AttributeError):
            pass
    newest = _newest_in_layers(layout, digest)
    if record is not None:
        record.parent.mkdir(parents=True, exist_ok=True)
        tmp = record.with_name(f".{record.name}.{uuid.uuid4().hex}")
        tmp.write_text(json.dumps({"digest": digest, "newest": newest}) + "\n")
        os.replace(tmp, record)
    return newest


def _newest_in_layers(layout: Path, digest: str) -> int:
    import tarfile

    _, _, manifest = resolve_manifest(layout, digest)
    newest = 0
    for desc in manifest.get("layers", []):
        path = layout_blob_path(layout, desc["digest"])
        try:
            with tarfile.open(path) as tar:  # seeks over file data when uncompressed
                for member in tar:
                    newest = max(newest, int(member.mtime))
        except (OSError, tarfile.TarError) as exc:
            raise FrankError(f"reading the base's layer {desc['digest']}: {exc}",
                             file=layout) from None
    return newest


@functools.cache
def can_cut_network() -> bool:
    """Whether this process may run a program in a network namespace of its own (root, or
    unprivileged user namespaces): how a build that needs no network is kept off it."""
    exe = shutil.which("unshare")
    if exe is None:
        return False
    return subprocess.run([exe, "--net", "--", "true"], capture_output=True,
                          check=False).returncode == 0


def build_dockerfile(
    engine: Engine,
    context: Path,
    out_layout: Path,
    *,
    base_layout: Path,
    base_digest: str,
    source_date_epoch: int,
    dockerfile: Path | None = None,
    build_args: dict[str, str] | None = None,
    store: BlobStore | None = None,
    timeout: float | None = 3600,
    log: Path | None = None,
    network: bool = True,
) -> str:
    """Build ``context`` with ``engine`` and export it as an OCI layout; return its digest.

    The engine exports to a temp dir; the result is normalized (uncompressed layers,
    canonical manifest, see ``normalize_layout``) into ``out_layout`` only when the build
    and the export both succeed, so a build that fails halfway leaves no output.
    """
    store = store or BlobStore()
    context = Path(context).absolute()
    dockerfile = Path(dockerfile).absolute() if dockerfile else context / "Dockerfile"
    if not dockerfile.is_file():
        raise FrankError("Dockerfile not found", file=dockerfile)
    if engine.name == "docker" and network:
        from frank.assemble.dockerbuild import refuse_network

        refuse_network(["this build"])
    log = log or context.parent / "build.log"
    # the engine sets every file of the layers it writes to this time: never older than a
    # file of the base, so what a step builds against the base is not older than its inputs
    newest = newest_file_time(base_layout, base_digest, store.root / "base-file-times")
    stamp = max(source_date_epoch, newest)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a", encoding="utf-8") as note:
        note.write(f"frank: file times in the built layers: {stamp} (the base's newest file "
                   f"time {newest}, no earlier than SOURCE_DATE_EPOCH {source_date_epoch})\n")
    args = {"SOURCE_DATE_EPOCH": str(stamp), "BASE_DIGEST": base_digest, **(build_args or {})}
    if engine.name == "docker":
        from frank.assemble.dockerbuild import build_image

        return build_image(context, dockerfile, out_layout, base_layout=base_layout,
                           base_digest=base_digest, stamp=stamp, epoch=source_date_epoch,
                           args=args, store=store, log=log, timeout=timeout)
    args["BASE_IMAGE"] = load_base(engine, base_layout, base_digest)
    tag = f"localhost/frank-build-{uuid.uuid4().hex[:12]}"  # (``_RESULT``)
    cmd = [*engine.base_args(), "bud" if engine.name == "buildah" else "build",
           "--isolation", "chroot", "--timestamp", str(stamp), "--pull=false",
           "-f", str(dockerfile), "-t", tag]
    for k in sorted(args):
        cmd += ["--build-arg", f"{k}={args[k]}"]
    prefix: list[str] = []
    if not network:
        if can_cut_network():  # chroot isolation shares the caller's network namespace
            prefix = ["unshare", "--net", "--"]
        else:
            with log.open("a", encoding="utf-8") as note:
                note.write("frank: the network stays on for this build: this user may not "
                           "make a network namespace (unshare --net)\n")
    try:
        return _build_and_export(engine, cmd, prefix, context, log, timeout, tag, out_layout,
                                 store, source_date_epoch)
    finally:
        # what the build left goes now, quietly (the next build would call it a killed
        # build's): buildah keeps a working container of an earlier stage even on success,
        # and every one on failure (1.28 takes --force-rm only with --layers); reaping waits
        # for no other build and removes none of theirs
        reap_builds(engine.base_args())


def _build_and_export(engine: Engine, cmd: list[str], prefix: list[str], context: Path,
                      log: Path, timeout: float | None, tag: str, out_layout: Path,
                      store: BlobStore, source_date_epoch: int) -> str:
    """Run the build, then take its result out of the engine into ``out_layout``."""
    with owned("secrets") as secrets, building(engine):
        for ident, path in build_secrets(secrets).items():
            cmd += ["--secret", f"id={ident},src={path}"]
        run_logged([*prefix, *cmd, str(context)], f"{engine.name} build of {context}",
                   log=log, timeout=timeout)
    out_layout = Path(out_layout).absolute()
    out_layout.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_layout.name}.tmp-", dir=out_layout.parent))
    try:
        if engine.name == "buildah":
            _run([*engine.base_args(), "push", "--quiet", "--disable-compression", tag,
                  f"oci:{tmp}"], "buildah push to an OCI layout")
        else:
            shutil.rmtree(tmp)
            _run([*engine.base_args(), "save", "--format", "oci-dir", "--uncompressed",
                  "-o", str(tmp), tag],
                 "podman save to an OCI layout")
        digest = normalize_layout(tmp, store, out_layout, epoch=source_date_epoch)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run([*engine.base_args(), "rmi", "-f", tag], capture_output=True)
    return digest


def run_image(layout: Path, args: list[str] | None = None, *, engine: Engine | None = None,
              env: dict[str, str] | None = None, timeout: float = 600,
              check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the image's entrypoint (with ``args`` instead of its cmd) under chroot isolation.

    buildah is preferred: ``podman run`` fails on setrlimit in unprivileged CI containers,
    while ``buildah from`` + ``buildah run --isolation chroot`` does not.
    """
    from frank.image.oci import read_layout

    info = read_layout(Path(layout), verify_layers=False)
    engine = engine or next((e for e in detect() if e.name == "buildah"), None)
    if engine is None or engine.name != "buildah":
        raise FrankError("running an image needs buildah; apt-get install buildah")
    argv = [*info.entrypoint, *(info.cmd if args is None else args)]
    if not argv:
        raise FrankError("the image has no entrypoint or cmd to run", file=layout)
    with _oci_ref(layout) as ref:
        out = _run([*engine.base_args(), "from", "--quiet", "--pull-always", ref],
                   "buildah from").stdout
    ctr = out.strip().splitlines()[-1]
    try:
        cmd = [*engine.base_args(), "run", "--isolation", "chroot"]
        for k in sorted(env or {}):
            cmd += ["--env", f"{k}={(env or {})[k]}"]
        proc = subprocess.run([*cmd, ctr, "--", *argv], capture_output=True, text=True,
                              timeout=timeout)
    finally:
        subprocess.run([*engine.base_args(), "rm", ctr], capture_output=True)
    if check and proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        raise FrankError(f"image entrypoint exited {proc.returncode}: {tail}", file=layout)
    return proc
