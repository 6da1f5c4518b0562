"""Container steps built by a Docker daemon through the ``docker`` SDK (``--builder docker``).

Why the legacy build API: the SDK cannot drive BuildKit (build secrets need BuildKit's session
protocol, which the SDK does not speak), and Debian's docker.io has no BuildKit at all. The
legacy builder has no build secrets, so it builds only steps that need no network (a
post-install step, a kernel compiled in the image): the Dockerfile is rendered without the
secret mounts (no CA bundle or pip config is needed offline) and every RUN gets network
``none``. A step that needs the network is refused before any work (``refuse_network``).

Reproducible as buildah's ``--timestamp`` makes its builds, though the legacy builder stamps
real file times, container and parent ids and build times into what it commits: the context
goes to the daemon as a tar that says nothing of this host (``context_tar``); the image is
read back (``docker save``), every blob hashed into the store on the way and checked: the
config against the id the daemon reports, each layer against the config's diff_ids, the
first layers against the pinned base (``read_export``; the daemon's copy of the base, which
builds reuse, goes when that fails, so an edited one is loaded anew); then the layers the
build added get every file time set to the step's stamp, and the config keeps only what the
Dockerfile declared, with the stamp as every time the build added (``canonical_config``).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import posixpath
import re
import stat
import tarfile
import uuid
from collections.abc import Generator, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from frank.errors import FrankError
from frank.image.layer import LAYER_MEDIA_TYPE
from frank.image.oci import epoch_to_rfc3339, read_layout_blob, resolve_manifest, store_layout
from frank.store.blobs import BlobStore

if TYPE_CHECKING:
    import docker

_CHUNK = 1 << 20
# What of a Docker run config an image declares (the OCI config's fields, and Docker's own a
# Dockerfile can set); the rest says nothing (empty defaults) or varies with every build
# (Hostname: the build container's id; Image: the parent's id, itself stamped with a time).
KEPT_CONFIG = ("User", "ExposedPorts", "Env", "Entrypoint", "Cmd", "Volumes", "WorkingDir",
               "Labels", "StopSignal", "Healthcheck", "Shell", "OnBuild")
# the daemon's hash of what a COPY or ADD took, in its history line: its own digest of the
# files' headers, which differs for the same files taken from the context and from a stage
# (so a step whose outputs frank kept would give another image than the step run again)
_SOURCE_HASH = re.compile(r"\b(dir|file|multi):[0-9a-f]{64}\b")
# how the legacy builder says a RUN failed: the whole command again (a step's is long)
_COMMAND = re.compile(r"The command '.*' returned")
# an image id the legacy builder prints for each step it commits: " ---> 0123456789ab"
_STEP_ID = re.compile(r"^ ---> ([0-9a-f]{12})\s*$", re.MULTILINE)


def refuse_network(layers: list[str]) -> None:
    """Docker builds offline steps only: one that needs the network is refused up front."""
    if layers:
        raise FrankError(
            f"docker builds only steps that need no network, and {layers[0]} needs it: a "
            "networked step gets the host's CA bundle and pip settings as build secrets, "
            "which need BuildKit, and frank drives Docker's legacy builder (through the SDK; "
            "Debian's docker.io has no BuildKit); use --builder buildah or podman",
            field="--builder")


def _walk(top: Path) -> list[Path]:
    found = []
    for dirpath, dirnames, filenames in os.walk(top):
        found += [Path(dirpath, n) for n in [*dirnames, *filenames]]
    return sorted(found, key=lambda p: p.relative_to(top).parts)


def context_tar(context: Path, epoch: int) -> Iterator[bytes]:
    """The build context as a tar stream whose headers say nothing of this host: owners 0
    without names, every time ``epoch``, entries sorted; modes and link texts as they are.
    The daemon hashes these headers into COPY's history line and COPY keeps them."""
    for path in _walk(context):
        st = path.lstat()
        info = tarfile.TarInfo(path.relative_to(context).as_posix())
        info.mtime, info.mode = epoch, stat.S_IMODE(st.st_mode)
        if stat.S_ISDIR(st.st_mode):
            info.type = tarfile.DIRTYPE
        elif stat.S_ISLNK(st.st_mode):
            info.type, info.linkname = tarfile.SYMTYPE, os.readlink(path)
        elif stat.S_ISREG(st.st_mode):
            info.size = st.st_size
        else:
            raise FrankError("only files, folders and links can be sent as a build context",
                             file=path)
        yield info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
        if info.isreg():
            with path.open("rb") as f:
                sent = 0
                while chunk := f.read(min(_CHUNK, info.size - sent)):
                    sent += len(chunk)
                    yield chunk
            if sent != info.size:
                raise FrankError("changed while it was sent to the Docker daemon", file=path)
            yield b"\0" * (-info.size % tarfile.BLOCKSIZE)
    yield b"\0" * (2 * tarfile.BLOCKSIZE)


def build(c: docker.DockerClient, context: Path, dockerfile: str, tag: str,
          args: dict[str, str], *, epoch: int, log: Path, timeout: float | None,
          made: list[str]) -> None:
    """Build ``context`` with the legacy builder, offline and with no cache, its output
    streamed to ``log``; the ids of the images it commits go to ``made`` (to be removed
    afterwards). A failure names the log and quotes the lines that say why."""
    from docker.errors import DockerException
    from requests.exceptions import RequestException

    from frank.assemble.buildlog import build_failed, stream_logged
    from frank.assemble.dockerapi import where

    errors: list[str] = []

    def lines() -> Generator[str, None, None]:
        try:
            for msg in c.api.build(
                    # a stream, not a file: sent as it is made (requests takes either)
                    fileobj=context_tar(context, epoch),  # type: ignore[arg-type]
                    custom_context=True, dockerfile=dockerfile, tag=tag, buildargs=args,
                    network_mode="none", pull=False, rm=True, forcerm=True, nocache=True,
                    decode=True, use_config_proxy=False,
                    timeout=int(timeout) if timeout else None):
                text = str(msg.get("stream", "")) if isinstance(msg, dict) else str(msg)
                made.extend(_STEP_ID.findall(text))
                if isinstance(msg, dict) and msg.get("error"):  # the log has the command
                    errors.append(_COMMAND.sub("the RUN step above returned",
                                               " ".join(str(msg["error"]).split())))
                    text = f"ERROR: {errors[-1]}\n"
                if text:
                    yield text
        except (DockerException, RequestException) as exc:
            errors.append(" ".join(str(exc).split())[:300])
            yield f"ERROR: {errors[-1]}\n"

    what = f"docker build of {context}"
    stream = lines()
    try:
        tail = stream_logged(stream, what, log=log, timeout=timeout,
                             head=f"$ docker build (legacy builder, through the SDK, at {where()}"
                                  f"; network none, no cache) -t {tag} {context}")
    finally:
        stream.close()
    if errors:
        raise build_failed(what, "the daemon said so", tail, log)


def _reader(chunks: Iterable[bytes]) -> io.BufferedReader:
    """A file to read a byte stream from (``tarfile`` reads files)."""
    it = iter(chunks)

    class Raw(io.RawIOBase):
        buf = b""

        def readable(self) -> bool:
            return True

        def readinto(self, b: Any) -> int:
            while not self.buf:
                chunk = next(it, None)
                if chunk is None:
                    return 0
                self.buf = bytes(chunk)
            n = min(len(b), len(self.buf))
            b[:n], self.buf = self.buf[:n], self.buf[n:]
            return n

    return io.BufferedReader(Raw(), _CHUNK)


def read_export(chunks: Iterable[bytes], image_id: str, store: BlobStore,
                what: str) -> tuple[str, list[str]]:
    """The config digest and layer digests of one image in a ``docker save`` stream, every
    blob hashed into the store as it is read. Nothing of the daemon is believed: the config
    must hash to ``image_id`` (the id the daemon reports for the image; or the manifest must,
    which names that config, as the containerd image store's ids are) and each layer to its
    diff_id in that config."""
    blobs: dict[str, str] = {}
    links: dict[str, str] = {}
    manifest: Any = None
    try:
        with tarfile.open(fileobj=_reader(chunks), mode="r|") as tar:
            for m in tar:
                if m.issym():  # a layer that occurs twice: a link to the first copy
                    links[m.name] = posixpath.normpath(
                        posixpath.join(posixpath.dirname(m.name), m.linkname))
                    continue
                f = tar.extractfile(m) if m.isfile() else None
                if f is None:
                    continue
                if m.name == "manifest.json":
                    manifest = json.loads(f.read(1 << 24))
                elif m.name.endswith("/layer.tar") or m.name.startswith("blobs/") or \
                        ("/" not in m.name and m.name.endswith(".json")):  # (Docker >= 25)
                    with store.writer() as w:
                        while chunk := f.read(_CHUNK):
                            w.write(chunk)
                    blobs[m.name] = w.digest
    except (tarfile.TarError, ValueError, OSError) as exc:
        raise FrankError(f"{what}: the Docker daemon's export cannot be read: {exc}") from None
    if not (isinstance(manifest, list) and len(manifest) == 1 and isinstance(manifest[0], dict)):
        raise FrankError(f"{what}: the Docker daemon's export does not hold one image")

    def named(name: Any) -> str:
        digest = blobs.get(links.get(str(name), str(name)))
        if digest is None:
            raise FrankError(f"{what}: the Docker daemon's export lacks {name}")
        return digest

    config = named(manifest[0].get("Config"))
    if config != image_id and not _names_config(store, blobs, image_id, config):
        raise FrankError(f"{what}: the config the Docker daemon exported hashes to {config}, "
                         f"not the id it reports for the image ({image_id})")
    layers = [named(x) for x in manifest[0].get("Layers") or []]
    diff_ids = json.loads(store.read_bytes(config)).get("rootfs", {}).get("diff_ids")
    for i, (got, want) in enumerate(zip(layers, diff_ids or [], strict=False)):
        if got != want:
            raise FrankError(f"{what}: layer {i} the Docker daemon exported hashes to {got}, "
                             f"its config says {want}")
    if diff_ids != layers:
        raise FrankError(f"{what}: the Docker daemon exported {len(layers)} layers, its "
                         f"config lists {len(diff_ids or [])}")
    return config, layers


def _names_config(store: BlobStore, blobs: dict[str, str], digest: str, config: str) -> bool:
    """Whether ``digest`` is a manifest read from the export whose config is ``config``."""
    if digest not in blobs.values():
        return False
    try:
        doc = json.loads(store.read_bytes(digest))
    except ValueError:
        return False
    return isinstance(doc, dict) and isinstance(doc.get("config"), dict) \
        and doc["config"].get("digest") == config


def stamped_layer(store: BlobStore, digest: str, stamp: int) -> dict[str, Any]:
    """Layer ``digest`` with every entry's time ``stamp`` and no owner names (buildah's
    ``--timestamp``: what the build wrote then does not say when it ran); the rest of each
    header (path, mode, owner ids, link, extended attributes) and the content as they were."""
    out: Any  # a tar written into the store's writer (typeshed wants a file there)
    with tarfile.open(store.verified_path(digest)) as tin, store.writer() as out, \
            tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT,
                         encoding="utf-8") as tout:
        for m in tin:
            m.mtime, m.uname, m.gname = stamp, "", ""
            m.pax_headers = {k: v for k, v in m.pax_headers.items()
                             if k.startswith("SCHILY.xattr.")}
            tout.addfile(m, tin.extractfile(m) if m.isreg() else None)
    return {"mediaType": LAYER_MEDIA_TYPE, "digest": out.digest, "size": out.size}


def canonical_config(built: dict[str, Any], base: dict[str, Any], diff_ids: list[str],
                     stamp: int) -> dict[str, Any]:
    """The built image's config as a function of the Dockerfile, the base and the layers:
    platform and history of the base as the base has them, the run config's declared
    fields only (``KEPT_CONFIG``), each history entry the build added with ``stamp`` as its
    time and nothing but its instruction (without the daemon's hash of what a COPY took:
    the layer's diff_id says that)."""
    old = list(base.get("history") or [])
    history = list(built.get("history") or [])
    if len(history) < len(old):
        raise FrankError("the image docker built has less history than its base")
    when = epoch_to_rfc3339(stamp)
    added = [{"created": when, "created_by": _SOURCE_HASH.sub(r"\1", str(h.get("created_by"))),
              **({"empty_layer": True} if h.get("empty_layer") else {})}
             for h in history[len(old):]]
    history = [*old, *added]
    if sum(not h.get("empty_layer") for h in history) != len(diff_ids):
        raise FrankError("the image docker built has a history that does not match its layers")
    run = built.get("config") or {}
    doc: dict[str, Any] = {k: base[k] for k in ("architecture", "os", "variant") if k in base}
    return {**doc, "created": when, "config": {k: run[k] for k in KEPT_CONFIG if run.get(k)},
            "rootfs": {"type": "layers", "diff_ids": diff_ids}, "history": history}


def build_image(context: Path, dockerfile: Path, out_layout: Path, *, base_layout: Path,
                base_digest: str, stamp: int, epoch: int, args: dict[str, str],
                store: BlobStore, log: Path, timeout: float | None) -> str:
    """Build ``context`` offline on the Docker daemon the environment names and write the
    result, checked and made reproducible, as ``out_layout``; its digest."""
    from docker.errors import APIError

    from frank.assemble.dockerapi import API_TIMEOUT_S, client, load_layout
    from frank.image.oci import canonical_json

    try:
        rel = dockerfile.relative_to(context).as_posix()
    except ValueError:
        raise FrankError("a docker build takes its Dockerfile from the build context",
                         file=dockerfile) from None
    c = client(timeout=int(timeout or API_TIMEOUT_S))
    tag = f"frank-build-{uuid.uuid4().hex[:12]}"
    made: list[str] = []
    base_id = ""
    drop_base = False
    try:
        base = load_layout(c, base_layout, f"frank-base-{base_digest.split(':')[1][:16]}:latest",
                           base_digest)
        base_id = base.id.split(":")[-1]
        build(c, context, rel, tag, {**args, "BASE_IMAGE": base.ref}, epoch=stamp, log=log,
              timeout=timeout, made=made)
        what = f"docker build of {context}"
        image_id = str(c.api.inspect_image(tag)["Id"])  # type: ignore[no-untyped-call]
        try:
            config, layers = read_export(c.api.get_image(tag), image_id, store, what)
        except FrankError as exc:
            # the daemon's copy of the base is one thing that makes it (an edited file:
            # "file integrity checksum failed"), and a build reuses it: the next loads it anew
            drop_base = True
            exc.message += "; the daemon's copy of the base goes too: build again to load it"
            raise
        _, _, base_manifest = resolve_manifest(base_layout, base_digest)
        base_config = json.loads(read_layout_blob(base_layout, base_manifest["config"]["digest"],
                                                  "config"))
        kept = base_config.get("rootfs", {}).get("diff_ids") or []
        if layers[:len(kept)] != kept:
            raise FrankError(f"{what}: the image docker built does not sit on the pinned base "
                             f"{base_digest}")
        descs = [{"mediaType": LAYER_MEDIA_TYPE, "digest": d,
                  "size": store.verified_path(d).stat().st_size} for d in kept]
        descs += [stamped_layer(store, d, stamp) for d in layers[len(kept):]]
        doc = canonical_config(json.loads(store.read_bytes(config)), base_config,
                               [d["digest"] for d in descs], stamp)
        raw = canonical_json(doc)
        return store_layout(store, out_layout, (store.put_bytes(raw), len(raw)), descs,
                            epoch=epoch)
    finally:
        for ref in [tag, *reversed(made)]:  # what this build made goes (not the base)
            if base_id.startswith(ref):
                continue
            with contextlib.suppress(APIError):
                c.api.remove_image(ref, force=ref == tag)
        if drop_base:  # (once nothing of this build sits on it)
            with contextlib.suppress(APIError):
                c.api.remove_image(f"sha256:{base_id}", force=True)
        c.close()
