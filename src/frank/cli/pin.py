"""`frank pin PART@VERSION`: resolve a tag, release or branch into a content pin, in place.

The manifest is edited with tomlkit (comments and order kept) and validated before it is
renamed into place. Sources: git ls-remote (engine commit, patch source commit), the hub
(weights and hub data revisions), a package index (wheel URL and sha256), a registry
(``--image NAME``: the digest of ``images/NAME.toml``'s ref). ``--output`` pins what an
``aot`` or ``extension`` part's build made on this machine (its kept output in the store,
hashed in full) as ``output_sha256``: the lock then carries it, and release mode takes a
kept output equal to it instead of building again (docs/trust.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import tomlkit

from frank.cli.output import emit_json, json_option
from frank.errors import FrankError
from frank.fsutil import write_atomic
from frank.resolve.project import repo_root_for

PYPI = "https://pypi.org/simple"


def _str(doc: Any, *keys: str) -> str | None:
    node = doc
    for key in keys:
        if key not in node:
            return None
        node = node[key]
    return str(node)


def _pin_part(doc: Any, ref: str | None, index: str, wheel_tag: str | None,
              release: str | None) -> list[tuple[str, str | None, str]]:
    """Resolve the part's pins in ``doc``; returns (field, old, new) for each change."""
    from frank.resolve.pinning import git, hub
    from frank.resolve.pinning import index as idx

    kind = _str(doc, "kind")
    changes: list[tuple[str, str | None, str]] = []

    def set_(path: tuple[str, ...], value: str) -> None:
        node = doc
        for key in path[:-1]:
            if key not in node:
                node[key] = tomlkit.table()
            node = node[key]
        old = str(node[path[-1]]) if path[-1] in node else None
        if old != value:
            node[path[-1]] = value
            changes.append((".".join(path), old, value))

    if kind == "weights":
        target = ref or _str(doc, "revision") or "main"
        set_(("revision",), hub.resolve_revision(str(doc["repo_id"]), target))
    elif kind == "data" and _str(doc, "source", "hub", "repo_id"):
        target = ref or _str(doc, "source", "hub", "revision") or "main"
        set_(("source", "hub", "revision"),
             hub.resolve_revision(str(doc["source"]["hub"]["repo_id"]), target))
    elif kind == "engine":
        rel = release or _str(doc, "release")
        engine_ref = ref or _str(doc, "commit") or (f"v{rel}" if rel else None)
        if engine_ref is None:
            raise FrankError("give --ref (a tag or branch) to pin the commit")
        set_(("commit",), git.resolve_commit(str(doc["repo"]), engine_ref))
        if release:
            url, sha = idx.resolve_wheel(index, "vllm", release, wheel_tag)
            set_(("release",), release)
            set_(("wheel", "url"), url)
            set_(("wheel", "sha256"), sha)
    elif kind == "patch":
        patch_ref = ref or _str(doc, "source_commit")
        if patch_ref is None:
            raise FrankError("give --ref (a tag or branch) to pin source_commit")
        set_(("source_commit",), git.resolve_commit(str(doc["source_repo"]), patch_ref))
    elif kind == "package":
        version = ref or _str(doc, "version")
        assert version is not None
        url, sha = idx.resolve_wheel(index, str(doc["distribution"]), version, wheel_tag)
        set_(("wheel", "url"), url)
        set_(("wheel", "sha256"), sha)
    else:
        raise FrankError(f"a {kind} part has no external reference to pin")
    return changes


def _pin_output(doc: Any, path: Path, root: Path) -> list[tuple[str, str | None, str]]:
    """``output_sha256`` set to the digest of the part's kept output in this store (a
    compose or build on this machine made it), hashed in full."""
    from frank.assemble.outputs import kept_output, output_sha256
    from frank.model.kinds import PART_ADAPTER
    from frank.model.kinds.aot import Aot
    from frank.model.kinds.extension import Extension
    from frank.store.blobs import BlobStore
    from frank.store.ledger import hash_file

    kind = _str(doc, "kind")
    if kind not in ("aot", "extension"):
        raise FrankError(f"a {kind} part has no built output to pin (only aot and extension)",
                         file=path, field="--output")
    part = PART_ADAPTER.validate_python(doc.unwrap())
    assert isinstance(part, (Aot, Extension))
    store = BlobStore()
    files = kept_output(part, root, path, store.root)
    digest = output_sha256(part, files, hash_file) \
        if all(p.is_file() for p in files.values()) else None
    if digest is None:
        raise FrankError(f"no kept output of {part.name} in {store.root}: compose a stack "
                         "with it first (FRANK_CACHE names the store)", file=path,
                         field="--output")
    old = _str(doc, "output_sha256")
    if old == digest:
        return []
    value = tomlkit.string(digest)
    value.comment("frank pin --output: what the build made")
    value.trivia.comment_ws = "  "
    doc["output_sha256"] = value
    return [("output_sha256", old, digest)]


def _validate(text: str, path: Path) -> None:
    """The edited manifest must still be a valid part before it replaces the old one."""
    import tomllib

    from pydantic import ValidationError

    from frank.model.kinds import PART_ADAPTER
    from frank.model.tomlio import validation_to_error

    raw = tomllib.loads(text)
    try:
        PART_ADAPTER.validate_python(raw)
    except ValidationError as exc:
        raise validation_to_error(exc, path, tag=str(raw.get("kind"))) from None


@click.command()
@click.argument("part", required=False)
@click.option("--ref", default=None, help="Tag, branch or release to resolve.")
@click.option("--release", default=None, help="Engine: also pin this release's wheel.")
@click.option("--index", default=PYPI, show_default=True, help="Package index (PEP 503/691).")
@click.option("--wheel-tag", default=None, help="Choose among several wheels by a substring.")
@click.option("--image", default=None, help="Pin images/IMAGE.toml's ref by digest.")
@click.option("--output", "output", is_flag=True,
              help="aot, extension: pin output_sha256 to what this machine's build made "
                   "(the kept output in FRANK_CACHE).")
@json_option
def pin(part: str | None, ref: str | None, release: str | None, index: str,
        wheel_tag: str | None, image: str | None, output: bool, as_json: bool) -> None:
    """Resolve PART@VERSION's tag/branch/release into a content pin in its manifest."""
    root = repo_root_for()
    if image is not None:
        path = root / "images" / f"{image}.toml"
        from frank.resolve.pinning.registry import resolve_digest

        doc = tomlkit.parse(path.read_text(encoding="utf-8")) if path.is_file() else None
        if doc is None:
            raise FrankError("no such base image definition", file=path)
        current = ref or _str(doc, "ref")
        if current is None:
            raise FrankError("give --ref HOST/REPO:TAG", file=path, field="ref")
        new = resolve_digest(current)
        changes = [] if current == new and _str(doc, "ref") == new else [("ref", _str(doc, "ref"),
                                                                          new)]
        doc["ref"] = new
        write_atomic(path, tomlkit.dumps(doc))
    else:
        if part is None:
            raise FrankError("name a part (PART@VERSION) or --image NAME")
        name, _, version = part.partition("@")
        folder = root / "parts" / name
        versions = sorted(p.stem for p in folder.glob("*.toml"))
        if not version:
            if len(versions) != 1:
                raise FrankError(f"say which version of {name}: {', '.join(versions) or 'none'}")
            version = versions[0]
        path = folder / f"{version}.toml"
        if not path.is_file():
            raise FrankError(f"no manifest parts/{name}/{version}.toml")
        doc = tomlkit.parse(path.read_text(encoding="utf-8"))
        changes = _pin_output(doc, path, root) if output else \
            _pin_part(doc, ref, index, wheel_tag, release)
        _validate(tomlkit.dumps(doc), path)
        write_atomic(path, tomlkit.dumps(doc))
    result = [{"field": f, "old": o, "new": n} for f, o, n in changes]
    if as_json:
        emit_json({"file": str(Path(path).relative_to(root)), "changes": result})
        return
    if not result:
        click.echo(f"{Path(path).relative_to(root)}: already pinned")
    for r in result:
        click.echo(f"{Path(path).relative_to(root)}: {r['field']}: {r['old']} -> {r['new']}")
