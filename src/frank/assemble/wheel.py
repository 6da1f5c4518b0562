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
import hashlib
import zipfile
from pathlib import Path, PurePosixPath

from packaging.version import Version

from frank.errors import FrankError
from frank.model.pyproject import Project, read_project

ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)
GENERATOR = "frank-wheelbuild 1"


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
