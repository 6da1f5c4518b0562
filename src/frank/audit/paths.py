"""Paths the other checks could not see (issue 53): bytecode and whiteouts in frank's layers.

Bytecode: frank ships none. Its layer writer leaves ``__pycache__`` and ``*.pyc`` out (a
.pyc embeds its source's mtime, and images are byte-reproducible), the container compiles
what it imports into the run cache (``frank.run.runcache``, sealed). Checked-hash .pycs
compiled from the image's own sources were the other way; they would need the image's own
interpreter at build time (its magic number and marshal format), for a start-up gain the run
cache already gives. So any ``.pyc``/``.pyo`` or ``__pycache__`` in a layer frank made is a
difference: no part can declare one. (Layers that run commands in the image, whose files
are not predicted, are said in the notes instead.)

Whiteouts: a whiteout hides what lower layers hold, which the merged view then never shows
the other checks. Each one in a frank layer must hide a path some part declares gone: a
file a patch deletes, a path a step ``removes`` (or under its outputs, which it replaces),
or a file of a distribution a part removes or a layer replaces (from that distribution's
RECORD in a lower layer, and its dist-info folder).
"""

from __future__ import annotations

import posixpath

from frank.assemble.plan import BuildPlan
from frank.audit.checks import SITE_DIRS, _canonical, _image_path
from frank.audit.expect import Expected, parse_record
from frank.audit.layers import MergedView
from frank.audit.report import Difference
from frank.resolve.lock import Lock

BYTECODE = (".pyc", ".pyo")


def is_bytecode(path: str) -> bool:
    return path.endswith(BYTECODE) or "__pycache__" in path.split("/")


def bytecode_differences(view: MergedView, want: Expected, base_layers: int,
                         ran: frozenset[int] = frozenset()) -> list[Difference]:
    """Every bytecode file or cache folder a frank layer holds; ``ran``: the layers whose
    commands ran in the image (a step's python writes the stdlib's bytecode as it starts):
    noted, not refused."""
    if ran:
        want.notes.append(f"layers {', '.join(map(str, sorted(ran)))} ran commands in the "
                          "image: bytecode they wrote is not refused")
    if want.unpredicted:
        want.notes.append("layers run commands in the image: bytecode they write is not "
                          "refused (pass pip --no-compile in such a step)")
        return []
    out = []
    for layer in view.layers[base_layers:]:
        if layer.index in ran:
            continue
        for entry in layer.entries:
            if entry.kind in ("whiteout", "opaque") or not is_bytecode(entry.path):
                continue
            if entry.kind == "dir" and not entry.path.endswith("__pycache__"):
                continue
            out.append(Difference(
                part="-", path="/" + entry.path,
                check="bytecode in a frank layer (frank ships none: no part declares it)",
                lock="absent", image=f"{entry.kind} in layer {layer.index}" +
                (f" sha256 {entry.sha256[:16]}" if entry.sha256 else "")))
    return out


def _declared_gone(view: MergedView, plan: BuildPlan, lock: Lock, want: Expected,
                   below: int) -> tuple[set[str], list[str]]:
    """(paths, folders) some part declares gone, as seen from layer ``below``."""
    paths = {p for p, _ in want.deleted}
    folders = [f for f, _ in want.free]
    for locked in lock.parts:
        if locked.kind == "step":
            folders += [str(p).strip("/") for p in locked.spec.get("removes") or []]
    dists = set(want.removed)
    for step in plan.layers:
        dists.update(_canonical(d) for d in step.base_remove)
    if dists:
        for layer in view.layers[:below]:
            for entry in layer.entries:
                if not entry.path.endswith(".dist-info/RECORD") or entry.kind != "file":
                    continue
                info = entry.path[: -len("/RECORD")]
                site, _, folder = info.rpartition("/")
                name = folder[: -len(".dist-info")].rpartition("-")[0]
                if not site.endswith(SITE_DIRS) or _canonical(name) not in dists:
                    continue
                paths.add(info)
                text = view.read(layer.index, entry).decode("utf-8", "replace")
                paths.update(_image_path(site, rel) for rel in parse_record(text))
    return paths, folders


def _only_gone(view: MergedView, below: int, folder: str, paths: set[str]) -> bool:
    """Whether ``folder``, in the layers below ``below``, holds files and only files declared
    gone (and their bytecode): a removed distribution's own package folder, whited out whole
    as pip uninstall removes it (issue 54: an emptied folder still imports)."""
    prefix = folder + "/"
    found = False
    for layer in view.layers[:below]:
        for entry in layer.entries:
            if not entry.path.startswith(prefix) or entry.kind in ("dir", "whiteout", "opaque"):
                continue
            if entry.path not in paths and "__pycache__" not in entry.path.split("/"):
                return False
            found = True
    return found


def whiteout_differences(view: MergedView, plan: BuildPlan, lock: Lock, want: Expected,
                         base_layers: int) -> list[Difference]:
    """Every whiteout in a frank layer that hides what no part declares gone."""
    out: list[Difference] = []
    cache: dict[int, tuple[set[str], list[str]]] = {}
    for layer in view.layers[base_layers:]:
        for entry in layer.entries:
            if entry.kind not in ("whiteout", "opaque"):
                continue
            parent = posixpath.dirname(entry.path)
            target = parent if entry.kind == "opaque" else posixpath.join(
                parent, posixpath.basename(entry.path)[len(".wh."):])
            if layer.index not in cache:
                cache[layer.index] = _declared_gone(view, plan, lock, want, layer.index)
            paths, folders = cache[layer.index]
            if entry.kind == "whiteout" and (target in paths or _only_gone(
                    view, layer.index, target, paths)):
                continue
            if any(target == f or target.startswith(f + "/") for f in folders if f):
                continue
            if want.unpredicted and entry.kind == "whiteout" and any(
                    f"/{d}/" in f"/{target}" for d in SITE_DIRS):
                continue  # pip uninstalling in a layer that runs commands
            what = "everything under it" if entry.kind == "opaque" else "it"
            out.append(Difference(
                part="-", path="/" + target,
                check=f"whiteout hiding {what} (no remove, removes or patch declares it gone)",
                lock="present", image=f"hidden by /{entry.path} in layer {layer.index}"))
    return out
