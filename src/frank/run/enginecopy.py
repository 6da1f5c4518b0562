"""A container engine's own copy of an image, checked against the layout before it runs.

(The image is handed over by digest through ``frank.image.oci.image_view``.) Why check the
engine's copy: frank re-hashes the layout before every run, but an engine
runs the copy it keeps in its storage (buildah under ``<cache>/containers``), reusing
layers it already holds by digest. A file edited there would run unseen. So the working
container's root filesystem, before anything runs in it, is compared with the tree the
image's (verified) layers make: every path, type, permission bits, owner, link text and
file hash. ``differences`` takes the two trees; ``tree_of_dir`` (a mounted root) and
``tree_of_tar`` (an exported one, as ``docker export`` streams it) read the engine's side.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tarfile
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import IO

from frank.errors import FrankError

# path -> (kind, permission bits, uid, gid, sha256 of a file's bytes or a link's text)
Tree = dict[str, tuple[str, int, int, int, str]]


def _norm(name: str) -> str:
    return str(PurePosixPath("/" + name.removeprefix("./").lstrip("/")))


def _under(path: str, top: str) -> bool:
    return path.startswith(top.rstrip("/") + "/")


def _drop(tree: Tree, top: str, *, keep_top: bool = False) -> None:
    for k in [k for k in tree if _under(k, top) or (k == top and not keep_top)]:
        del tree[k]


def _hash(stream: IO[bytes]) -> str:
    h = hashlib.sha256()
    while chunk := stream.read(1 << 20):
        h.update(chunk)
    return h.hexdigest()


def image_tree(layers: Iterable[Path]) -> Tree:
    """The root filesystem the layer tars make, in order (whiteouts applied)."""
    tree: Tree = {}
    for blob in layers:
        with tarfile.open(blob) as tar:
            for m in tar:
                path = _norm(m.name)
                base = PurePosixPath(path)
                if base.name == ".wh..wh..opq":
                    _drop(tree, str(base.parent), keep_top=True)
                    continue
                if base.name.startswith(".wh."):
                    _drop(tree, str(base.parent / base.name.removeprefix(".wh.")))
                    continue
                if path in tree and not (m.isdir() and tree[path][0] == "dir"):
                    _drop(tree, path, keep_top=True)
                tree[path] = _tar_entry(tar, m, tree)
    tree.pop("/", None)
    return tree


def _tar_entry(tar: tarfile.TarFile, m: tarfile.TarInfo,
               tree: Tree) -> tuple[str, int, int, int, str]:
    mode = m.mode & 0o7777
    if m.isreg():
        handle = tar.extractfile(m)
        return ("file", mode, m.uid, m.gid, _hash(handle) if handle else "")
    if m.islnk():  # a hard link: the content of what it links to
        kind, _, _, _, content = tree.get(_norm(m.linkname), ("file", 0, 0, 0, ""))
        return (kind, mode, m.uid, m.gid, content)
    if m.issym():
        return ("symlink", 0, m.uid, m.gid, m.linkname)
    if m.isdir():
        return ("dir", mode, m.uid, m.gid, "")
    return ("other", mode, m.uid, m.gid, "")


def tree_of_dir(root: Path) -> Tree:
    """A mounted root filesystem, as ``image_tree`` describes one."""
    out: Tree = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            p = Path(dirpath, name)
            st = p.lstat()
            rel = "/" + p.relative_to(root).as_posix()
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISREG(st.st_mode):
                with p.open("rb") as f:
                    out[rel] = ("file", mode, st.st_uid, st.st_gid, _hash(f))
            elif stat.S_ISLNK(st.st_mode):
                out[rel] = ("symlink", 0, st.st_uid, st.st_gid, os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", mode, st.st_uid, st.st_gid, "")
            else:
                out[rel] = ("other", mode, st.st_uid, st.st_gid, "")
    return out


def tree_of_tar(stream: IO[bytes]) -> Tree:
    """An exported root filesystem (a tar stream, e.g. ``docker export``)."""
    out: Tree = {}
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for m in tar:
            out[_norm(m.name)] = _tar_entry(tar, m, out)
    out.pop("/", None)
    return out


def differences(expected: Tree, actual: Tree, *, ignore: Iterable[str] = ()) -> list[str]:
    """The paths where the engine's tree is not the image's, each with what differs.

    ``ignore``: paths the engine makes itself in a working container (mount points of the
    run's volumes and its own files) whose contents are not the image's; a folder the image
    lacks that the engine made to hold one of them is no difference either.
    """
    skip = list(ignore)
    out = []
    for path in sorted(set(expected) | set(actual)):
        if any(path == s or _under(path, s) for s in skip):
            continue
        want, got = expected.get(path), actual.get(path)
        if want is None and got is not None and got[0] == "dir" and \
                any(_under(s, path) for s in skip):
            continue
        if want == got:
            continue
        if want is None:
            out.append(f"{path} is not in the image")
        elif got is None:
            out.append(f"{path} is missing")
        elif want[0] != got[0]:
            out.append(f"{path} is a {got[0]}, the image has a {want[0]}")
        elif want[4] != got[4]:
            out.append(f"{path} has other content")
        else:
            out.append(f"{path} has mode {got[1]:o} owner {got[2]}:{got[3]}, the image "
                       f"{want[1]:o} {want[2]}:{want[3]}")
    return out


def expected_tree(layout: Path, digest: str) -> Tree:
    """The root filesystem the layers of image ``digest`` of ``layout`` make."""
    from frank.image.oci import layout_blob_path, resolve_manifest

    _, _, manifest = resolve_manifest(layout, digest)
    return image_tree(layout_blob_path(layout, d["digest"]) for d in manifest["layers"])


def imported_again(image: str, wrong: list[str]) -> None:
    """Say that the engine's copy differed and was replaced (the first difference)."""
    import sys

    print(f"frank: the engine's stored copy of {image} differs from the layout "
          f"({wrong[0]}); imported it again", file=sys.stderr, flush=True)


def refused(image: str, still: list[str], storage: str | None) -> FrankError:
    """The error when a copy imported again still differs (something still holds it)."""
    return FrankError(f"refusing to run: the engine's stored copy of {image} differs from the "
                      f"layout ({still[0]}) and something in its storage still holds it: "
                      f"remove frank's containers and images there", file=storage)
