"""A repo package's static pyproject metadata (PEP 621 and setuptools' static file lists).

Read when a plugin or kernel manifest is checked (its entry points, its name) and when the
builder writes its wheel (frank.assemble.wheel). Reading runs none of the package's code: a
package that needs code to build (``setup.py``, ``dynamic`` metadata) is refused.
"""

from __future__ import annotations

import fnmatch
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from frank.errors import FrankError


@dataclass(frozen=True)
class Project:
    """The static metadata of one package folder."""

    folder: Path
    name: str
    version: str
    summary: str
    requires_python: str | None
    dependencies: tuple[str, ...]
    entry_points: dict[str, dict[str, str]]
    files: tuple[tuple[str, Path], ...]  # (path inside the wheel, file on disk)

    @property
    def dist(self) -> str:
        """The name as it appears in file names (PEP 427)."""
        return canonicalize_name(self.name).replace("-", "_")

    @property
    def wheel_name(self) -> str:
        return f"{self.dist}-{Version(self.version)!s}-py3-none-any.whl"


def _package_files(folder: Path, package: str, data: list[str]) -> list[tuple[str, Path]]:
    pkg_dir = folder / package.replace(".", "/")
    if not pkg_dir.is_dir():
        raise FrankError(f"package {package!r} is not a folder here",
                         file=folder / "pyproject.toml", field="tool.setuptools.packages")
    out = []
    for path in sorted(pkg_dir.rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts or path.suffix == ".pyc":
            continue
        rel = path.relative_to(folder).as_posix()
        name = path.relative_to(pkg_dir).as_posix()
        if path.suffix == ".py" or any(fnmatch.fnmatch(name, pat) for pat in data):
            out.append((rel, path))
    return out


def _discover(folder: Path) -> list[str]:
    return sorted(p.parent.name for p in folder.glob("*/__init__.py"))


def read_project(folder: Path) -> Project:
    """Static metadata and file list of ``folder``; anything needing code is refused."""
    pyproject = folder / "pyproject.toml"
    try:
        doc = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FrankError("no pyproject.toml", file=pyproject) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise FrankError(f"invalid TOML: {exc}", file=pyproject) from None
    if (folder / "setup.py").exists():
        raise FrankError("setup.py would run code on the host to build this package; frank "
                         "builds only from static [project] metadata", file=folder / "setup.py")
    project: dict[str, Any] = doc.get("project") or {}
    if project.get("dynamic"):
        raise FrankError("dynamic metadata needs the backend's code to run; write the fields "
                         "out", file=pyproject, field="project.dynamic")
    for key in ("name", "version"):
        if not isinstance(project.get(key), str):
            raise FrankError(f"{key} is required (static)", file=pyproject,
                             field=f"project.{key}")
    try:
        Version(project["version"])
    except InvalidVersion:
        raise FrankError(f"not a PEP 440 version: {project['version']!r}", file=pyproject,
                         field="project.version") from None
    deps = project.get("dependencies", [])
    for dep in deps:
        try:
            Requirement(dep)
        except InvalidRequirement as exc:
            raise FrankError(f"not a PEP 508 requirement: {exc}", file=pyproject,
                             field="project.dependencies") from None
    st: dict[str, Any] = doc.get("tool", {}).get("setuptools", {})
    packages = st.get("packages") or _discover(folder)
    data: dict[str, list[str]] = st.get("package-data", {})
    files: list[tuple[str, Path]] = []
    for package in packages:
        files += _package_files(folder, package, data.get(package, []) + data.get("*", []))
    for module in st.get("py-modules", []):
        path = folder / f"{module}.py"
        if not path.is_file():
            raise FrankError(f"module {module!r} has no {module}.py", file=pyproject,
                             field="tool.setuptools.py-modules")
        files.append((f"{module}.py", path))
    for _rel, path in files:
        if path.is_symlink() and not path.resolve().is_relative_to(folder.resolve()):
            raise FrankError("a symlink points outside the package", file=path)
    eps: dict[str, dict[str, str]] = {g: dict(v) for g, v in
                                      project.get("entry-points", {}).items()}
    if project.get("scripts"):
        eps["console_scripts"] = dict(project["scripts"])
    return Project(folder=folder, name=project["name"], version=project["version"],
                   summary=str(project.get("description", "")),
                   requires_python=project.get("requires-python"), dependencies=tuple(deps),
                   entry_points=eps, files=tuple(sorted(files)))
