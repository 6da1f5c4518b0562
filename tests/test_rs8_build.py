"""The rs8 build really holds sm_120 machine code (CI has nvcc but no GPU).

Skips when nvcc or cuobjdump is missing (cuobjdump: PATH or $CUOBJDUMP; the pip
package nvidia-cuda-cuobjdump ships one).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

BUILD = Path(__file__).resolve().parents[1] / "kernels" / "rs8" / "build.sh"


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


def test_check_rejects_a_build_without_sm120(tmp_path: Path) -> None:
    """The check can fail: an sm_90a-only library must not pass as sm_120."""
    _tools()
    assert _run(str(tmp_path), "90a").returncode == 0
    res = _run("--check", str(tmp_path / "librs8.so"), "120")
    assert res.returncode != 0
    assert "no sm_120" in res.stderr
