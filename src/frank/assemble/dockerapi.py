"""A Docker daemon through the ``docker`` SDK: which daemon, and images moved into it.

Why the SDK and not skopeo's ``docker-daemon:`` transport: skopeo 1.9 (Debian's) failed
against Docker 20.10 here ("writing blob: io: read/write on closed pipe") and once reported
success with no image in the daemon. The SDK speaks the Engine API directly, and reads the
daemon the way the ``docker`` CLI does: ``DOCKER_HOST`` (with ``DOCKER_TLS_VERIFY`` and
``DOCKER_CERT_PATH``), else ``DOCKER_CONTEXT`` or the CLI's current context
(``~/.docker/config.json``), else the local socket.

Loading is checked by content: the daemon names an image it stores by the sha256 of its
config (Docker's classic image store) or of its manifest (the containerd image store), and
it refuses a layer whose content does not hash to the config's ``diff_ids``. So an image
whose id the daemon reports as the layout's config (or manifest) digest holds exactly the
layout's config and file systems; any other id is refused.

What a caller that checks engine storage needs (``load_layout``): ``reuse=True`` starts an
image the daemon already holds under the expected id without sending it again (the daemon's
id is its own hash of the config, and it checked the layers against the diff_ids when they
came in; the same trust as buildah's kept image per digest); ``reuse=False`` always streams
the layout, checked blob by blob on the way, and the daemon checks it again.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from frank.errors import FrankError
from frank.image.dockerarchive import docker_archive
from frank.image.oci import resolve_manifest

if TYPE_CHECKING:
    import docker

API_TIMEOUT_S = 600  # a load of a 10 GB image is one request
_ENV_HINT = "DOCKER_HOST, DOCKER_CONTEXT or the docker CLI's current context"


def where() -> str:
    """The daemon frank would talk to, in words (for errors and --print)."""
    import os

    if os.environ.get("DOCKER_HOST"):
        return os.environ["DOCKER_HOST"]
    try:
        from docker.context import ContextAPI

        ctx = ContextAPI.get_context(os.environ.get("DOCKER_CONTEXT"))
        if ctx is not None and ctx.Host:
            return str(ctx.Host)
    except Exception:  # a broken CLI config: the client's own error says more
        pass
    return "unix:///var/run/docker.sock"


def client(timeout: int = API_TIMEOUT_S) -> docker.DockerClient:
    """A client of the daemon the environment names, checked to answer."""
    import docker
    from docker.errors import DockerException

    try:
        c = docker.from_env(timeout=timeout)
        c.ping()
    except DockerException as exc:
        raise FrankError(f"no Docker daemon answers at {where()} ({_short(exc)}); start one "
                         f"or point {_ENV_HINT} at it", field="--engine") from None
    return c


def answers() -> bool:
    """Whether a daemon answers where the environment points (engine detection)."""
    try:
        client(timeout=10).close()
    except FrankError:
        return False
    return True


def _short(exc: BaseException) -> str:
    text = " ".join(str(getattr(exc, "explanation", None) or exc).split())
    return text[:300]


@dataclass(frozen=True)
class LoadedImage:
    """An image the daemon holds, with the digests it was checked against."""

    id: str
    manifest_digest: str
    config_digest: str
    tag: str
    reused: bool  # already in the daemon under the expected id: nothing was sent

    @property
    def ref(self) -> str:
        """What to start a container from: the id, never a tag someone could move."""
        return self.id


def check_image_id(found: str, manifest_digest: str, config_digest: str,
                   layout: Path | None = None) -> str:
    """The daemon's id for an image frank loaded must be one of its two digests."""
    if found not in (config_digest, manifest_digest):
        raise FrankError(f"the Docker daemon reports image id {found} for the image it "
                         f"loaded, not its config digest {config_digest} (nor its manifest "
                         f"digest {manifest_digest}): refusing to run it", file=layout)
    return found


def _held(c: docker.DockerClient, ids: tuple[str, ...]) -> str | None:
    from docker.errors import ImageNotFound

    for image_id in ids:
        try:
            got = str(c.images.get(image_id).id)
        except ImageNotFound:
            continue
        if got == image_id:
            return got
    return None


def load_layout(c: docker.DockerClient, layout: Path, tag: str, digest: str | None = None, *,
                reuse: bool = True,
                progress: Callable[[str], None] | None = None) -> LoadedImage:
    """Put the layout's image into the daemon (one stream, ``docker_archive``) and check the
    id the daemon gives it. With ``reuse``, an image the daemon already holds under the
    expected id is not sent again (the daemon's id is its own hash of the content)."""
    from docker.errors import APIError

    layout = Path(layout).absolute()
    mdigest, _, manifest = resolve_manifest(layout, digest)
    cdigest = str(manifest["config"]["digest"])
    if reuse and (held := _held(c, (cdigest, mdigest))) is not None:
        repo, _, name = tag.rpartition(":")
        c.api.tag(held, repo, name)
        return LoadedImage(held, mdigest, cdigest, tag, True)
    if progress:
        progress(f"loading {mdigest} into the Docker daemon at {where()}")
    try:
        messages = list(c.api.load_image(  # type: ignore[no-untyped-call]
            docker_archive(layout, tag, mdigest)))
    except APIError as exc:
        raise FrankError(f"the Docker daemon refused the image: {_short(exc)}",
                         file=layout) from None
    errors = [m for m in messages if isinstance(m, dict) and m.get("error")]
    if errors:
        why = " ".join(str(errors[-1]["error"]).split())[:300]
        raise FrankError(f"the Docker daemon refused the image: {why}", file=layout)
    try:
        found = str(c.images.get(tag).id)
    except APIError as exc:
        raise FrankError(f"the Docker daemon loaded nothing under {tag}: {_short(exc)} "
                         f"(its answer: {json.dumps(messages)[:200]})", file=layout) from None
    check_image_id(found, mdigest, cdigest, layout)
    return LoadedImage(found, mdigest, cdigest, tag, False)


def info(c: docker.DockerClient) -> dict[str, Any]:
    """The daemon's ``docker info`` (its version, storage driver, runtimes)."""
    return dict(c.info())
