"""Write and read OCI image layouts without a daemon.

``build_image`` appends one deterministic layer per ``LayerInput`` to a base image pinned by
digest and writes config, manifest and index as canonical JSON (sorted keys, no spaces), so
the manifest digest is a pure function of the spec: same spec, same digest, any machine, any
day. All blobs pass through the content-addressed store, which verifies them on every read.
The output layout is assembled in a temp directory beside the target and renamed into
place, so a failed build leaves the previous output (or nothing), never half of one.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import json
import os
import platform
import shutil
import stat
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from frank.errors import NESTED_TOO_DEEP, FrankError
from frank.image.layer import build_layer
from frank.image.progress import status
from frank.image.spec import ImageSpec
from frank.store.blobs import BlobMovedAside, BlobStore, check_digest, sha256_bytes, sha256_file

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST)
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
# Docker media types name the same bytes; an OCI manifest must use the OCI names.
_DOCKER_TO_OCI = {
    "application/vnd.docker.image.rootfs.diff.tar.gzip":
        "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.docker.image.rootfs.diff.tar": "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.docker.container.image.v1+json": OCI_CONFIG,
}
CREATED_ANNOTATION = "org.opencontainers.image.created"
BASE_DIGEST_ANNOTATION = "org.opencontainers.image.base.digest"
REF_NAME_ANNOTATION = "org.opencontainers.image.ref.name"


def canonical_json(doc: Any) -> bytes:
    """Sorted keys, no whitespace, UTF-8: one byte string per document, hence one digest."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def epoch_to_rfc3339(epoch: int) -> str:
    """SOURCE_DATE_EPOCH as the RFC 3339 UTC time OCI ``created`` fields use."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _go_arch() -> str:
    m = platform.machine().lower()
    return {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(m, m)


# --------------------------------------------------------------------------------------------
# reading a layout


def _json_file(path: Path, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise FrankError(f"corrupt OCI layout: {what} is missing", file=path) from None
    except (ValueError, OSError) as exc:
        raise FrankError(f"corrupt OCI layout: {what} is not valid JSON ({exc})",
                         file=path) from None
    except RecursionError:
        raise FrankError(f"corrupt OCI layout: {what}: {NESTED_TOO_DEEP}", file=path) from None
    if not isinstance(doc, dict):
        raise FrankError(f"corrupt OCI layout: {what} is not a JSON object", file=path)
    return doc


def layout_blob_path(layout: Path, digest: str) -> Path:
    """Where a blob sits inside an OCI layout."""
    check_digest(digest, file=layout)
    return layout / "blobs" / "sha256" / digest.split(":", 1)[1]


def read_layout_blob(layout: Path, digest: str, what: str) -> bytes:
    """A small blob from a layout, verified against its digest."""
    path = layout_blob_path(layout, digest)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise FrankError(f"corrupt OCI layout: {what} blob {digest} is missing",
                         file=path) from None
    if sha256_bytes(data) != digest:
        raise FrankError(f"corrupt OCI layout: {what} blob does not match its digest {digest}",
                         file=path)
    return data


def _parse_json_blob(data: bytes, path: Path, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise FrankError(f"corrupt OCI layout: {what} is not valid JSON ({exc})",
                         file=path) from None
    if not isinstance(doc, dict):
        raise FrankError(f"corrupt OCI layout: {what} is not a JSON object", file=path)
    return doc


def _descriptor(doc: Any, path: Path, what: str) -> tuple[str, int, str]:
    if not isinstance(doc, dict):
        raise FrankError(f"corrupt OCI layout: {what} descriptor is not an object", file=path)
    try:
        digest, size, mt = doc["digest"], int(doc["size"]), str(doc.get("mediaType", ""))
    except (KeyError, TypeError, ValueError):
        raise FrankError(f"corrupt OCI layout: {what} descriptor lacks digest/size",
                         file=path) from None
    check_digest(digest, file=path, field=what)
    return digest, size, mt


def layout_manifests(layout: Path) -> list[dict[str, Any]]:
    """The descriptors in a layout's index.json (checking the layout marker first)."""
    layout = Path(layout)
    if not layout.is_dir():
        raise FrankError("not an OCI layout directory", file=layout)
    marker = _json_file(layout / "oci-layout", "oci-layout")
    if "imageLayoutVersion" not in marker:
        raise FrankError("corrupt OCI layout: oci-layout lacks imageLayoutVersion",
                         file=layout / "oci-layout")
    index = _json_file(layout / "index.json", "index.json")
    manifests = index.get("manifests")
    if not isinstance(manifests, list) or not manifests:
        raise FrankError("corrupt OCI layout: index.json lists no manifests",
                         file=layout / "index.json")
    return manifests


def resolve_manifest(layout: Path, digest: str | None = None,
                     ref_name: str | None = None) -> tuple[str, bytes, dict[str, Any]]:
    """(digest, raw bytes, parsed) of an image manifest in a layout, verified.

    ``digest`` selects it (an image index is followed to this machine's platform); without
    it the manifest tagged ``ref_name``, else the only/first one in index.json is used.
    """
    layout = Path(layout)
    descs = layout_manifests(layout)
    if digest is None:
        chosen = descs[0]
        if ref_name is not None:
            named = [d for d in descs if isinstance(d, dict)
                     and d.get("annotations", {}).get(REF_NAME_ANNOTATION) == ref_name]
            if not named:
                raise FrankError(f"no image named {ref_name!r} in the layout",
                                 file=layout / "index.json")
            chosen = named[0]
        digest, _, _ = _descriptor(chosen, layout / "index.json", "index.json manifests[0]")
    check_digest(digest, file=layout)
    raw = read_layout_blob(layout, digest, "manifest")
    doc = _parse_json_blob(raw, layout_blob_path(layout, digest), "manifest")
    mt = doc.get("mediaType", "")
    if mt in INDEX_TYPES or ("manifests" in doc and "layers" not in doc):
        arch = _go_arch()
        for d in doc.get("manifests", []):
            plat = d.get("platform", {}) if isinstance(d, dict) else {}
            if plat.get("os", "linux") == "linux" and plat.get("architecture", arch) == arch:
                sub, _, _ = _descriptor(d, layout_blob_path(layout, digest), "index entry")
                return resolve_manifest(layout, sub)
        raise FrankError(f"image index {digest} has no linux/{arch} manifest", file=layout)
    if "layers" not in doc or "config" not in doc:
        raise FrankError(f"corrupt OCI layout: manifest {digest} lacks config/layers",
                         file=layout_blob_path(layout, digest))
    return digest, raw, doc


# --------------------------------------------------------------------------------------------
# building


def _import_blob(store: BlobStore, layout: Path, digest: str, size: int, what: str) -> None:
    """Make sure the store holds ``digest``, copying (and verifying) it from ``layout``."""
    if store.has(digest):
        try:
            store.verified_path(digest)
            return
        except FrankError:
            pass  # bad cached copy moved aside; re-import from the layout
    src = layout_blob_path(layout, digest)
    if not src.is_file():
        raise FrankError(f"corrupt OCI layout: {what} blob {digest} is missing", file=src)
    if src.stat().st_size != size:
        raise FrankError(f"corrupt OCI layout: {what} blob {digest} has size "
                         f"{src.stat().st_size}, the manifest says {size}", file=src)
    try:
        store.put_file(src, expected=digest)
    except FrankError:
        raise FrankError(f"corrupt OCI layout: {what} blob does not match its digest {digest}",
                         file=src) from None


def _merge_env(base: list[str], extra: dict[str, str]) -> list[str]:
    """Base env with ``extra`` overriding by name; base order kept, new names sorted."""
    out: dict[str, str] = {}
    for item in base:
        k, _, v = item.partition("=")
        out[k] = v
    for k in sorted(extra):
        out[k] = extra[k]
    return [f"{k}={v}" for k, v in out.items()]


def _base_from_store_or_layout(spec: ImageSpec, store: BlobStore) -> tuple[bytes, dict[str, Any]]:
    """The pinned base manifest: from the store when already imported, else the layout."""
    check_digest(spec.base_digest, field="base_digest")
    if store.has(spec.base_digest):
        with contextlib.suppress(FrankError):
            raw = store.read_bytes(spec.base_digest)
            doc = json.loads(raw)
            if isinstance(doc, dict) and "layers" in doc:
                return raw, doc
    _, raw, doc = resolve_manifest(spec.base_layout, spec.base_digest)
    store.put_bytes(raw)
    return raw, doc


def build_image(spec: ImageSpec, store: BlobStore, out_layout: Path, *,
                ref_name: str | None = None, quiet: bool = False,
                fresh: frozenset[str] | set[str] = frozenset()) -> str:
    """Build ``spec`` into an OCI layout at ``out_layout``; return the manifest digest.

    Layers whose key the store's index knows are reused without re-tarring; everything
    else is tarred once. ``ref_name`` tags the manifest inside index.json. ``fresh`` names
    blobs this process wrote (and hashed as it wrote them): see ``write_layout``.
    """
    from rich.console import Console

    console = Console(stderr=True, quiet=quiet)
    epoch = int(spec.source_date_epoch)
    created = epoch_to_rfc3339(epoch)
    base_layout = Path(spec.base_layout)

    _, base_manifest = _base_from_store_or_layout(spec, store)
    mpath = base_layout / "blobs" / "sha256"
    cfg_digest, cfg_size, _ = _descriptor(base_manifest.get("config"), mpath, "config")
    _import_blob(store, base_layout, cfg_digest, cfg_size, "config")
    base_config = json.loads(store.read_bytes(cfg_digest))
    base_layers = base_manifest.get("layers", [])
    if not isinstance(base_layers, list):
        raise FrankError("corrupt OCI layout: manifest layers is not a list", file=mpath)
    layer_descs: list[dict[str, Any]] = []
    for i, d in enumerate(base_layers):
        digest, size, mt = _descriptor(d, mpath, f"layers[{i}]")
        with status(console, f"importing base layer {digest}"):
            _import_blob(store, base_layout, digest, size, f"base layer {i}")
        layer_descs.append({"mediaType": _DOCKER_TO_OCI.get(mt, mt), "digest": digest,
                            "size": size})

    diff_ids = list(base_config.get("rootfs", {}).get("diff_ids", []))
    if len(diff_ids) != len(layer_descs):
        raise FrankError("corrupt OCI layout: base config diff_ids do not match its layers",
                         file=mpath / cfg_digest.split(":")[1])
    history = list(base_config.get("history") or [])
    nonempty = sum(1 for h in history if not (isinstance(h, dict) and h.get("empty_layer")))
    if nonempty != len(diff_ids):  # keep history aligned with layers (inspect relies on it)
        history += [{"created_by": "base layer"}] * max(0, len(diff_ids) - nonempty)
    for layer in spec.layers:
        with status(console, f"layer {layer.name}"):
            rec, _ = build_layer(store, layer, epoch)
        layer_descs.append({"mediaType": rec.media_type, "digest": rec.digest, "size": rec.size})
        diff_ids.append(rec.diff_id)
        history.append({"created": created, "created_by": f"frank: {layer.name}",
                        "comment": layer.key})

    config = copy.deepcopy(base_config)
    config["created"] = created
    config["history"] = history
    config["rootfs"] = {"type": "layers", "diff_ids": diff_ids}
    config.setdefault("architecture", _go_arch())
    config.setdefault("os", "linux")
    for stale in ("container", "container_config", "docker_version", "author"):
        config.pop(stale, None)
    cc = dict(config.get("config") or {})
    cc["Env"] = _merge_env(list(cc.get("Env") or []), spec.env)
    if spec.entrypoint:
        cc["Entrypoint"] = list(spec.entrypoint)
        cc["Cmd"] = list(spec.cmd)  # a new entrypoint resets the base's cmd, as Docker does
    elif spec.cmd:
        cc["Cmd"] = list(spec.cmd)
    labels = dict(cc.get("Labels") or {})
    labels.update(spec.labels)
    cc["Labels"] = labels
    config["config"] = cc
    config_raw = canonical_json(config)
    config_digest = store.put_bytes(config_raw)

    annotations = dict(spec.annotations)
    annotations[CREATED_ANNOTATION] = created
    annotations[BASE_DIGEST_ANNOTATION] = spec.base_digest
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": config_digest, "size": len(config_raw)},
        "layers": layer_descs,
        "annotations": annotations,
    }
    manifest_raw = canonical_json(manifest)
    manifest_digest = store.put_bytes(manifest_raw)

    desc: dict[str, Any] = {"mediaType": OCI_MANIFEST, "digest": manifest_digest,
                            "size": len(manifest_raw)}
    if ref_name:
        desc["annotations"] = {REF_NAME_ANNOTATION: ref_name}
    from frank.image.outdir import final_path

    kept, kept_blobs = kept_referrers(store, final_path(Path(out_layout)), manifest_digest)
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [desc, *kept]}
    blobs = [config_digest, manifest_digest, *(d["digest"] for d in layer_descs), *kept_blobs]
    write_layout(store, Path(out_layout), canonical_json(index), blobs, epoch=epoch,
                 fresh=fresh)
    return manifest_digest


def kept_referrers(store: BlobStore, layout: Path, subject: str
                   ) -> tuple[list[dict[str, Any]], list[str]]:
    """The referrers (artifacts whose ``subject`` is ``subject``: the attestations ``frank
    attest`` wrote) listed in the layout a build replaces, with their blobs put in the store:
    an image built again to the same digest keeps them, a changed image drops them."""
    try:
        descs = layout_manifests(layout)
    except FrankError:
        return [], []
    kept: list[dict[str, Any]] = []
    blobs: list[str] = []
    for d in descs:
        if not isinstance(d, dict) or "artifactType" not in d:
            continue
        try:
            digest, _, _ = _descriptor(d, layout / "index.json", "index.json referrer")
            raw = read_layout_blob(layout, digest, "referrer")
            doc = _parse_json_blob(raw, layout_blob_path(layout, digest), "referrer")
            if (doc.get("subject") or {}).get("digest") != subject:
                continue
            parts = [raw] + [read_layout_blob(layout, _descriptor(x, layout, "referrer blob")[0],
                                              "referrer blob")
                             for x in [doc.get("config"), *(doc.get("layers") or [])]]
        except FrankError:
            continue  # a damaged referrer is not carried over
        for data in parts:
            blobs.append(store.put_bytes(data))
        kept.append(d)
    return kept, blobs


def write_layout(store: BlobStore, out: Path, index_raw: bytes, blobs: list[str], *,
                 epoch: int = 0, fresh: frozenset[str] | set[str] = frozenset()) -> None:
    """Assemble a layout in a temp dir next to ``out`` and swap it into place.

    File modes are fixed (0444 blobs, 0644 index and oci-layout, 0755 folders) and mtimes
    set to ``epoch`` so two layouts of the same image are identical to the metadata,
    whatever the umask or the clock (diffoscope checks both). A blob goes out as a hard link
    to the store's file where the filesystem allows (a copy of a 10 GB image was a third
    write of every byte). Every blob that goes out holds the bytes of its name: the stat
    ledger vouches for it (``frank.store.ledger``: frank hashed that very file and nothing
    has changed it since; its ctime would have moved), or it is hashed, except the ``fresh``
    ones: blobs this build has just written and hashed on their way in. ``FRANK_VERIFY=full``
    trusts no ledger entry (a disk that flips bits in place moves no ctime). If the output
    already holds exactly this layout with the layout's modes and every blob holds its
    name's bytes, nothing is written: a no-op rebuild takes one stat per blob. The ledger
    is told of the new output's blobs once frank's own links and removals are done
    (``Ledger.carry``). ``out`` may be inside a compose's stage (``frank.image.outdir``):
    the output it will become is the one checked and recorded, and a current one is left to
    be carried over (nothing is written to the stage then).
    """
    from frank.image.outdir import final_path

    out = out.absolute()
    final = final_path(out)
    wanted = list(dict.fromkeys(blobs))
    record = _output_record_path(store, final)
    with record.with_suffix(".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two builds into one output take turns
        # Current: the same index, exactly these blobs with the layout's mode and mtime, each
        # holding its name's bytes by the stat ledger or a hash (not the output record's
        # stamps: a record in the cache is no proof). A fresh blob is a new inode: the
        # output in place cannot hold it, only a copy.
        if fresh.intersection(wanted) or not (
                _output_is_current(final, index_raw, wanted, record, stamps=False)
                and _meta_fixed(final, wanted, epoch) and _blobs_match(store, final, wanted)):
            # every blob on its way out (linked or copied) is vouched for by the ledger or
            # hashed, unless this build wrote it
            sources = {d: store.path(d) if store.path(d).is_file() else store.verified_path(d)
                       for d in wanted}
            _write_layout_locked(store, out, index_raw, sources, record, epoch, final,
                                 fresh=fresh)
        elif final != out:
            shutil.rmtree(out, ignore_errors=True)  # the output in place is carried over


LAYOUT_BLOB_MODE = 0o444  # a layout's blob is a link to the store's, read-only as it is


def _link_blob(src: Path, dest: Path, epoch: int) -> bool:
    """Hard-link a store blob into a layout; False where it cannot be (another filesystem,
    or the blob already serves a layout of another epoch: changing its mtime would make that
    layout look modified; a 0644 blob is one an older frank fixed for a layout)."""
    try:
        st = src.stat()
    except OSError:
        return False
    serves = st.st_nlink > 1 or stat.S_IMODE(st.st_mode) == 0o644
    if serves and st.st_mtime_ns != epoch * 1_000_000_000:
        return False
    try:
        os.link(src, dest)
    except OSError:
        return False
    return True


def _moved_aside(store: BlobStore, digest: str, src: Path, actual: str) -> BlobMovedAside:
    store._quarantine(src)
    return BlobMovedAside(f"cached blob does not match its digest {digest} (content is "
                          f"{actual}); it was moved aside, rebuild to re-create it", file=src)


def _fix_meta(path: Path, mode: int, epoch: int) -> None:
    """Set mode and mtime, touching nothing (not even the ctime) where they are right."""
    st = path.stat()
    if stat.S_IMODE(st.st_mode) != mode:
        os.chmod(path, mode)
    if st.st_mtime_ns != epoch * 1_000_000_000:  # atime is no one's stamp
        os.utime(path, (epoch, epoch))


def _copy_verified(store: BlobStore, digest: str, src: Path, dest: Path) -> None:
    """Copy a blob out of the store and hash the copy: a mismatch is moved aside, an error."""
    shutil.copyfile(src, dest)
    actual = sha256_file(dest)
    if actual != digest:
        raise _moved_aside(store, digest, src, actual)


def _meta_fixed(layout: Path, blobs: list[str], epoch: int) -> bool:
    """Whether every file of the layout has the mode and mtime frank gives it."""
    try:
        return all(stat.S_IMODE(st.st_mode) == (LAYOUT_BLOB_MODE if rel.startswith("blobs/")
                                                 else 0o644)
                   and st.st_mtime_ns == epoch * 1_000_000_000
                   for rel, st in ((rel, (layout / rel).stat())
                                   for rel in _layout_files(layout, blobs)))
    except OSError:
        return False


def _blobs_match(store: BlobStore, layout: Path, blobs: list[str]) -> bool:
    """Whether every blob of the output in place holds the bytes of its name: by the stat
    ledger (``frank.store.ledger``) where frank hashed the very file before and nothing has
    changed it since, else hashed (``_hash_all``: one blob per core). The output record in
    the cache is not what decides: a record can be edited as easily as a blob."""
    paths = [(d, layout_blob_path(layout, d)) for d in blobs]
    return not _hash_all(store, paths)


def _hash_all(store: BlobStore, paths: list[tuple[str, Path]]) -> set[Path]:
    """The paths whose content does not hash to their digest (or cannot be read): the
    ledger's answer where it has one, the rest hashed one per core at a time, the largest
    first (hashlib lets go of the GIL)."""
    from concurrent.futures import ThreadPoolExecutor

    ledger = store.ledger

    def bad(item: tuple[str, Path]) -> bool:
        try:
            return "sha256:" + ledger.sha256(item[1]) != item[0]
        except OSError:
            return True

    todo = [item for item in paths if ledger.known(item[1]) != item[0].split(":", 1)[1]]
    big_first = sorted(todo, key=lambda item: -_size(item[1]))
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return {p for (_, p), b in zip(big_first, pool.map(bad, big_first), strict=True) if b}


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _reusable(final: Path, wanted: list[str]) -> dict[str, Path]:
    """Blobs of the output in place whose ledger entry still holds (frank hashed that very
    file, and nothing has changed it since): a new output links them instead of copying and
    hashing them again, so a one-part change of a 10 GB image writes and reads only the
    layers that changed."""
    found = {}
    for digest in wanted:
        path = layout_blob_path(final, digest)
        if path.is_file():
            found[digest] = path
    return found


def _write_layout_locked(store: BlobStore, out: Path, index_raw: bytes,
                         sources: dict[str, Path], record: Path, epoch: int,
                         final: Path | None = None,
                         fresh: frozenset[str] | set[str] = frozenset()) -> None:
    wanted = list(sources)
    final = final or out
    reuse = _reusable(final, wanted)
    ledger = store.ledger
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        bdir = tmp / "blobs" / "sha256"
        bdir.mkdir(parents=True)
        # links first (a blob this build wrote from the store, another from the output in
        # place or the store where the ledger vouches for that file, else from the store),
        # then every link nobody vouched for hashed, one per core; a copy only where a link
        # cannot be made. The ledger is asked before the link: a link moves the ctime.
        vouched: set[str] = set(fresh)
        unvouched: list[tuple[str, Path]] = []
        for digest, src in sources.items():
            dest = bdir / digest.split(":", 1)[1]
            hexd = digest.split(":", 1)[1]
            if digest not in fresh and digest in reuse and ledger.known(reuse[digest]) == hexd:
                try:
                    os.link(reuse[digest], dest)
                    vouched.add(digest)
                    continue
                except OSError:
                    pass
            known = digest in fresh or ledger.known(src) == hexd
            if _link_blob(src, dest, epoch):
                if known:
                    vouched.add(digest)
                else:
                    unvouched.append((digest, dest))
            else:
                _copy_verified(store, digest, src, dest)
                vouched.add(digest)
        bad = _hash_all(store, unvouched)
        for digest, dest in unvouched:
            if dest in bad:
                actual = sha256_file(dest)
                dest.unlink()
                raise _moved_aside(store, digest, sources[digest], actual)
            vouched.add(digest)
        for digest in sources:
            _fix_meta(bdir / digest.split(":", 1)[1], LAYOUT_BLOB_MODE, epoch)
        (tmp / "oci-layout").write_bytes(canonical_json({"imageLayoutVersion": "1.0.0"}))
        (tmp / "index.json").write_bytes(index_raw)
        for p in (tmp / "oci-layout", tmp / "index.json"):
            os.chmod(p, 0o644)
            os.utime(p, (epoch, epoch))
        for p in (bdir, tmp / "blobs", tmp):
            os.chmod(p, 0o755)
            os.utime(p, (epoch, epoch))
        with contextlib.suppress(FileNotFoundError):
            record.unlink()
        _swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # every blob of the new output was hashed (now or before, by the ledger) or written by
    # this build: the ledger is told so under the names the output and the store give it,
    # once frank's own links and removals have settled (see Ledger.carry)
    for digest in sources:
        made = out / "blobs" / "sha256" / digest.split(":", 1)[1]
        for name in {final / "blobs" / "sha256" / made.name, store.path(digest)}:
            ledger.carry(name, made, digest.split(":", 1)[1])
    doc = {"index": sha256_bytes(index_raw), "files": _stamps(out, wanted)}
    store._atomic_write(record, canonical_json(doc))


def _layout_files(layout: Path, blobs: list[str]) -> list[str]:
    return ["oci-layout", "index.json", *(f"blobs/sha256/{d.split(':', 1)[1]}" for d in blobs)]


def _stamps(layout: Path, blobs: list[str]) -> dict[str, list[int]]:
    out = {}
    for rel in _layout_files(layout, blobs):
        st = (layout / rel).stat()
        out[rel] = [st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns]
    return out


def _output_record_path(store: BlobStore, out: Path) -> Path:
    d = store.root / "outputs"
    d.mkdir(exist_ok=True)
    return d / sha256_bytes(str(out).encode()).split(":", 1)[1]


def _output_is_current(out: Path, index_raw: bytes, blobs: list[str], record: Path, *,
                       stamps: bool = True) -> bool:
    """Whether ``out`` is the layout frank last wrote there for this index, unmodified (by
    its files' stat stamps too, unless ``stamps`` is False: the caller hashes them)."""
    try:
        doc = json.loads(record.read_bytes())
        if doc.get("index") != sha256_bytes(index_raw):
            return False
        if (out / "index.json").read_bytes() != index_raw:
            return False
        if stamps and doc.get("files") != _stamps(out, blobs):
            return False
        present = {p.name for p in (out / "blobs" / "sha256").iterdir()}
        return present == {d.split(":", 1)[1] for d in blobs}
    except (OSError, ValueError, AttributeError, RecursionError):
        return False


def _swap_into_place(new: Path, out: Path) -> None:
    """Replace ``out`` with ``new``: rename the old aside, rename the new in, drop the old."""
    if out.exists() or out.is_symlink():
        if not (out / "oci-layout").exists() and any(out.iterdir()):
            raise FrankError("output directory exists and is not an OCI layout; "
                             "refusing to replace it", file=out)
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        os.rmdir(old)
        os.replace(out, old)
        os.replace(new, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(new, out)


def image_view(layout: Path, digest: str, view: Path) -> Path:
    """A layout at ``view`` listing only manifest ``digest`` of ``layout``, its blobs linked:
    the image by digest for a reader of ``oci:PATH`` (skopeo, buildah, podman) that wants one
    image in index.json, where ``frank attest`` lists attestations beside it. Made whole
    (temp + rename); one already there is kept."""
    descs = [d for d in layout_manifests(layout) if d.get("digest") == digest][:1]
    index = canonical_json({"schemaVersion": 2, "manifests": descs,
                            "mediaType": "application/vnd.oci.image.index.v1+json"})
    blobs = Path(layout).absolute() / "blobs"
    with contextlib.suppress(OSError):
        if (view / "index.json").read_bytes() == index and \
                os.readlink(view / "blobs") == str(blobs):
            return view
    view.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".view-", dir=view.parent))
    (tmp / "oci-layout").write_bytes(canonical_json({"imageLayoutVersion": "1.0.0"}))
    (tmp / "index.json").write_bytes(index)
    (tmp / "blobs").symlink_to(blobs)
    if view.is_symlink() or view.is_file():
        view.unlink()
    elif view.exists():
        shutil.rmtree(view, ignore_errors=True)
    try:
        os.replace(tmp, view)
    except OSError:  # another run made it meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    return view


# --------------------------------------------------------------------------------------------
# inspecting


class LayerInfo(BaseModel):
    """One layer as ``inspect`` shows it."""

    model_config = ConfigDict(extra="forbid")

    digest: str
    size: int
    media_type: str
    created_by: str = ""
    comment: str = ""


class ImageInfo(BaseModel):
    """What an image carries: enough for ``frank inspect`` to show stack, parts and lock."""

    model_config = ConfigDict(extra="forbid")

    source: str
    digest: str
    config_digest: str
    created: str | None = None
    architecture: str | None = None
    os: str | None = None
    env: list[str] = []
    entrypoint: list[str] = []
    cmd: list[str] = []
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    layers: list[LayerInfo] = []


def image_info(source: str, digest: str, manifest: dict[str, Any],
               config: dict[str, Any]) -> ImageInfo:
    """Combine a manifest and its config into an ``ImageInfo`` (history matched to layers)."""
    hist = [h for h in config.get("history", []) if not h.get("empty_layer")]
    layers = []
    for i, d in enumerate(manifest.get("layers", [])):
        h = hist[i] if i < len(hist) else {}
        layers.append(LayerInfo(digest=d["digest"], size=int(d["size"]),
                                media_type=d.get("mediaType", ""),
                                created_by=h.get("created_by", ""), comment=h.get("comment", "")))
    cc = config.get("config") or {}
    return ImageInfo(
        source=source, digest=digest, config_digest=manifest["config"]["digest"],
        created=config.get("created"), architecture=config.get("architecture"),
        os=config.get("os"), env=cc.get("Env") or [], entrypoint=cc.get("Entrypoint") or [],
        cmd=cc.get("Cmd") or [], labels=cc.get("Labels") or {},
        annotations=manifest.get("annotations") or {}, layers=layers)


def read_layout(layout: Path, *, verify_layers: bool = True) -> ImageInfo:
    """Read (and verify) the image in an OCI layout; corrupt layouts are one-line errors."""
    layout = Path(layout)
    digest, _, manifest = resolve_manifest(layout)
    cdig, _, _ = _descriptor(manifest["config"], layout, "config")
    config = _parse_json_blob(read_layout_blob(layout, cdig, "config"),
                              layout_blob_path(layout, cdig), "config")
    for i, d in enumerate(manifest["layers"]):
        ldig, size, _ = _descriptor(d, layout, f"layers[{i}]")
        p = layout_blob_path(layout, ldig)
        if not p.is_file():
            raise FrankError(f"corrupt OCI layout: layer blob {ldig} is missing", file=p)
        if p.stat().st_size != size:
            raise FrankError(f"corrupt OCI layout: layer blob {ldig} has the wrong size", file=p)
        if verify_layers and sha256_file(p) != ldig:
            raise FrankError(f"corrupt OCI layout: layer blob does not match its digest {ldig}",
                             file=p)
    return image_info(str(layout), digest, manifest, config)


_GZIP_TYPES = ("application/vnd.oci.image.layer.v1.tar+gzip",
               "application/vnd.docker.image.rootfs.diff.tar.gzip")
_TAR_TYPES = ("application/vnd.oci.image.layer.v1.tar",
              "application/vnd.docker.image.rootfs.diff.tar")


def normalize_layout(src: Path, store: BlobStore, out_layout: Path, *,
                     epoch: int = 0) -> str:
    """Re-write an engine's exported layout with uncompressed layers and canonical JSON.

    Engines decide compression on their own (containers/image reuses a gzip copy it saw in an
    earlier push, whatever ``--disable-compression`` says), so their output digest depends on
    the machine's history. Decompressing every layer (checked against the config's diff_ids)
    and re-serializing the manifest makes it a function of the config alone.
    """
    import gzip

    src = Path(src)
    _, _, manifest = resolve_manifest(src)
    cdig, csize, _ = _descriptor(manifest.get("config"), src, "config")
    _import_blob(store, src, cdig, csize, "config")
    config = json.loads(store.read_bytes(cdig))
    diff_ids = config.get("rootfs", {}).get("diff_ids", [])
    layers = manifest.get("layers", [])
    if len(diff_ids) != len(layers):
        raise FrankError("exported image's config diff_ids do not match its layers", file=src)
    descs: list[dict[str, Any]] = []
    for i, d in enumerate(layers):
        digest, size, mt = _descriptor(d, src, f"layers[{i}]")
        if mt in _TAR_TYPES:
            _import_blob(store, src, digest, size, f"layer {i}")
            if digest != diff_ids[i]:
                raise FrankError(f"layer {i} digest differs from its diff_id", file=src)
            descs.append({"mediaType": _TAR_TYPES[0], "digest": digest, "size": size})
            continue
        if mt not in _GZIP_TYPES:
            raise FrankError(f"layer {i} has unsupported media type {mt!r}", file=src)
        if not store.has(diff_ids[i]):
            path = layout_blob_path(src, digest)
            if not path.is_file() or sha256_file(path) != digest:
                raise FrankError(f"corrupt OCI layout: layer blob {digest} is missing or does "
                                 "not match its digest", file=path)
            with store.writer() as w, gzip.open(path, "rb") as f:
                while chunk := f.read(1 << 20):
                    w.write(chunk)
            if w.digest != diff_ids[i]:
                raise FrankError(f"layer {i} decompresses to {w.digest}, the config says "
                                 f"{diff_ids[i]}", file=path)
        unpacked = store.verified_path(diff_ids[i])
        descs.append({"mediaType": _TAR_TYPES[0], "digest": diff_ids[i],
                      "size": unpacked.stat().st_size})
    return store_layout(store, out_layout, (cdig, csize), descs, epoch=epoch,
                        annotations=manifest.get("annotations"))


def store_layout(store: BlobStore, out_layout: Path, config: tuple[str, int],
                 layers: list[dict[str, Any]], *, epoch: int,
                 annotations: dict[str, str] | None = None) -> str:
    """The canonical manifest of a config and uncompressed layers the store holds, written
    as the one image of ``out_layout``; its digest."""
    new: dict[str, Any] = {
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": config[0], "size": config[1]},
        "layers": layers}
    if annotations:
        new["annotations"] = annotations
    raw = canonical_json(new)
    digest = store.put_bytes(raw)
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX,
             "manifests": [{"mediaType": OCI_MANIFEST, "digest": digest, "size": len(raw)}]}
    write_layout(store, Path(out_layout), canonical_json(index),
                 [config[0], digest, *(x["digest"] for x in layers)], epoch=epoch)
    return digest
