"""Install wheels into a layer tree on the host, with the `installer` library.

Chosen over ``uv pip install --target``: `installer` is a library (no subprocess, no
resolver, no network, no cache of its own), it installs exactly the file it is handed and
nothing else, and it writes no bytecode (``.pyc`` embed source mtimes) and no
``direct_url.json`` (a host path). What it writes depends only on the wheel and the scheme,
so two installs give identical trees; the layer writer fixes owners and mtimes.
"""

from __future__ import annotations

import warnings
import zipfile
from pathlib import Path, PurePosixPath

from installer import install
from installer.destinations import SchemeDictionaryDestination
from installer.exceptions import InstallerError
from installer.sources import WheelFile

from frank.errors import FrankError

INTERPRETER = "/usr/bin/python3"


def scheme(staging: Path, site: str) -> dict[str, str]:
    """Where each part of a wheel lands under ``staging`` for the image's ``site`` dir."""
    prefix = PurePosixPath(site).parents[2]  # .../lib/python3.11/dist-packages -> /usr/local
    py = PurePosixPath(site).parent.name  # python3.11
    root = staging / str(prefix).lstrip("/")
    lib = str(staging / site.lstrip("/"))
    return {"purelib": lib, "platlib": lib, "scripts": str(root / "bin"),
            "headers": str(root / "include" / py), "data": str(root)}


def install_wheels(wheels: list[tuple[str, Path]], staging: Path, site: str) -> None:
    """Install each (filename, file) into ``staging``, in the order given; a bad wheel is
    one line. A file two wheels both write (nvidia-cutlass-dsl's two libs wheels share a
    ``.pth``) is overwritten by the later one, as pip does; the order is the plan's sorted
    one, so the result is the same on every build."""
    dest = SchemeDictionaryDestination(scheme(staging, site), interpreter=INTERPRETER,
                                       script_kind="posix", bytecode_optimization_levels=(),
                                       overwrite_existing=True)
    for filename, path in wheels:
        try:
            with zipfile.ZipFile(path) as zf, warnings.catch_warnings():
                # installer skips a wheel's stray __pycache__ files (numpy ships some) and
                # warns; leaving them out is what we want, the warning is noise
                warnings.simplefilter("ignore", RuntimeWarning)
                zf.filename = filename  # WheelFile reads the name from it; the store's is a hash
                install(WheelFile(zf), dest, {"INSTALLER": b"frank\n"})
        except (InstallerError, ValueError, OSError) as exc:
            raise FrankError(f"installing {filename} failed: {exc}", file=path) from None
