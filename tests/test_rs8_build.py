"""The rs8 build really holds sm_120 machine code (CI has nvcc but no GPU).

Skips when nvcc or cuobjdump is missing (cuobjdump: PATH or $CUOBJDUMP; the pip
package nvidia-cuda-cuobjdump ships one). The block-shape check also needs torch (the
CPU model and rs8_op import it) and skips without it; the machine-code checks do not, so
this module collects and runs in a plain ``.[dev]`` venv.
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
MODEL_DIR = ROOT / "kernels" / "rs8" / "research"  # rs8_candidates, the CPU model
PY_DIR = ROOT / "kernels" / "rs8" / "python"


def _tools() -> None:
    if shutil.which("nvcc") is None:
        pytest.skip("no nvcc")
    if shutil.which(os.environ.get("CUOBJDUMP", "cuobjdump")) is None:
        pytest.skip("no cuobjdump (set CUOBJDUMP)")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(BUILD), *args], capture_output=True, text=True, check=False)


@pytest.fixture(scope="module")
def sm120_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One sm_120 build for the module: its folder and build.sh's stdout."""
    _tools()
    out = tmp_path_factory.mktemp("sm120")
    res = _run(str(out), "sm_120")
    assert res.returncode == 0, res.stderr
    return out, res.stdout


def test_sm120_build_holds_sm120_code(sm120_build: tuple[Path, str]) -> None:
    out, stdout = sm120_build
    assert (out / "librs8.so").is_file()
    assert "sm_120" in stdout
    assert _run("--check", str(out / "librs8.so"), "120").returncode == 0


def test_block_keys_match_the_cpu_model(sm120_build: tuple[Path, str]) -> None:
    """The register-held keys per block (host code, no GPU needed) match the CPU model's
    block shape, which the threshold-model tests and kernels/rs8/research/rs8_candidates.py
    rely on."""
    out, _ = sm120_build
    pytest.importorskip("torch")
    for folder in (MODEL_DIR, PY_DIR):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    import rs8_candidates as model
    import rs8_op

    lib = rs8_op.open_library(out / "librs8.so")
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
