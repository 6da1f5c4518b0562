"""What differs between two locks: part by part, field by field, layer by layer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from frank.lock import Lock
from frank.plan import BuildPlan, build_plan, closure_wheels


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out or {prefix: {}}
    return {prefix: value}


def field_changes(old: dict[str, Any], new: dict[str, Any]) -> list[dict[str, Any]]:
    """Dotted paths whose value differs, with both values (None where absent)."""
    a, b = _flatten(old), _flatten(new)
    return [{"field": k, "old": a.get(k), "new": b.get(k)}
            for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)]


def _versions(lock: Lock, plan: BuildPlan, root: Path, closure: bytes | None
              ) -> dict[str, str]:
    """name -> version of the lock's Python closure: from the plan's wheel layers when it
    installs them (no second read of the pylock), else from the pylock itself."""
    wheels = [w for layer in plan.layers for w in layer.wheels]
    if not wheels and lock.python_closure is not None:
        wheels = closure_wheels(lock, root, closure)
    return {w.name: w.version for w in wheels}


def closure_changes(a: Lock, b: Lock, plans: tuple[BuildPlan, BuildPlan], root: Path,
                    closures: tuple[bytes | None, bytes | None] = (None, None)
                    ) -> list[dict[str, Any]]:
    """Distributions of the Python closure that one lock has and the other lacks, or has at
    another version: what a package part's ``overrides`` and ``remove`` change, shown by
    name (a small wheel shares a layer, so the layer list alone would hide it)."""
    va = _versions(a, plans[0], root, closures[0])
    vb = _versions(b, plans[1], root, closures[1])
    return [{"distribution": n, "old": va.get(n), "new": vb.get(n)}
            for n in sorted(va.keys() | vb.keys()) if va.get(n) != vb.get(n)]


def diff_locks(a: Lock, b: Lock, root: Path,
               closures: tuple[bytes | None, bytes | None] = (None, None)) -> dict[str, Any]:
    """A structured diff of two locks, ready for a table or for JSON (``closures``: the
    pylock texts of a and b where they are not the files the locks name)."""
    parts: list[dict[str, Any]] = []
    names = sorted({p.name for p in a.parts} | {p.name for p in b.parts})
    for name in names:
        pa, pb = a.part(name), b.part(name)
        if pa is None and pb is not None:
            parts.append({"part": name, "change": "added", "old": None, "new": pb.version,
                          "fields": []})
        elif pb is None and pa is not None:
            parts.append({"part": name, "change": "removed", "old": pa.version, "new": None,
                          "fields": []})
        elif pa is not None and pb is not None and pa.key != pb.key:
            change = "version" if pa.version != pb.version else "changed"
            fields = field_changes({"spec": pa.spec, "inputs": pa.inputs},
                                   {"spec": pb.spec, "inputs": pb.inputs})
            parts.append({"part": name, "change": change, "old": pa.version,
                          "new": pb.version, "fields": fields})
        elif pa is not None and pb is not None and pa.spec != pb.spec:
            parts.append({"part": name, "change": "metadata", "old": pa.version,
                          "new": pb.version,
                          "fields": field_changes(pa.spec, pb.spec)})
    config = field_changes(
        {"model": a.model, "target": a.target, "base_image": a.base_image,
         "command": a.command, "flags": a.flags, "env": a.env, "plugins": a.plugins},
        {"model": b.model, "target": b.target, "base_image": b.base_image,
         "command": b.command, "flags": b.flags, "env": b.env, "plugins": b.plugins},
    )
    pa_, pb_ = build_plan(a, root, closures[0]), build_plan(b, root, closures[1])
    la = {x.name: x for x in pa_.layers}
    lb = {x.name: x for x in pb_.layers}
    layers = []
    for name in [*la, *(n for n in lb if n not in la)]:
        xa, xb = la.get(name), lb.get(name)
        if xa is None:
            state = "added"
        elif xb is None:
            state = "removed"
        else:
            state = "same" if xa.key == xb.key else "rebuilt"
        layers.append({"layer": name, "state": state,
                       "old": xa.key if xa else None, "new": xb.key if xb else None})
    same = a.digest == b.digest
    closure = closure_changes(a, b, (pa_, pb_), root, closures)
    return {"a": {"stack": a.stack, "digest": a.digest}, "b": {"stack": b.stack,
            "digest": b.digest}, "same": same, "parts": parts, "config": config,
            "closure": closure, "layers": layers}
