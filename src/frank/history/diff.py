"""What differs between two locks: part by part, field by field, layer by layer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from frank.assemble.plan import BuildPlan, build_plan, closure_wheels
from frank.resolve.lock import Lock, LockedPart
from frank.resolve.resolver import METADATA_FIELDS


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out or ({prefix: {}} if prefix else {})
    return {prefix: value}


def field_changes(old: dict[str, Any], new: dict[str, Any]) -> list[dict[str, Any]]:
    """Dotted paths whose value differs, with both values (None where absent)."""
    a, b = _flatten(old), _flatten(new)
    return [{"field": k, "old": a.get(k), "new": b.get(k)}
            for k in sorted(a.keys() | b.keys())
            if a.get(k) != b.get(k) and not (_empty(a.get(k)) and _empty(b.get(k)))]


def _empty(value: Any) -> bool:
    """Absent, or an empty default (``requires = []``): nothing to show either way."""
    return value is None or value == [] or value == {}


# A part's own identity, shown as the part's row itself, not as fields of it.
IDENTITY_FIELDS = frozenset({"name", "version", "kind"})


def _split(locked: LockedPart | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """A locked part as (build fields with its inputs, history fields)."""
    if locked is None:
        return {}, {}
    build = {k: v for k, v in locked.spec.items()
             if k not in METADATA_FIELDS and k not in IDENTITY_FIELDS}
    history = {k: v for k, v in locked.spec.items() if k in METADATA_FIELDS}
    out: dict[str, Any] = {"spec": build, "inputs": locked.inputs}
    if locked.derived:  # a derived part's output, made at lock time: before and after
        out["output"] = {k: locked.derived.get(k) for k in ("sha256", "size")}
    return out, history


def _content(locked: LockedPart) -> tuple[str, tuple[str, ...]] | None:
    """What a part carries, whatever it is named: its kind and its inputs' hashes."""
    return (locked.kind, tuple(sorted(locked.inputs.values()))) if locked.inputs else None


def part_changes(a: Lock, b: Lock) -> list[dict[str, Any]]:
    """Part by part: added, removed, changed (build fields) or history only, each with the
    part's kind, its build fields (spec and inputs) apart from its history fields
    (summary, provenance, status, evidence, revert), and, for a removed and an added part
    that carry the same content under two names, which one is which."""
    parts: list[dict[str, Any]] = []
    names = sorted({p.name for p in a.parts} | {p.name for p in b.parts})
    for name in names:
        pa, pb = a.part(name), b.part(name)
        build_a, hist_a = _split(pa)
        build_b, hist_b = _split(pb)
        if pa is not None and pb is not None:
            if pa.key != pb.key:
                change = "version" if pa.version != pb.version else "changed"
            elif pa.spec != pb.spec:
                change = "history"
            else:
                continue
        else:
            change = "added" if pa is None else "removed"
        either = pb if pb is not None else pa
        assert either is not None
        parts.append({"part": name, "kind": either.kind, "change": change,
                      "old": pa.version if pa else None, "new": pb.version if pb else None,
                      "fields": field_changes(build_a, build_b),
                      "history": field_changes(hist_a, hist_b)})
    removed = {e["part"]: _content(p) for e in parts if e["change"] == "removed"
               and (p := a.part(e["part"])) is not None}
    for entry in parts:
        added = b.part(entry["part"]) if entry["change"] == "added" else None
        if added is None or _content(added) is None:
            continue
        twin = next((n for n, c in removed.items() if c == _content(added)), None)
        if twin is not None:
            entry["same_content_as"] = twin
            next(e for e in parts if e["part"] == twin)["same_content_as"] = entry["part"]
    return parts


def _versions(lock: Lock, plan: BuildPlan, root: Path, closure: bytes | None
              ) -> dict[str, str]:
    """name -> version of the lock's Python closure: from the plan's wheel layers when it
    installs them (no second read of the pylock), else from the pylock itself. On an
    official engine image whose distributions the lock read, what the image holds: the
    image's own, less those a layer takes out, with the closure's over them."""
    if plan.base_python is not None and lock.base_python is not None:
        held = dict(lock.base_python.get("dists") or {})
        for layer in plan.layers:
            for name in layer.base_remove:
                held.pop(name, None)
        if lock.python_closure is not None:
            held.update({w.name: w.version for w in closure_wheels(lock, root, closure)})
        return _less_step_removals(lock, held)
    wheels = [w for layer in plan.layers for w in layer.wheels]
    if not wheels and lock.python_closure is not None:
        wheels = closure_wheels(lock, root, closure)
    return _less_step_removals(lock, {w.name: w.version for w in wheels})


def _less_step_removals(lock: Lock, held: dict[str, str]) -> dict[str, str]:
    """``held`` without the distributions a step's ``removes`` takes out (steps run after
    every install, so nothing puts them back)."""
    from frank.model.kinds.step import removed_distributions

    for part in lock.parts:
        if part.kind == "step":
            for name in removed_distributions(part.spec.get("removes") or []):
                held.pop(name, None)
    return held


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
    parts = part_changes(a, b)
    config = field_changes(
        {"model": a.model, "target": a.target, "base_image": a.base_image,
         "command": a.command, "flags": a.flags, "env": a.env, "plugins": a.plugins,
         "indexes": a.indexes},
        {"model": b.model, "target": b.target, "base_image": b.base_image,
         "command": b.command, "flags": b.flags, "env": b.env, "plugins": b.plugins,
         "indexes": b.indexes},
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
    closure = closure_changes(a, b, (pa_, pb_), root, closures)
    same = a.digest == b.digest
    return {"a": {"stack": a.stack, "digest": a.digest}, "b": {"stack": b.stack,
            "digest": b.digest}, "same": same, "parts": parts, "config": config,
            "closure": closure, "layers": layers}
