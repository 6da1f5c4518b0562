"""Every component an image's lock pins, with its hash, source URL and the part it came from.

The inventory is a pure function of the image (its manifest digest and config history), its
lock (``/etc/frank/frank.lock`` in the image) and, where the repo is at hand, the two files
the lock pins by sha256 only: the stack's PEP 751 pylock (the Python closure) and the base's
``images/<name>.debs.lock`` (its Debian packages). Each is used only if its sha256 is the
locked one; otherwise the inventory says what it could not list (``Inventory.missing``), so
``verify`` run away from the repo still checks what the lock alone gives, and says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from frank.errors import FrankError
from frank.hashing import sha256_file
from frank.resolve.lock import Lock

HEX64 = re.compile(r"^[0-9a-f]{64}$")
HEX40 = re.compile(r"^[0-9a-f]{40}$")
# Canonical archive roots: the build may read any mirror, the .deb's sha256 is the check.
DEBIAN_ROOTS = {"debian": "https://deb.debian.org/debian",
                "debian-security": "https://security.debian.org/debian-security"}
LAUNCHER_HISTORY = "frank: frank:launcher"
LOCK_HISTORY = "frank: frank:lock"


@dataclass(frozen=True)
class Item:
    """One component: ``ref`` is unique in an inventory (the SBOM's bom-ref)."""

    ref: str
    name: str
    type: str  # CycloneDX component type: library, file, data, container, application
    part: str  # the part it came from ("base:<name>", "closure", "frank" for frank's own)
    url: str
    version: str = ""
    sha256: str | None = None
    commit: str | None = None
    purl: str | None = None
    layer: str | None = None  # the plan layer holding it, where it is in the image
    in_image: bool = True
    dependency: bool = True  # a build input (provenance resolvedDependencies)

    def fields(self) -> dict[str, Any]:
        """What the SBOM records of it, as compared by ``verify``."""
        return {"name": self.name, "version": self.version, "sha256": self.sha256,
                "commit": self.commit, "url": self.url, "part": self.part,
                "layer": self.layer, "in_image": self.in_image, "purl": self.purl}


@dataclass
class Inventory:
    """The components, and the families of components that could not be listed (why)."""

    items: list[Item] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)  # ref prefix -> why not listed

    def by_ref(self) -> dict[str, Item]:
        return {i.ref: i for i in self.items}


def history_keys(config: dict[str, Any]) -> dict[str, str]:
    """``created_by`` -> comment (the layer key) of the image's history lines."""
    out = {}
    for h in config.get("history") or []:
        if isinstance(h, dict) and h.get("created_by") and h.get("comment"):
            out[str(h["created_by"])] = str(h["comment"])
    return out


def _input_item(part: str, kind: str, version: str, key: str, value: str,
                spec: dict[str, Any]) -> Item:
    sha = value if HEX64.match(value) else None
    commit = value if sha is None and HEX40.match(value) else None
    if key.startswith(("http://", "https://")):
        url = key
    elif key.startswith("git+"):
        url = f"{key}@{value}"
    elif key.startswith("file:"):
        wheel = spec.get("wheel") or {}
        url = f"file://{wheel['path']}" if wheel.get("path") else key
    elif key == "image":
        url = f"docker://{value}"
        sha = value.rsplit("@sha256:", 1)[1] if "@sha256:" in value else None
    else:
        url = f"file:{key}"  # a file or source tree in the stack's repo
    name = key.rsplit("/", 1)[-1] if "://" in key else key
    return Item(ref=f"part:{part}/{key}", name=name, version=version,
                type="library" if name.endswith(".whl") else "file", part=part, url=url,
                sha256=sha, commit=commit, layer=None)


def _weights_items(part: str, version: str, spec: dict[str, Any]) -> list[Item]:
    repo, rev, path = spec.get("repo_id"), spec.get("revision"), spec.get("path")
    out = []
    if repo and rev:
        out.append(Item(ref=f"part:{part}/revision", name=str(repo), version=version,
                        type="data", part=part, url=f"https://huggingface.co/{repo}",
                        commit=str(rev), in_image=False, dependency=False))
    for fname, sha in sorted((spec.get("files") or {}).items()):
        url = (f"https://huggingface.co/{repo}/resolve/{rev}/{fname}" if repo and rev
               else f"file://{Path(str(path)) / fname}")
        out.append(Item(ref=f"weights:{part}/{fname}", name=fname, version=version,
                        type="data", part=part, url=url, sha256=str(sha), in_image=False,
                        dependency=False))
    return out


def _base_items(lock: Lock, root: Path | None, inv: Inventory) -> None:
    base = lock.base_image
    name = base["name"]
    part = f"base:{name}"
    inv.items.append(Item(ref=f"{part}/definition", name=f"images/{name}.toml", type="file",
                          part=part, url=f"file:images/{name}.toml",
                          sha256=base["definition_sha256"], layer="base"))
    if "ref" in base:
        ref = base["ref"]
        digest = ref.rsplit("@", 1)[1]
        repo = ref.rsplit("@", 1)[0]
        inv.items.append(Item(ref=f"{part}/image", name=repo, type="container", part=part,
                              url=f"docker://{ref}", sha256=digest.split(":", 1)[1],
                              purl=purl("oci", repo.rsplit("/", 1)[-1], digest),
                              layer="base"))
    if "debs_lock_sha256" not in base:
        return
    rel = f"images/{name}.debs.lock"
    inv.items.append(Item(ref=f"{part}/debs.lock", name=rel, type="file", part=part,
                          url=f"file:{rel}", sha256=base["debs_lock_sha256"], layer="base"))
    path = root / rel if root is not None else None
    if path is None or not path.is_file() or sha256_file(path) != base["debs_lock_sha256"]:
        inv.missing["deb:"] = (f"the base's Debian packages: no {rel} with the locked sha256 "
                               f"{base['debs_lock_sha256'][:12]}... here")
        return
    from frank.resolve.debs.lock import read_lock

    for deb in read_lock(path).packages:
        inv.items.append(Item(
            ref=f"deb:{deb.name}@{deb.version}?arch={deb.arch}", name=deb.name,
            version=deb.version, type="library", part=part,
            url=f"{DEBIAN_ROOTS[deb.archive]}/{deb.filename}", sha256=deb.sha256,
            purl=purl("deb", deb.name, deb.version, namespace="debian",
                      qualifiers={"arch": deb.arch}),
            layer="base"))


def purl(kind: str, name: str, version: str, *, namespace: str | None = None,
         qualifiers: dict[str, str] | None = None) -> str:
    """A package URL in packageurl-python's canonical spelling (as the SBOM writes it)."""
    from packageurl import PackageURL

    return str(PackageURL(type=kind, namespace=namespace, name=name, version=version,
                          qualifiers=qualifiers or {}).to_string())


def _closure_items(lock: Lock, root: Path | None, inv: Inventory) -> None:
    info = lock.python_closure
    if info is None:
        return
    inv.items.append(Item(ref="closure:pylock", name=info["file"], type="file", part="closure",
                          url=f"file:{info['file']}", sha256=info["sha256"]))
    path = root / info["file"] if root is not None else None
    if path is None or not path.is_file() or sha256_file(path) != info["sha256"]:
        inv.missing["wheel:"] = (f"the Python closure's wheels: no {info['file']} with the "
                                 f"locked sha256 {info['sha256'][:12]}... here")
        return
    from frank.assemble.plan import build_plan

    assert root is not None
    try:
        plan = build_plan(lock, root)
    except FrankError as exc:
        inv.missing["wheel:"] = f"the Python closure's wheels: {exc.one_line()}"
        return
    for layer in plan.layers:
        for w in layer.wheels:
            url = w.url if "://" in w.url else f"file://{w.url}"
            inv.items.append(Item(
                ref=f"wheel:{w.name}@{w.version}", name=w.name, version=w.version,
                type="library", part=layer.part or "closure", url=url, sha256=w.sha256,
                purl=purl("pypi", w.name, w.version), layer=layer.name))


def inventory(lock: Lock, config: dict[str, Any], root: Path | None) -> Inventory:
    """The components of the image whose lock is ``lock`` and config ``config``."""
    from frank.assemble.plan import LAUNCHER_IN_IMAGE, LOCK_IN_IMAGE

    inv = Inventory()
    _base_items(lock, root, inv)
    _closure_items(lock, root, inv)
    for p in lock.parts:
        if p.kind == "weights":
            inv.items += _weights_items(p.name, p.version, p.spec)
        for key, value in sorted(p.inputs.items()):
            inv.items.append(_input_item(p.name, p.kind, p.version, key, value, p.spec))
    keys = history_keys(config)
    for ref, dest, hist, layer in (("frank:launcher", LAUNCHER_IN_IMAGE, LAUNCHER_HISTORY,
                                    "frank:launcher"),
                                   ("frank:lock", LOCK_IN_IMAGE, LOCK_HISTORY, "frank:lock")):
        sha = keys.get(hist)
        if sha is not None and HEX64.match(sha):
            inv.items.append(Item(ref=ref, name=dest, type="file", part="frank",
                                  url=f"file:{dest}", sha256=sha, layer=layer,
                                  dependency=False))
    refs = [i.ref for i in inv.items]
    dup = sorted({r for r in refs if refs.count(r) > 1})
    if dup:
        raise FrankError(f"two components share the reference {dup[0]!r}")
    return inv
