"""Every test module collects in a venv without torch (a plain ``.[dev]`` install).

torch is optional: the rs8 tests that need it must skip (``pytest.importorskip``), not
break collection. This runs the collection in a subprocess with torch made unimportable,
so it also holds where torch is installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

BLOCKER = '''
import importlib.abc
import sys


class _NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
        return None


sys.meta_path.insert(0, _NoTorch())
'''


def _collect(tmp_path: Path, *paths: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "no_torch_plugin.py").write_text(BLOCKER)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no_torch_plugin",
         "-p", "no:cacheprovider", *paths],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )


def test_every_module_collects_without_torch(tmp_path: Path) -> None:
    res = _collect(tmp_path, "tests")
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "error" not in res.stdout.splitlines()[-1].lower(), res.stdout[-4000:]


def test_the_check_sees_a_module_that_imports_torch(tmp_path: Path) -> None:
    """The blocker works: a module importing torch at the top fails to collect."""
    bad = tmp_path / "test_imports_torch.py"
    bad.write_text("import torch\n\n\ndef test_x() -> None:\n    assert torch\n")
    res = _collect(tmp_path, str(bad))
    assert res.returncode != 0
    assert "blocked" in res.stdout
