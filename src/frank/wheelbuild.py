"""Build a wheel from a repo package's static pyproject metadata, running none of its code.

A plugin or a kernel's Python package is turned into a wheel on the host and installed
into its layer like every other wheel. PEP 517 backends execute the package's own build
code (``setup.py``, plugins of the backend) as the user; frank instead reads the static
``[project]`` table (PEP 621) and setuptools' static ``[tool.setuptools]`` file lists and
writes the wheel itself, so a manifest from someone else cannot run anything on the host.
A package that needs code to build (``setup.py``, ``dynamic`` metadata) is refused.

The wheel is byte-deterministic: entries sorted, every timestamp 1980-01-01, stored
without compression (a deflate stream depends on the zlib build, as the layer tars do).
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from frank.errors import FrankError

ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)
GENERATOR = "frank-wheelbuild 1"


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


def _metadata(p: Project) -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {p.name}", f"Version: {p.version}"]
    if p.summary:
        lines.append(f"Summary: {' '.join(p.summary.split())}")
    if p.requires_python:
        lines.append(f"Requires-Python: {p.requires_python}")
    lines += [f"Requires-Dist: {d}" for d in p.dependencies]
    return "\n".join(lines) + "\n"


def _entry_points(p: Project) -> str:
    out = []
    for group in sorted(p.entry_points):
        out.append(f"[{group}]")
        out += [f"{k} = {v}" for k, v in sorted(p.entry_points[group].items())]
        out.append("")
    return "\n".join(out)


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(folder: Path, out_dir: Path) -> Path:
    """Write ``folder``'s wheel into ``out_dir`` (same input, same bytes) and return it."""
    project = read_project(folder)
    info = f"{project.dist}-{Version(project.version)!s}.dist-info"
    entries: list[tuple[str, bytes, int]] = []
    for rel, path in project.files:
        mode = 0o755 if path.stat().st_mode & 0o111 else 0o644
        entries.append((rel, path.read_bytes(), mode))
    entries.append((f"{info}/METADATA", _metadata(project).encode(), 0o644))
    entries.append((f"{info}/WHEEL", (f"Wheel-Version: 1.0\nGenerator: {GENERATOR}\n"
                                      "Root-Is-Purelib: true\nTag: py3-none-any\n").encode(),
                    0o644))
    if project.entry_points:
        entries.append((f"{info}/entry_points.txt", _entry_points(project).encode(), 0o644))
    entries.sort(key=lambda e: e[0])
    record = "".join(_record_line(n, d) + "\n" for n, d, _ in entries) + f"{info}/RECORD,,\n"
    entries.append((f"{info}/RECORD", record.encode(), 0o644))
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / project.wheel_name
    tmp = target.with_name(f".{target.name}.tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, data, mode in entries:
            if PurePosixPath(name).is_absolute() or ".." in PurePosixPath(name).parts:
                raise FrankError(f"unsafe path in wheel: {name}", file=folder)
            zi = zipfile.ZipInfo(name, date_time=ZIP_EPOCH)
            zi.external_attr = (0o100000 | mode) << 16
            zi.create_system = 3
            zf.writestr(zi, data)
    tmp.replace(target)
    return target
