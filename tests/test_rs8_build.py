"""The rs8 build really holds sm_120 machine code (CI has nvcc but no GPU).

Skips when nvcc or cuobjdump is missing (cuobjdump: PATH or $CUOBJDUMP; the pip
package nvidia-cuda-cuobjdump ships one).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "kernels" / "rs8" / "build.sh"
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "kernels" / "rs8" / "python"))

import rs8_candidates as model  # noqa: E402
import rs8_op  # noqa: E402


def _tools() -> None:
    if shutil.which("nvcc") is None:
        pytest.skip("no nvcc")
    if shutil.which(os.environ.get("CUOBJDUMP", "cuobjdump")) is None:
        pytest.skip("no cuobjdump (set CUOBJDUMP)")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(BUILD), *args], capture_output=True, text=True, check=False)


def test_sm120_build_holds_sm120_code(tmp_path: Path) -> None:
    _tools()
    res = _run(str(tmp_path), "sm_120")
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "librs8.so").is_file()
    assert "sm_120" in res.stdout
    assert _run("--check", str(tmp_path / "librs8.so"), "120").returncode == 0
    # The register-held keys per block (host code, no GPU needed) match the CPU model's
    # block shape, which the threshold-model tests and bench/rs8_candidates.py rely on.
    lib = rs8_op.open_library(tmp_path / "librs8.so")
    for cl in (16, 8, 4):
        assert lib.rs8_block_keys(512, cl) == 4 * model.quads(cl) * model.threads(cl), cl
    assert [16 * lib.rs8_block_keys(2048, 16), 4 * lib.rs8_block_keys(1024, 4)] == [
        196_608,
        131_072,
    ]
    assert lib.rs8_block_keys(512, 2) == 0 and lib.rs8_block_keys(100, 16) == 0


def test_check_rejects_a_build_without_sm120(tmp_path: Path) -> None:
    """The check can fail: an sm_90a-only library must not pass as sm_120."""
    _tools()
    assert _run(str(tmp_path), "90a").returncode == 0
    res = _run("--check", str(tmp_path / "librs8.so"), "120")
    assert res.returncode != 0
    assert "no sm_120" in res.stderr
