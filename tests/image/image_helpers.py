"""Shared builders for image tests: a three-part spec over real files on disk."""

from __future__ import annotations

import hashlib
import socket
from pathlib import Path

from frank.assemble.baselayout import BaseImage
from frank.image.spec import ImageSpec, LayerInput

EPOCH = 1_700_000_000


def key_of(*parts: str) -> str:
    """A lock-style content key for test layers."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def make_sources(root: Path, *, kernel_text: str = "kernel v1") -> dict[str, Path]:
    """Three parts' files on disk: a plugin package, a data file, a compiled 'kernel'."""
    plugin = root / "plugin"
    (plugin / "region_cache").mkdir(parents=True, exist_ok=True)
    (plugin / "region_cache" / "__init__.py").write_text("VERSION = 1\n")
    (plugin / "region_cache" / "__pycache__").mkdir(exist_ok=True)
    (plugin / "region_cache" / "__pycache__" / "x.pyc").write_bytes(b"junk")
    data = root / "data"
    data.mkdir(exist_ok=True)
    (data / "table.bin").write_bytes(bytes(range(256)) * 64)
    kernel = root / "kernel"
    kernel.mkdir(exist_ok=True)
    (kernel / "libkern.so").write_text(kernel_text)
    lock = root / "frank.lock"
    lock.write_text('[stack]\nname = "demo"\n')
    return {"plugin": plugin, "data": data, "kernel": kernel, "lock": lock}


def make_spec(base: BaseImage, src: dict[str, Path], *, kernel_key: str = "v1",
              epoch: int = EPOCH) -> ImageSpec:
    """The spec compose would hand over for a demo stack with three parts and a lock."""
    layers = (
        LayerInput("part:region-cache", key_of("plugin", "1"),
                   ((src["plugin"], "/opt/frank/plugins"),)),
        LayerInput("part:table", key_of("data", "1"), ((src["data"], "/opt/frank/data"),)),
        LayerInput("part:kernel", key_of("kernel", kernel_key),
                   ((src["kernel"], "/opt/frank/kernels"),)),
        LayerInput("lock", key_of("lock", "1"), ((src["lock"], "/etc/frank/frank.lock"),)),
    )
    return ImageSpec(
        base_layout=base.layout, base_digest=base.digest, layers=layers,
        env={"FRANK_STACK": "demo", "PYTHONDONTWRITEBYTECODE": "1"},
        entrypoint=["/bin/sh", "-c"], cmd=["cat /etc/frank/frank.lock"],
        labels={"dev.frank.stack": "demo"},
        annotations={"dev.frank.lock.digest": "sha256:" + key_of("lock", "1")},
        source_date_epoch=epoch,
    )


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
