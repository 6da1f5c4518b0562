"""What a host build's pinned output is (``output_sha256`` of an ``aot`` or ``extension``
part): the files the store keeps for it and their digest. One answer for release mode's
check of a kept output (``audit.release``) and for ``frank pin --output``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from frank.assemble.aot import kept_paths, output_digest
from frank.assemble.extension import kept_folder
from frank.model.kinds.aot import Aot
from frank.model.kinds.extension import Extension, ext_suffix


def kept_output(part: Aot | Extension, root: Path, manifest: Path,
                store_root: Path) -> dict[str, Path]:
    """name -> each file of the part's kept output in the store at ``store_root`` (there or
    not): an aot part's modules by name, an extension's module under ``""``."""
    if isinstance(part, Aot):
        return kept_paths(part, root, manifest, store_root)
    module = f"{part.module}{ext_suffix(part.python_headers)}"
    return {"": kept_folder(part, root, store_root) / module}


def output_sha256(part: Aot | Extension, files: dict[str, Path],
                  hash_of: Callable[[Path], str]) -> str:
    """What ``output_sha256`` pins, of ``files`` (``kept_output``'s shape), from each file's
    sha256 as ``hash_of`` gives it: an aot folder's ``sha256_tree``, a module's sha256."""
    return output_digest(files, hash_of) if isinstance(part, Aot) else hash_of(files[""])
