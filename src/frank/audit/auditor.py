"""Audit an OCI layout against a lock: read, merge, compare, report (and keep the verdict).

The layers are read once (``frank.audit.layers``); what the image must hold comes from the
stack's lock in the repo and its plan (``frank.audit.expect``), the base from its pins
(``frank.audit.base``); ``frank.audit.checks``, ``paths`` (bytecode, whiteouts) and
``config`` compare. The layer blobs
are not re-hashed against their digests here: ``frank run`` and ``verify`` do that every time
(``image.verify``), and an image whose digests were all recomputed passes that check anyway;
what the audit proves is the content.
"""

from __future__ import annotations

import json
import re
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from frank.assemble.plan import BuildPlan
from frank.audit.base import DerivedBase, base_annotation, base_differences, derive_base
from frank.audit.checks import Checker, cuda_summary, declared_archs
from frank.audit.config import config_differences
from frank.audit.cuda import CudaCode
from frank.audit.expect import Expected, expected
from frank.audit.layers import Entry, MergedView, read_image, read_large_cuda
from frank.audit.paths import bytecode_differences, whiteout_differences
from frank.audit.report import (
    AuditReport,
    Cost,
    CudaOwner,
    Difference,
    TargetReport,
    save_record,
)
from frank.errors import FrankError
from frank.image.oci import layout_blob_path, read_layout_blob, resolve_manifest
from frank.resolve.lock import Lock
from frank.store.blobs import BlobStore


class AuditFailed(FrankError):
    """The image is not what its lock says (exit 1: a finding, not a bad input)."""

    exit_code = 1


def audit_layout(layout: Path, lock: Lock | None, root: Path, *,
                 store: BlobStore | None = None, require_target: bool = False,
                 workers: int | None = None,
                 known: Mapping[str, list[Entry]] | None = None,
                 keep_known: bool = False) -> AuditReport:
    """Every difference between the image at ``layout`` and ``lock`` (repo at ``root``);
    without a lock, the repo's lock of the stack the image names (``stack_lock``).

    ``known``: layer digest -> the entries ``layers.TarReader`` read from the very bytes
    the build hashed into that digest as it wrote them (in its own worker, handed over
    in memory, never stored): those layers are not read back. What the audit holds them to
    is the same: every file's own sha256, parsed from the tar by this module's reader.
    ``keep_known``: those readings are kept by digest too (``frank.audit.kept``), as the
    readings of blobs read here are where the stat ledger vouches for the blob.
    """
    from frank.assemble.plan import build_plan

    start, cpu = time.perf_counter(), time.process_time()
    layout = Path(layout).absolute()
    store = store or BlobStore()
    digest, _, manifest = resolve_manifest(layout)
    cdig = str((manifest.get("config") or {}).get("digest", ""))
    image_config = json.loads(read_layout_blob(layout, cdig, "config"))
    descs = manifest.get("layers") or []
    blobs = [layout_blob_path(layout, str(d.get("digest", ""))) for d in descs]
    for path, d in zip(blobs, descs, strict=True):
        if not path.is_file() or path.stat().st_size != int(d.get("size", -1)):
            raise FrankError(f"layer blob {d.get('digest')} is missing or has the wrong size",
                             file=path)
        if "gzip" in str(d.get("mediaType", "")) or "zstd" in str(d.get("mediaType", "")):
            raise FrankError("compressed layers are not audited: frank writes uncompressed "
                             "ones (frank compose)", file=path)
    known = known or {}
    mine = {i: known[str(d.get("digest", ""))] for i, d in enumerate(descs)
            if str(d.get("digest", "")) in known}
    sound = _vouched(store, blobs, descs, mine) | set(mine)
    if lock is None:
        lock = stack_lock(layout, root)
    plan = build_plan(lock, root)
    want = expected(plan, lock, root, store)
    # from the repo's pins, never the cached base
    base = derive_base(lock, root, store, have=[str(d.get("digest", "")) for d in descs])
    from frank.audit.config import engine_built

    engine = engine_built(image_config)
    # an image a container engine built from frank's Dockerfile: any of its layers may have
    # run python (a RUN, a pip uninstall), which writes the stdlib's bytecode
    ran_plan = None if engine else sorted(i for i, layer in enumerate(plan.layers)
                                          if layer.impure or layer.run)
    key = None
    if not require_target and len(sound) == len(descs) and not store.full_verify:
        top = None if engine else _lock_layer(plan, base, descs, blobs, want)
        # a verdict is of blobs' readings: none is used or kept where the build handed in
        # its own reading of a layer (but the lock layer's, read here on its own)
        handed = set(mine) - ({top.index} if top is not None else set())
        if (engine or top is not None) and not handed:
            key = _verdict_key(descs, base, want, plan, lock, ran_plan, top)
    verdict = _from_kept(store, key) if key else None
    target, n_kept = None, 0
    found_t: list[Difference] = []
    if verdict is None:
        kept = _kept(store, blobs, descs, sound - set(mine))
        n_kept = len(kept)
        view = read_image(blobs, workers, {**mine, **kept})
        base_diffs, base_layers = base_differences(view, manifest, base)
        read_large_cuda(view)
        _keep(store, view, descs, (sound if keep_known else sound - set(mine)) - set(kept))
        found, owned, base_dists = Checker(view, want, base_layers, store=store).run()
        ran = frozenset(range(base_layers, len(view.layers))) if ran_plan is None \
            else frozenset(base_layers + i for i in ran_plan)
        found += bytecode_differences(view, want, base_layers, ran)
        found += whiteout_differences(view, plan, lock, want, base_layers)
        cuda, files = cuda_summary(view, owned, want.target, base_layers)
        archs = declared_archs(want, files)
        nfiles = sum(1 for _, e in view.visible.values() if e.kind == "file")
        verdict = _Verdict(base_diffs, found, archs, cuda, sorted(base_dists), nfiles)
        if key:
            _keep_verdict(store, key, verdict)
        if require_target:
            target, found_t = _on_target(view, lock, want, files, owned, image_config)
    diffs = (verdict.base + base_annotation(manifest, base, engine) + verdict.checks
             + config_differences(plan, base.config, image_config) + verdict.archs)
    diffs += found_t
    total = sum(p.stat().st_size for p in blobs)
    cost = Cost(seconds=round(time.perf_counter() - start, 3),
                cpu_seconds=round(time.process_time() - cpu, 3), layers=len(blobs),
                bytes=total, files=verdict.files, read_in_build=len(mine), kept=n_kept,
                verdict_kept=verdict.kept)
    return AuditReport(layout=str(layout), digest=digest, stack=lock.stack,
                       lock_digest=lock.digest, target=want.target, ok=not diffs,
                       require_target=require_target, differences=diffs, notes=want.notes,
                       cuda=verdict.cuda, target_report=target, dists=len(want.dists),
                       base_dists=verdict.base_dists, cost=cost)


def _vouched(store: BlobStore, blobs: list[Path], descs: list[Any],
             tapped: Mapping[int, list[Entry]]) -> set[int]:
    """The layers not tapped by the build whose blob the stat ledger vouches holds its
    digest, by index."""
    from frank.audit.kept import vouched

    return {i for i, d in enumerate(descs)
            if i not in tapped and vouched(store, blobs[i], str(d.get("digest", "")))}


def _kept(store: BlobStore, blobs: list[Path], descs: list[Any],
          which: set[int]) -> dict[int, list[Entry]]:
    """Of the layers ``which`` (their blobs vouched for), those an earlier audit kept a
    reading of (``frank.audit.kept``), by index."""
    from frank.audit.kept import kept_readings

    want = {i: str(descs[i].get("digest", "")) for i in which}
    found = kept_readings(store, want.values())
    return {i: found[d] for i, d in want.items() if d in found}


@dataclass
class _Verdict:
    """What the audit found in the files of the merged image (everything but the manifest's
    base annotation, the config and the target section), and what it counted."""

    base: list[Difference]
    checks: list[Difference]
    archs: list[Difference]
    cuda: list[CudaOwner]
    base_dists: list[str]
    files: int
    kept: bool = False


@dataclass
class _LockLayer:
    """The image's top layer, frank's lock: read (a few KB) and found to hold the lock file
    the expectations name, at its sha256, and nothing but its folders."""

    index: int
    path: str
    shape: list[tuple[str, str, int, str]]


def _lock_layer(plan: BuildPlan, base: DerivedBase, descs: list[Any], blobs: list[Path],
                want: Expected) -> _LockLayer | None:
    """The lock layer, when it holds exactly the lock file the lock makes (else None: the
    whole image is read, and the audit names what differs). An env part changes only the
    config and this layer: the verdict on the rest is kept by the rest's digests."""
    from frank.audit.layers import read_layer

    last = plan.layers[-1] if plan.layers else None
    if last is None or last.kind != "lock" or len(last.generated) != 1 or \
            len(descs) != len(base.layers) + len(plan.layers):
        return None
    path = last.generated[0].dest.strip("/")
    sha = next((f.sha256 for f in want.files if f.path == path), None)
    index = len(descs) - 1
    entries = read_layer(index, blobs[index]).entries
    files = [e for e in entries if e.kind != "dir"]
    parents = {"/".join(path.split("/")[:n]) for n in range(1, path.count("/") + 1)}
    if [(e.path, e.kind, e.sha256) for e in files] != [(path, "file", sha)] or \
            any(e.path not in parents for e in entries if e.kind == "dir"):
        return None
    return _LockLayer(index, path, [(e.path, e.kind, e.mode, e.link) for e in entries])


def _verdict_key(descs: list[Any], base: DerivedBase, want: Expected, plan: BuildPlan,
                 lock: Lock, ran_plan: list[int] | None, top: _LockLayer | None) -> str:
    """What the verdict on the files is a function of: the layers' digests (their blobs
    vouched for), the base derived from the pins, every expectation but the config's (env,
    entrypoint, labels: checked every time), and the plan's and lock's facts the bytecode
    and whiteout checks read. The lock layer (``top``, checked on its own) stands in by its
    shape, and the lock file's sha256 is left out of the expectations."""
    from frank.audit.kept import verdict_key

    # the config's expectations are checked every time; files go in below, the lock file's
    # sha256 left out where the lock layer was checked on its own
    apart = {"env", "entrypoint", "labels", "notes", "files"}
    layers = [str(d.get("digest", "")) for d in descs]
    files = [(f.path, f.sha256, f.part, f.what) for f in want.files]
    if top is not None:
        layers[top.index] = "the lock layer, checked on its own"
        files = [(p, "-" if p == top.path else h, part, what) for p, h, part, what in files]
    return verdict_key({
        "layers": layers, "top": top.shape if top is not None else None,
        "base": [base.name, base.digest, base.layers, base.how],
        "want": {f.name: getattr(want, f.name) for f in fields(want)
                 if f.name not in apart},
        "files": files,
        "ran": ran_plan,
        "base_remove": [sorted(layer.base_remove) for layer in plan.layers],
        "removes": [[p.name, p.kind, p.spec.get("removes") or []] for p in lock.parts],
    })


def _from_kept(store: BlobStore, key: str) -> _Verdict | None:
    from frank.audit.kept import kept_verdict

    data = kept_verdict(store, key)
    if data is None:
        return None
    try:
        base, checks, archs = ([Difference.model_validate(d) for d in data[k]]
                               for k in ("base", "checks", "archs"))
        return _Verdict(base, checks, archs,
                        [CudaOwner.model_validate(c) for c in data["cuda"]],
                        [str(x) for x in data["base_dists"]], int(data["files"]), kept=True)
    except (KeyError, TypeError, ValueError):
        return None


def _keep_verdict(store: BlobStore, key: str, verdict: _Verdict) -> None:
    from frank.audit.kept import keep_verdict

    keep_verdict(store, key, {
        "base": [d.model_dump() for d in verdict.base],
        "checks": [d.model_dump() for d in verdict.checks],
        "archs": [d.model_dump() for d in verdict.archs],
        "cuda": [c.model_dump() for c in verdict.cuda],
        "base_dists": verdict.base_dists, "files": verdict.files})


def _keep(store: BlobStore, view: MergedView, descs: list[Any], read: set[int]) -> None:
    """Keep the readings of ``read``: layers read now whose bytes are their digest's."""
    from frank.audit.kept import keep_readings

    keep_readings(store, {str(descs[layer.index].get("digest", "")): layer.entries
                          for layer in view.layers if layer.index in read})


def _on_target(view: MergedView, lock: Lock, want: Expected,
               files: list[tuple[str, CudaCode]], owned: dict[str, str],
               image_config: dict[str, Any]) -> tuple[TargetReport | None, list[Difference]]:
    """``--require-target``: the target section and its differences; every library with no
    code the device runs fails unless a part declares its kernels unused there."""
    from frank.audit.target import DEFAULT_PATH, TargetAudit, runs
    from frank.model.archs import parse_arch

    try:
        device = parse_arch(want.target)
    except ValueError:
        return None, [Difference(part="-", path="[target] arch", check="target is no GPU",
                                 lock="an sm_ arch for --require-target",
                                 image=want.target or "none")]
    env = {}
    for item in (image_config.get("config") or {}).get("Env") or []:
        key, _, value = str(item).partition("=")
        env[key] = value
    versions = {name: d.version for name, d in want.dists.items()}
    report, diffs, unused = TargetAudit(view, lock, want.site, versions, device, files, owned,
                                        env.get("PATH", DEFAULT_PATH)).run()
    dead: dict[str, list[tuple[str, CudaCode]]] = defaultdict(list)
    for path, code in sorted(files):
        if runs(code, device) is None and "/" + path not in unused:
            dead[owned.get(path, "unowned")].append(("/" + path, code))
    for owner, items in sorted(dead.items()):
        paths = [p for p, _ in items]
        archs_s = sorted({a for _, c in items for a in c.sass})
        archs_p = sorted({a for _, c in items for a in c.ptx})
        diffs.insert(0, Difference(
            part=owner, path=paths[0], check="no code runs on the target",
            lock=f"SASS or PTX for {want.target}, or its kernels declared unused there",
            image=f"{len(paths)} files with neither (SASS {' '.join(archs_s) or '-'}, PTX "
                  f"{' '.join(archs_p) or '-'})"))
    return report, diffs


def stack_lock(layout: Path, root: Path) -> Lock:
    """The repo's lock of the stack the image names (``dev.frank.stack``): what an image given
    as a layout is held to. The lock the image carries is never an expectation: a forged one
    would vouch for itself (issue 53)."""
    from frank.resolve.lock import read_lock

    _, _, manifest = resolve_manifest(layout)
    name = str((manifest.get("annotations") or {}).get("dev.frank.stack") or "")
    if not name:  # an engine-built image (buildah) keeps it as a config label only; it only
        # chooses which of the repo's locks the image is held to
        cdig = str((manifest.get("config") or {}).get("digest", ""))
        try:
            labels = (json.loads(read_layout_blob(layout, cdig, "config")).get("config")
                      or {}).get("Labels") or {}
        except (ValueError, AttributeError):
            labels = {}
        name = str(labels.get("dev.frank.stack") or "") if isinstance(labels, dict) else ""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise FrankError("the image names no stack (annotation dev.frank.stack): give the "
                         "stack instead of the layout", file=layout)
    path = root / "stacks" / f"{name}.lock"
    if not path.is_file():
        raise FrankError(f"the image is of stack {name}, which has no lock in this repo "
                         f"({path}): audit it where it was composed", file=layout)
    return read_lock(path)


def ensure_audited(layout: Path, lock: Lock, root: Path, *, what: str,
                   release: bool = False) -> AuditReport:
    """The image audited now against ``lock``, the stack's lock in the repo (issue 53): never
    an ``audit.json``, which anyone who can write out/ can forge, nor the lock the image
    carries. ``release``: every layer read in full, no kept reading, kept base or stat
    ledger used (docs/trust.md: an untrusted writer of the cache can forge all three). The
    new verdict is recorded when the layout is a compose output. A failed audit refuses
    ``what`` with its first lines."""
    report = audit_layout(layout, lock, root,
                          store=BlobStore(full_verify=True) if release else None)
    if (Path(layout).parent / "plan.json").is_file():
        save_record(report, Path(layout).parent)
    if not report.ok:
        lines = report.lines()
        more = f" (and {len(lines) - 3} more; `frank audit {layout}`)" if len(lines) > 3 else ""
        raise AuditFailed(f"refusing to {what}: the image's audit failed: "
                          f"{'; '.join(lines[:3])}{more}", file=layout)
    return report
