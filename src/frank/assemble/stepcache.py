"""The outputs of builder stages (a post-install step, a source-built wheel), kept by the
layer's key so that a container rebuild runs a stage only when its key changed.

A stage's key covers its declared inputs, its commands and every layer below it
(``plan._key_stages_on_below``), so the same key means the same outputs. After a container
build, each stage that ran has its outputs taken out of the built image: the stage's layer
is found by the marker its last instruction carries (``: frank-layer KEY``, in the image
history), and the output paths are read from the layers up to it (whiteouts honoured; an
engine that squashes the final stage puts later steps in that layer too, which only the
outputs' own paths are taken from). A
later build stages them on the host and copies them in instead of running the stage.
Kept under ``<store>/step-outputs/<key>/``, written whole (temp + rename), with the tree's
exact digest (every path, type, mode, link text and file hash) in ``done.json``: a kept tree
is checked against it before it is used, and one that differs (a file edited, added or
removed, a link swapped) is moved aside, so the stage runs again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

from frank.assemble.plan import PlanLayer
from frank.image.oci import layout_blob_path, read_layout_blob, resolve_manifest

MARKER = "frank-layer"


def marker(layer: PlanLayer) -> str:
    """The no-op shell step that names a stage's layer in the image history."""
    return f": {MARKER} {layer.key}"


def cached(store_root: Path, layer: PlanLayer) -> Path | None:
    """The kept outputs of this stage's key (a tree rooted at /), if there are any and they
    are still the tree that was kept; a changed one is moved aside (None: run the stage)."""
    folder = store_root / "step-outputs" / layer.key
    try:
        done = json.loads((folder / "done.json").read_bytes())
        recorded = done.get("tree") if isinstance(done, dict) else None
    except (OSError, ValueError):
        recorded = None
    if recorded is None and not folder.exists():
        return None
    if recorded is not None and done.get("key") == layer.key and \
            (folder / "tree").is_dir() and tree_digest(folder / "tree") == recorded:
        return folder / "tree"
    _move_aside(store_root, folder)
    return None


def _move_aside(store_root: Path, folder: Path) -> None:
    bad = store_root / "quarantine" / "step-outputs"
    bad.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(folder, tempfile.mkdtemp(prefix=f"{folder.name[:16]}-", dir=bad))
    except OSError:
        shutil.rmtree(folder, ignore_errors=True)


def tree_digest(root: Path) -> str:
    """An exact digest of a tree: each entry's path, type, permission bits, and its bytes'
    hash (a file) or target text (a link), in sorted order; mtimes and owners left out."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted([*dirnames, *filenames]):
            path = Path(dirpath, name)
            st = path.lstat()
            rel = path.relative_to(root).as_posix()
            if stat.S_ISLNK(st.st_mode):
                what = "l " + os.readlink(path)
            elif stat.S_ISDIR(st.st_mode):
                what = "d"
            elif stat.S_ISREG(st.st_mode):
                fh = hashlib.sha256()
                with path.open("rb") as f:
                    while chunk := f.read(1 << 20):
                        fh.update(chunk)
                what = "f " + fh.hexdigest()
            else:
                what = f"o {stat.S_IFMT(st.st_mode)}"
            h.update(f"{rel}\0{stat.S_IMODE(st.st_mode):o}\0{what}\n".encode())
    return "sha256:" + h.hexdigest()


def _image_path(name: str) -> PurePosixPath:
    """A layer tar member's name as an absolute image path (``./opt/x``, ``opt/x``)."""
    return PurePosixPath("/" + name.removeprefix("./").lstrip("/"))


def _under(name: str, outputs: list[PurePosixPath]) -> bool:
    path = _image_path(name)
    return any(path == out or out in path.parents for out in outputs)


def save(store_root: Path, layer: PlanLayer, layout: Path) -> bool:
    """Keep the outputs of ``layer``'s stage from the image at ``layout``; False when its
    layer cannot be told apart (nothing is kept then: the next build runs the stage)."""
    assert layer.stage is not None
    _, _, manifest = resolve_manifest(layout)
    config = json.loads(read_layout_blob(layout, manifest["config"]["digest"], "config"))
    history = config.get("history", [])
    want = marker(layer)
    at = [i for i, h in enumerate(history) if want in h.get("created_by", "")]
    if len(at) != 1 or sum(not h.get("empty_layer") for h in history) != \
            len(manifest["layers"]):
        return False
    # an engine that commits a stage's steps together records them as empty, and their
    # changes in the layer of the next step that is not: the layer holding the marker
    holding = next((i for i in range(at[0], len(history))
                    if not history[i].get("empty_layer")), None)
    if holding is None:
        return False
    index = sum(not h.get("empty_layer") for h in history[:holding])
    outputs = [PurePosixPath(o) for o in layer.stage.outputs]
    final = store_root / "step-outputs" / layer.key
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{layer.key[:16]}-", dir=final.parent))
    try:
        tree = tmp / "tree"
        tree.mkdir()
        for desc in manifest["layers"][: index + 1]:
            _apply(layout_blob_path(layout, desc["digest"]), tree, outputs)
        if not all((tree / str(o).lstrip("/")).exists() for o in outputs):
            return False
        (tmp / "done.json").write_text(json.dumps({"layer": layer.name, "key": layer.key,
                                                   "outputs": layer.stage.outputs,
                                                   "tree": tree_digest(tree)}) + "\n")
        try:
            tmp.rename(final)
        except OSError:  # another build kept the same key meanwhile: the same outputs
            if not (final / "done.json").is_file():
                raise
        return True
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _apply(blob: Path, tree: Path, outputs: list[PurePosixPath]) -> None:
    """One layer's entries under the output paths, onto ``tree`` (whiteouts remove)."""
    with tarfile.open(blob) as tar:
        for member in tar:
            if not _under(member.name, outputs) and not _whiteout_under(member.name, outputs):
                continue
            name = _image_path(member.name).relative_to("/")
            if name.name == ".wh..wh..opq":  # the folder's lower entries are hidden
                folder = tree / name.parent
                if folder.is_dir():
                    for child in folder.iterdir():
                        _remove(child)
                continue
            if name.name.startswith(".wh."):
                _remove(tree / name.parent / name.name.removeprefix(".wh."))
                continue
            tar.extract(member, tree, filter="tar")


def _whiteout_under(name: str, outputs: list[PurePosixPath]) -> bool:
    path = _image_path(name)
    if not path.name.startswith(".wh."):
        return False
    hidden = path.parent / path.name.removeprefix(".wh.")
    return (path.name == ".wh..wh..opq" and _under(str(path.parent), outputs)) or \
        _under(str(hidden), outputs)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def place(tree: Path, dest: Path) -> None:
    """Copy kept outputs into a context folder (links and modes as they were)."""
    shutil.copytree(tree, dest, symlinks=True, dirs_exist_ok=True)
