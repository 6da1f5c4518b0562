"""Which rendered Kubernetes objects two locks change, and which of their fields.

Both locks are rendered as ``frank render k8s`` would, with the image named by its lock
(``image-of-lock@<lock digest>``): an image is built from exactly one lock, so two locks
give two images, and this needs no registry. Objects are matched by kind (a stack renders
at most one of each), so two stacks' objects are compared even though their names differ.
"""

from __future__ import annotations

from typing import Any

from frank.errors import FrankError
from frank.resolve.lock import Lock

LOCK_IMAGE = "image-of-lock"


def _leaves(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_leaves(v, f"{prefix}.{k}" if prefix else str(k)))
        return out or {prefix: {}}
    if isinstance(value, list):
        out = {}
        # containers, env, volumes, ports: by name, so one added variable is one change
        named = all(isinstance(v, dict) and isinstance(v.get("name"), str) for v in value)
        for i, v in enumerate(value):
            out.update(_leaves(v, f"{prefix}[{v['name'] if named else i}]"))
        return out or {prefix: []}
    return {prefix: value}


def objects_of(lock: Lock) -> dict[str, dict[str, Any]] | str:
    """Kind -> object, or the one line saying why the lock cannot be rendered."""
    from frank.ship.render.k8s import ImageRef, render_objects

    try:
        objs = render_objects(lock, ImageRef(LOCK_IMAGE, lock.digest))
    except FrankError as exc:
        return exc.one_line()
    return {str(o["kind"]): o for o in objs}


def diff_objects(a: Lock, b: Lock) -> dict[str, Any]:
    """``{"objects": [{kind, state, a, b, fields}], "unrendered": {...}}``."""
    oa, ob = objects_of(a), objects_of(b)
    unrendered = {side: why for side, why in (("a", oa), ("b", ob)) if isinstance(why, str)}
    if unrendered:
        return {"objects": [], "unrendered": unrendered}
    assert isinstance(oa, dict) and isinstance(ob, dict)
    rows = []
    for kind in sorted(oa.keys() | ob.keys()):
        xa, xb = oa.get(kind), ob.get(kind)
        la, lb = _leaves(xa or {}), _leaves(xb or {})
        fields = sorted(k for k in la.keys() | lb.keys() if la.get(k) != lb.get(k))
        state = ("added" if xa is None else "removed" if xb is None
                 else "changed" if fields else "same")
        rows.append({"kind": kind, "state": state,
                     "a": xa["metadata"]["name"] if xa else None,
                     "b": xb["metadata"]["name"] if xb else None,
                     "fields": fields if xa is not None and xb is not None else []})
    return {"objects": rows, "unrendered": {}}
