"""An attested image still runs (issue 44, item 5): `frank attest` lists the attestations in
index.json beside the image, and an engine reading ``oci:PATH`` refused a layout listing more
than one manifest ("more than one image in oci, choose an image"). Every engine is handed the
image by its digest now (``image.oci.image_view``). One flow: compose, attest, run (buildah),
push, verify.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from frank.image.oci import layout_manifests
from tests.spine_helpers import copy_repo, frank


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("buildah") is None, reason="buildah not installed")
def test_attest_then_run_then_push_then_verify(registry: str, tmp_path: Path) -> None:
    repo = copy_repo(tmp_path / "repo")
    composed = frank("compose", "stacks/smoke-cpu.toml", "--json", cwd=repo)
    assert composed.code == 0, composed.err
    digest = json.loads(composed.out)["image"]["digest"]
    keys = tmp_path / "keys"
    assert frank("keygen", "--out", str(keys / "signer.key"), cwd=repo).code == 0
    attested = frank("attest", "stacks/smoke-cpu.toml", "--key", str(keys / "signer.key"),
                     cwd=repo)
    assert attested.code == 0, attested.err
    assert len(layout_manifests(repo / "out/smoke-cpu/image")) == 3  # image, SBOM, provenance
    hub = tmp_path / "hub"
    hub.mkdir()
    ran = frank("run", "stacks/smoke-cpu.toml", "--engine", "buildah", "--hub-cache", str(hub),
                "--", "--help", cwd=repo)
    assert ran.code == 0, ran.err
    assert "--fetch-only" in ran.out  # the launcher in the image answered
    target = f"{registry}/frank/flow"
    # the uncompressed form keeps the layout digest (a compressed push is test_compress.py's)
    pushed = frank("push", "smoke-cpu", "--to", target, "--compression", "none", cwd=repo)
    assert pushed.code == 0, pushed.err
    assert pushed.out.splitlines()[0] == f"{target}@{digest}"
    verified = frank("verify", f"{target}@{digest}", "--key", str(keys / "signer.pub"),
                     "--json", cwd=repo)
    assert verified.code == 0, verified.err
    assert json.loads(verified.out)["image"] == digest
