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
from pathlib import Path
from typing import Any

from frank.audit.base import base_differences, derive_base
from frank.audit.checks import Checker, cuda_summary, declared_archs
from frank.audit.config import config_differences
from frank.audit.cuda import CudaCode
from frank.audit.expect import Expected, expected
from frank.audit.layers import Entry, MergedView, read_image, read_large_cuda
from frank.audit.paths import bytecode_differences, whiteout_differences
from frank.audit.report import AuditReport, Cost, Difference, TargetReport, save_record
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
    sound, kept = _kept(store, blobs, descs, mine)
    sound -= set() if keep_known else set(mine)
    view = read_image(blobs, workers, {**mine, **kept})
    if lock is None:
        lock = stack_lock(layout, root)
    plan = build_plan(lock, root)
    want = expected(plan, lock, root, store)
    # from the repo's pins, never the cached base
    base = derive_base(lock, root, store, have=[str(d.get("digest", "")) for d in descs])
    from frank.audit.config import engine_built

    diffs, base_layers = base_differences(view, manifest, base, engine_built(image_config))
    read_large_cuda(view)
    _keep(store, view, descs, sound - set(kept))
    found, owned, base_dists = Checker(view, want, base_layers, store=store).run()
    diffs += found
    # an image a container engine built from frank's Dockerfile: any of its layers may have
    # run python (a RUN, a pip uninstall), which writes the stdlib's bytecode
    ran = frozenset(range(base_layers, len(view.layers))) if engine_built(image_config) \
        else frozenset(base_layers + i for i, layer in enumerate(plan.layers)
                       if layer.impure or layer.run)
    diffs += bytecode_differences(view, want, base_layers, ran)
    diffs += whiteout_differences(view, plan, lock, want, base_layers)
    diffs += config_differences(plan, base.config, image_config)
    cuda, files = cuda_summary(view, owned, want.target, base_layers)
    diffs += declared_archs(want, files)
    target = None
    if require_target:
        target, found = _on_target(view, lock, want, files, owned, image_config)
        diffs += found
    total = sum(p.stat().st_size for p in blobs)
    nfiles = sum(1 for _, e in view.visible.values() if e.kind == "file")
    cost = Cost(seconds=round(time.perf_counter() - start, 3),
                cpu_seconds=round(time.process_time() - cpu, 3), layers=len(blobs),
                bytes=total, files=nfiles, read_in_build=len(mine), kept=len(kept))
    return AuditReport(layout=str(layout), digest=digest, stack=lock.stack,
                       lock_digest=lock.digest, target=want.target, ok=not diffs,
                       require_target=require_target, differences=diffs, notes=want.notes,
                       cuda=cuda, target_report=target, dists=len(want.dists),
                       base_dists=sorted(base_dists),
                       cost=cost)


def _kept(store: BlobStore, blobs: list[Path], descs: list[Any],
          tapped: Mapping[int, list[Entry]]) -> tuple[set[int], dict[int, list[Entry]]]:
    """The layers whose reading is of their digest's bytes (tapped by the build, or a blob
    the stat ledger vouches for), and of those the ones an earlier audit kept a reading of
    (``frank.audit.kept``), by index."""
    from frank.audit.kept import kept_readings, vouched

    want = {i: str(d.get("digest", "")) for i, d in enumerate(descs)
            if i not in tapped and vouched(store, blobs[i], str(d.get("digest", "")))}
    found = kept_readings(store, want.values())
    return set(want) | set(tapped), {i: found[d] for i, d in want.items() if d in found}


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
