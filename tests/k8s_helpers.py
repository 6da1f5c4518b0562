"""Helpers for the Kubernetes render tests: a stand-in composed image, a recorded push,
and the offline validators (kubernetes-validate's own schemas, the vendored LWS CRD)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from frank.ship.pushes import PushRecord, record_push
from tests.spine_helpers import Result

K8S_VERSION = "1.37.0"  # the newest schemas kubernetes-validate 1.37.0 ships


def lock_digest(repo: Path, stack: str) -> str:
    """The stack's current lock digest (locked in memory, as render locks it)."""
    from frank.resolve.project import lock_stack

    return lock_stack(str(repo / "stacks" / f"{stack}.toml")).lock.digest


def fake_layout(repo: Path, stack: str, lock: str) -> Path:
    """``out/<stack>/image``: an OCI layout whose manifest names ``lock`` as compose does (no
    layers: render reads only the lock digest it carries)."""
    layout = repo / "out" / stack / "image"
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {}}).encode()
    cd = hashlib.sha256(config).hexdigest()
    (blobs / cd).write_bytes(config)
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": f"sha256:{cd}", "size": len(config)},
        "layers": [], "annotations": {"dev.frank.lock.digest": lock}}).encode()
    md = hashlib.sha256(manifest).hexdigest()
    (blobs / md).write_bytes(manifest)
    (layout / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    (layout / "index.json").write_text(json.dumps({
        "schemaVersion": 2, "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": f"sha256:{md}", "size": len(manifest)}]}))
    return layout


def pushed(repo: Path, stack: str, lock: str, repository: str = "registry.example/frank/x",
           image: str | None = None) -> str:
    """Record a push of the stack's image for ``lock`` (what `frank push` writes); returns
    the image digest."""
    digest = image or "sha256:" + hashlib.sha256(f"{stack}{lock}".encode()).hexdigest()
    record_push(repo, PushRecord(stack=stack, lock_digest=lock, repository=repository,
                                 digest=digest, tags=[stack], time="2026-12-02T00:00:00Z"))
    return digest


def docs(path: Path) -> list[dict[str, Any]]:
    """Every YAML document in a file or a folder of files."""
    files = sorted(path.glob("*.yaml")) if path.is_dir() else [path]
    out = []
    for f in files:
        out.extend(d for d in yaml.safe_load_all(f.read_text()) if d)
    return out


def kubernetes_validate(*files: Path) -> Result:
    """kubernetes-validate --strict (unknown fields refused) against its bundled schemas."""
    exe = Path(sys.executable).with_name("kubernetes-validate")
    proc = subprocess.run([str(exe), "--strict", "-k", K8S_VERSION, *map(str, files)],
                          capture_output=True, text=True, timeout=300)
    return Result(proc.returncode, proc.stdout, proc.stderr)
