"""Read commands never cut a digest when their output is piped (rich fits 80 columns there)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from frank.image.oci import resolve_manifest
from tests.oci_helpers import tar_of, write_layout


def test_inspect_piped_prints_every_digest_whole(tmp_path: Path) -> None:
    layout = write_layout(tmp_path / "image", [tar_of({"a": b"1"}), tar_of({"b": b"2"})],
                          annotations={"dev.frank.lock.digest": "sha256:" + "ab" * 32})
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    out = subprocess.run([sys.executable, "-m", "frank", "inspect", str(layout)], env=env,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    digest, _, manifest = resolve_manifest(layout)
    for d in [digest, "sha256:" + "ab" * 32, *(x["digest"] for x in manifest["layers"])]:
        assert d in out, (d, out)
    assert "…" not in out
