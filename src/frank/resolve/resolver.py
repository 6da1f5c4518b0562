"""Resolve a stack: load each part's manifest, check the set, hash every input.

Checks, each an error naming both sides: a missing requirement, a declared conflict, two
parts replacing the same thing, two sources for one env variable or engine flag, a part
that is parked without its artifact, a patch whose base commit is not the engine's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frank.errors import FrankError
from frank.model.catalog import Catalog, Manifest
from frank.model.kinds.base import FlagValue, PartContext, case_clash, check_flag_values
from frank.model.kinds.engine import EngineBase
from frank.model.kinds.patch import Patch
from frank.model.stack import Stack, load_stack
from frank.model.tomlio import read_toml

# Fields that describe a part's history, not what gets built or run: they are kept in the
# lock but left out of the stack digest, so adopting a part does not change a digest.
METADATA_FIELDS = frozenset({"summary", "provenance", "status", "evidence", "revert"})


@dataclass(frozen=True)
class ResolvedPart:
    """A part in a resolved stack with the content hashes of its inputs."""

    manifest: Manifest
    inputs: dict[str, str]

    @property
    def name(self) -> str:
        return self.manifest.part.name

    def build_spec(self) -> dict[str, Any]:
        """The manifest's fields that decide what is built and run."""
        data = self.manifest.part.model_dump(mode="json")
        return {k: v for k, v in data.items() if k not in METADATA_FIELDS}


@dataclass(frozen=True)
class Resolved:
    """A stack after resolution: ordered parts and the final engine config."""

    stack: Stack
    root: Path
    parts: list[ResolvedPart]  # in layer order: least often changed first
    flags: dict[str, FlagValue]
    env: dict[str, str]
    plugins: list[str]
    base_image: dict[str, str]


def _stack_rel(stack: Stack, root: Path, path: Path) -> str:
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)


def load_base_image(root: Path, name: str, stack_file: Path) -> dict[str, str]:
    """The base image definition ``images/<name>.toml``, identified by content.

    A registry image must be pinned by digest (``ref = NAME@sha256:...``; a tag alone is
    refused). A ``[debs]`` base is identified by its package lock too (missing or stale is
    an error naming the lock).
    """
    from frank.hashing import sha256_file
    from frank.model.pins import check_image_ref

    path = root / "images" / f"{name}.toml"
    if not path.is_file():
        raise FrankError(f"no base image definition images/{name}.toml", file=stack_file,
                         field="image.base")
    raw = read_toml(path)
    out = {"name": name, "definition_sha256": sha256_file(path)}
    ref = raw.get("ref")
    if ref is not None:
        try:
            out["ref"] = check_image_ref(str(ref))
        except ValueError as exc:
            raise FrankError(str(exc), file=path, field="ref") from None
    elif "debs" in raw:  # pinned .debs: the lock beside it is the content (checked offline)
        from frank.model.imagefile import load_image_file
        from frank.resolve.debs.lock import current_lock

        debs = load_image_file(path).debs
        assert debs is not None
        out["debs_lock_sha256"] = current_lock(debs, path)[1]
    elif "debootstrap" in raw:
        from frank.model.imagefile import DEBOOTSTRAP_GONE

        raise FrankError(DEBOOTSTRAP_GONE, file=path, field="debootstrap")
    else:
        raise FrankError("needs ref (NAME@sha256:...) or a [debs] recipe", file=path,
                         field="ref")
    return out


def resolve(stack_path: Path, root: Path, catalog: Catalog | None = None) -> Resolved:
    """Load, merge and check a stack; hash every input of every part."""
    stack = load_stack(stack_path)
    catalog = catalog or Catalog(root)
    manifests: dict[str, Manifest] = {}
    for name, version in stack.parts.items():
        file, field = stack.origin[name]
        manifests[name] = catalog.get(name, version, file=file, field=field)
        missing = manifests[name].part.missing_artifact()
        if missing is not None:
            raise FrankError(
                f"{name} {version} is {manifests[name].part.status} and has no {missing}; "
                "it cannot go into a stack", file=file, field=field)
    _check_relations(stack, manifests)
    _check_archs(stack, manifests)
    base = load_base_image(root, stack.image.base, stack.path)
    _check_engine_image(stack, manifests, base, root)

    parts = []
    for m in manifests.values():
        ctx = PartContext(root=root, manifest=m.path)
        parts.append(ResolvedPart(manifest=m, inputs=m.part.inputs(ctx)))
    parts = layer_order(parts)
    _refuse_duplicate_patches(stack, parts)

    flags, env = _merge_config(stack, parts)
    plugins = sorted({p for rp in parts for p in rp.manifest.part.plugin_names()})
    return Resolved(stack=stack, root=root, parts=parts, flags=flags, env=env,
                    plugins=plugins, base_image=base)


def layer_order(parts: list[ResolvedPart]) -> list[ResolvedPart]:
    """Parts in layer order: by kind (least often changed first), then name, except that a
    part always comes after every part it requires (a stable topological order: of the
    parts whose requirements are placed, the first by kind and name goes next). A cycle of
    ``requires`` is an error naming the parts in it."""
    by_name = {rp.name: rp for rp in parts}
    waiting = {rp.name: {r for r in rp.manifest.part.requires if r in by_name} for rp in parts}
    pending = sorted(parts, key=lambda rp: (type(rp.manifest.part).layer_rank, rp.name))
    out: list[ResolvedPart] = []
    placed: set[str] = set()
    while pending:
        ready = next((rp for rp in pending if waiting[rp.name] <= placed), None)
        if ready is None:
            cycle = _requires_cycle({n: waiting[n] - placed for n in (p.name for p in pending)})
            first = by_name[cycle[0]].manifest
            raise FrankError("requires forms a cycle: " + " -> ".join(
                f"{n} ({by_name[n].manifest.rel})" for n in [*cycle, cycle[0]]),
                file=first.path, field="requires")
        out.append(ready)
        placed.add(ready.name)
        pending.remove(ready)
    return out


def _requires_cycle(edges: dict[str, set[str]]) -> list[str]:
    """One cycle among parts none of which can be placed (each waits for another)."""
    start = min(edges)
    path: list[str] = []
    node = start
    while node not in path:
        path.append(node)
        node = min(edges[node])
    return path[path.index(node):]


def _check_engine_image(stack: Stack, manifests: dict[str, Manifest], base: dict[str, str],
                        root: Path) -> None:
    """An engine that comes as an official image is the image's base: the stack's
    ``[image] base`` must be that image (the base is declared in one place and locked by
    content; frank never swaps it silently), and no patch may claim compiled code, which
    the image holds prebuilt."""
    engine = next((m for m in manifests.values() if isinstance(m.part, EngineBase)), None)
    if engine is None or not isinstance(engine.part, EngineBase) or engine.part.image is None:
        return
    image = engine.part.image
    if base.get("ref") != image:
        fits = sorted(p.relative_to(root).as_posix() for p in (root / "images").glob("*.toml")
                      if _image_ref(p) == image)
        hint = (f"set [image] base to {Path(fits[0]).stem!r} ({fits[0]})" if fits else
                f"add images/<name>.toml with ref = \"{image}\" and name it in [image] base")
        has = f"ref {base['ref']}" if "ref" in base else "a base without the engine"
        raise FrankError(
            f"{stack.image.base!r} (images/{stack.image.base}.toml, {has}) is not the engine's "
            f"image: {engine.part.name} has image = {image} ({engine.rel}), and the engine "
            f"image is the base it runs on; {hint}", file=stack.path, field="image.base")
    for m in manifests.values():
        if isinstance(m.part, Patch) and m.part.touches_compiled:
            raise FrankError(
                f"true, but {engine.part.name} comes as the official engine image (image = "
                f"{image}, {engine.rel}), whose compiled code is prebuilt and cannot take the "
                "patch; build the engine from source at its commit (drop image) or leave this "
                "patch out", file=m.path, field="touches_compiled")


def _declared_archs(part: object) -> tuple[str, list[str]]:
    """(field, archs) of the GPU code a part declares it holds or builds."""
    build = getattr(part, "build", None)
    for field, archs in (("archs", getattr(part, "archs", None)),
                         ("build.archs", getattr(build, "archs", None)),
                         ("cuda_arch_list", getattr(part, "cuda_arch_list", None))):
        if archs:
            return field, [a.removesuffix("+PTX") for a in archs]
    return "", []


def _check_archs(stack: Stack, manifests: dict[str, Manifest]) -> None:
    """A part whose GPU code runs on none of its archs on the stack's ``[target] arch`` is
    refused: sm_120a runs on 12.0 only, sm_120f on the 12.x family, plain sm_120 on 12.0
    and later 12.x; code for another major version (sm_90a, sm_100) never runs on 12.0."""
    from frank.model.archs import parse_arch, runs_on

    if stack.target.arch == "cpu":
        return
    device = parse_arch(stack.target.arch)
    for name, m in manifests.items():
        field, archs = _declared_archs(m.part)
        if archs and not any(runs_on(parse_arch(a), device, ptx=False) for a in archs):
            raise FrankError(
                f"{name}: none of its archs ({', '.join(archs)}) runs on the stack's target "
                f"{stack.target.arch} (an 'a' arch runs on that chip only, an 'f' arch on its "
                "family, a plain one on its own and later minor versions of that major)",
                file=m.path, field=field)


def _image_ref(path: Path) -> str | None:
    try:
        ref = read_toml(path).get("ref")
    except FrankError:
        return None
    return ref if isinstance(ref, str) else None


def _check_relations(stack: Stack, manifests: dict[str, Manifest]) -> None:
    def where(name: str) -> tuple[Path, str]:
        return stack.origin[name]

    replaced: dict[str, str] = {}
    for name in sorted(manifests):
        m = manifests[name]
        part = m.part
        file, field = where(name)
        for req in part.requires:
            if req not in manifests:
                from frank.model.closest import did_you_mean

                raise FrankError(f"{name} requires {req}, which the stack lacks "
                                 f"(declared in {m.rel}){did_you_mean(req, manifests)}",
                                 file=file, field=field)
        for other in part.conflicts:
            if other in manifests:
                raise FrankError(f"{name} conflicts with {other} (declared in {m.rel}); "
                                 f"{other} is set at {where(other)[1]}", file=file, field=field)
        if part.replaces is not None:
            if part.replaces in replaced:
                first = replaced[part.replaces]
                raise FrankError(f"{first} and {name} both replace {part.replaces!r}",
                                 file=file, field=field)
            replaced[part.replaces] = name
    engines = [m for m in manifests.values() if isinstance(m.part, EngineBase)]
    if len(engines) > 1:
        a, b = engines[0].part.name, engines[1].part.name
        raise FrankError(f"two engine bases: {a} and {b}", file=stack.path, field="parts")
    for m in manifests.values():
        if isinstance(m.part, Patch) and engines:
            engine = engines[0].part
            assert isinstance(engine, EngineBase)
            if not set(engine.applies_ids()) & set(m.part.applies_to):
                raise FrankError(
                    f"{m.part.name} applies to {', '.join(c[:19] for c in m.part.applies_to)}"
                    f" but {engine.name} is {', '.join(c[:19] for c in engine.applies_ids())}",
                    file=where(m.part.name)[0], field=where(m.part.name)[1])


def _refuse_duplicate_patches(stack: Stack, parts: list[ResolvedPart]) -> None:
    """The same diff under two part names would be applied twice (the second fails, or
    forces a source build): an error naming both parts."""
    seen: dict[str, str] = {}
    for rp in parts:
        part = rp.manifest.part
        if not isinstance(part, Patch):
            continue
        sha = part.sha256 if part.file is None else rp.inputs.get(part.file, part.sha256)
        if sha is None:
            continue
        if sha in seen:
            file, field = stack.origin[part.name]
            raise FrankError(f"{seen[sha]} and {part.name} carry the same patch (sha256 "
                             f"{sha[:16]}...): keep one of them", file=file, field=field)
        seen[sha] = part.name


def _merge_config(stack: Stack, parts: list[ResolvedPart]
                  ) -> tuple[dict[str, FlagValue], dict[str, str]]:
    flags: dict[str, FlagValue] = dict(stack.flags)
    env: dict[str, str] = dict(stack.env)
    flag_from = dict.fromkeys(flags, f"{stack.path.name} [flags]")
    env_from = dict.fromkeys(env, f"{stack.path.name} [env]")
    for rp in parts:
        part = rp.manifest.part
        for key, value in part.flags().items():
            if key in flag_from:
                raise FrankError(f"flag {key!r} is set by both {flag_from[key]} and {part.name}",
                                 file=rp.manifest.path, field="flags")
            flags[key], flag_from[key] = value, part.name
        for key, val in part.env().items():
            if key in env_from:
                raise FrankError(f"variable {key} is set by both {env_from[key]} and "
                                 f"{part.name}", file=rp.manifest.path, field="env")
            env[key], env_from[key] = val, part.name
    _refuse_clashes(stack, flags, flag_from, "flag")
    _refuse_clashes(stack, env, env_from, "variable")
    try:
        check_flag_values(flags)
    except ValueError as exc:
        raise FrankError(str(exc), file=stack.path, field="flags") from None
    return dict(sorted(flags.items())), dict(sorted(env.items()))


def _refuse_clashes(stack: Stack, merged: dict[str, Any], source: dict[str, str],
                    what: str) -> None:
    """Two keys of the merged flags or env that differ only in case, from any two sources
    (a parent stack and its child, a stack and a part): the engine would see one."""
    clash = case_clash(merged)
    if clash is not None:
        a, b = clash
        raise FrankError(f"{what}s {a!r} ({source[a]}) and {b!r} ({source[b]}) differ "
                         "only in case",
                         file=stack.path, field="flags" if what == "flag" else "env")
