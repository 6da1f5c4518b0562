"""The package layout is the architecture: each stage imports only from itself and earlier stages.

Read from the source (every ``import``, also those inside functions), so a lazy import cannot
hide a backwards dependency. The order is the one docs/architecture.md explains.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "frank"
# frank's stages in the order data flows through them; a module may import from its own stage
# or an earlier one. The three root modules (errors, fsutil, hashing) come before all.
STAGES = ["model", "store", "image", "resolve", "assemble", "audit", "history", "run", "ship",
          "trial", "cli"]
ROOT_MODULES = {"errors", "fsutil", "hashing"}


def _stage(module: str) -> int:
    parts = module.split(".")
    if parts[0] != "frank":
        raise ValueError(module)
    if len(parts) == 1 or parts[1] in ROOT_MODULES:
        return -1
    return STAGES.index(parts[1])


def _module_name(path: Path, src: Path) -> str:
    rel = path.relative_to(src.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, src: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "frank"]
        elif (isinstance(node, ast.ImportFrom) and node.module and node.level == 0
              and node.module.split(".")[0] == "frank"):
            for a in node.names:  # `from frank.x import y` may name the module frank.x.y
                full = f"{node.module}.{a.name}"
                sub = src.parent / Path(*full.split("."))
                is_module = sub.with_suffix(".py").is_file() or sub.is_dir()
                out.append((node.lineno, full if is_module else node.module))
    return out


def layering_violations(src: Path = SRC) -> list[str]:
    bad = []
    for path in sorted(src.rglob("*.py")):
        name = _module_name(path, src)
        if name == "frank.__main__":
            continue  # `python -m frank` is the CLI's entry
        own = _stage(name)
        for line, target in _imports(path, src):
            if _stage(target) > own:
                bad.append(f"{path.relative_to(src.parent)}:{line}: {name} imports {target}")
    return bad


def test_every_module_imports_only_its_own_or_earlier_stages() -> None:
    assert layering_violations() == []


def test_at_most_five_modules_at_the_root_and_every_stage_is_a_package() -> None:
    root = {p.stem for p in SRC.glob("*.py")} - {"__init__", "__main__"}
    assert root == ROOT_MODULES
    for stage in STAGES:
        if (SRC / stage).exists():
            assert (SRC / stage / "__init__.py").is_file(), stage
            doc = ast.get_docstring(ast.parse((SRC / stage / "__init__.py").read_text()))
            assert doc and "may import" in doc.lower(), f"{stage}/__init__.py: what may it import?"


def test_the_check_catches_a_backwards_import(tmp_path: Path) -> None:
    """The checker itself can fail: a store module importing the builder is named."""
    pkg = tmp_path / "frank"
    (pkg / "store").mkdir(parents=True)
    (pkg / "assemble").mkdir()
    for p in (pkg / "__init__.py", pkg / "store" / "__init__.py",
              pkg / "assemble" / "__init__.py"):
        p.write_text("")
    (pkg / "assemble" / "plan.py").write_text("X = 1\n")
    (pkg / "store" / "blobs.py").write_text("def f():\n    from frank.assemble import plan\n")
    assert layering_violations(pkg) == [
        "frank/store/blobs.py:2: frank.store.blobs imports frank.assemble.plan"]
    with pytest.raises(ValueError):
        _stage("os.path")
