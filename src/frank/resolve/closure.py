"""The stack's whole Python closure, resolved by uv and written as a PEP 751 pylock.

Every distribution the image will hold (the engine, package parts, plugins' dependencies)
is resolved once for the stack's target (the base image's Python, linux x86_64,
manylinux_2_36: Debian bookworm's glibc) and written beside the stack as
``pylock.<stack>.toml``: each wheel with URL (or local path), size and sha256. The file
carries ``[tool.frank].request``, the hash of what was asked for, so ``frank lock
--check`` can tell offline whether it is current and ``frank lock`` re-resolves only when
an input changed or ``--upgrade`` is given. The stack digest covers the pylock's sha256.

uv does the resolving (it reads no pip configuration: only PyPI, the folders of local
wheels a part pins, and the indexes the stack declares, each explicit as uv's
``[[tool.uv.index]] explicit = true``: it serves only the distributions the stack's
``[from_index]`` maps to it, through ``tool.uv.sources``); frank only turns parts into a
request and picks, per package, the one wheel that fits the target.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from frank.errors import NESTED_TOO_DEEP, FrankError
from frank.fsutil import write_atomic
from frank.hashing import sha256_bytes, sha256_json

if TYPE_CHECKING:
    from packaging.tags import Tag

    from frank.image.inventory import Inventory
    from frank.resolve.resolver import Resolved

CLOSURE_FORMAT = 1
DEFAULT_PLATFORM = "x86_64-manylinux_2_36"  # Debian bookworm: glibc 2.36
DEFAULT_PYTHON = "3.11"  # Debian bookworm's python3, the bases' interpreter
_GLIBC = (2, 36)


@dataclass(frozen=True)
class LocalWheel:
    """A wheel a part pins by path and sha256 (uv finds it through its folder)."""

    path: Path
    sha256: str


@dataclass
class ClosureRequest:
    """What the closure is resolved from; its hash says whether a pylock is current."""

    python: str
    platform: str = DEFAULT_PLATFORM
    requirements: list[str] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)
    excludes: list[str] = field(default_factory=list)
    local_wheels: list[LocalWheel] = field(default_factory=list)
    pinned: dict[str, str] = field(default_factory=dict)  # distribution -> sha256 it must have
    indexes: dict[str, str] = field(default_factory=dict)  # name -> URL, besides PyPI
    from_index: dict[str, str] = field(default_factory=dict)  # distribution -> index name
    # distribution -> (stack file, field) that mapped it: where an error points, not hashed
    index_origin: dict[str, tuple[Path, str]] = field(default_factory=dict, compare=False)
    # what an official engine image already holds (name==version): the closure is resolved
    # against it (frank.image.inventory)
    constraints: list[str] = field(default_factory=list)
    # requirements installed without their dependencies (a package part's no_deps)
    no_deps: list[str] = field(default_factory=list)
    # "remove:NAME" / "overrides:NAME" -> (part manifest, field): each must name a
    # distribution that is there (``check_names``); where an error points, not hashed
    named_by: dict[str, tuple[Path, str]] = field(default_factory=dict, compare=False)
    base_names: list[str] = field(default_factory=list, compare=False)  # the image's

    def digest(self) -> str:
        # each extra only when it is there: a stack without keeps its pylock current
        extra: dict[str, Any] = {}
        if self.indexes:
            extra["indexes"] = dict(sorted(self.indexes.items()))
            extra["from_index"] = dict(sorted(self.from_index.items()))
        if self.constraints:
            extra["constraints"] = sorted(self.constraints)
        if self.no_deps:
            extra["no_deps"] = sorted(self.no_deps)
        return sha256_json({
            "format": CLOSURE_FORMAT, "python": self.python, "platform": self.platform,
            "requirements": sorted(self.requirements), "overrides": sorted(self.overrides),
            "excludes": sorted(self.excludes),
            "local_wheels": sorted(w.sha256 for w in self.local_wheels),
            "pinned": dict(sorted(self.pinned.items())), **extra,
        })


@dataclass(frozen=True)
class Wheel:
    """One distribution of the closure: the wheel chosen for the target."""

    name: str  # canonical name
    version: str
    filename: str
    url: str  # https://... or file:///...
    sha256: str
    size: int | None


def request_for(resolved: Resolved, base: Inventory | None = None) -> ClosureRequest | None:
    """The closure request of a resolved stack; None when no part brings Python packages.

    ``base``: what the official engine image the stack sits on holds. Its distributions are
    the closure's constraints (a dependency the image has stays at the image's version),
    except those a part names; an override then is a requirement too (it installs that
    version over the image's)."""
    from frank.model.kinds.base import PartContext
    from frank.model.kinds.engine import EngineBase

    stack = resolved.stack
    request = ClosureRequest(python=DEFAULT_PYTHON, indexes=dict(stack.indexes),
                             from_index=dict(stack.from_index),
                             index_origin=dict(stack.index_origin))
    for rp in resolved.parts:
        part = rp.manifest.part
        if isinstance(part, EngineBase):
            request.python = part.python
        needs = part.python_needs(PartContext(root=resolved.root, manifest=rp.manifest.path))
        request.requirements += needs.requirements
        request.overrides += needs.overrides
        request.excludes += needs.excludes
        request.local_wheels += [LocalWheel(Path(p), sha) for p, sha in needs.local_wheels]
        request.pinned.update(needs.pinned)
        request.no_deps += needs.no_deps
        if base is not None:
            request.requirements += needs.overrides
        _named_by(request, part, rp.manifest.path)
    if not request.requirements and not request.no_deps:
        if request.from_index:  # an index with nothing to serve would be ignored: refuse
            dist = sorted(request.from_index)[0]
            path, where = request.index_origin[dist]
            raise FrankError(f"{dist} is not in the stack's Python closure (no part brings "
                             "Python packages)", file=path, field=where)
        return None
    if base is not None:
        request.constraints = base_constraints(base, request)
        request.base_names = sorted(d.name for d in base.dists)
    return request


def _named_by(request: ClosureRequest, part: object, manifest: Path) -> None:
    """Where each name a package part's ``remove`` and ``overrides`` give came from (an
    override installed without dependencies is resolved as asked: not checked here)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    from frank.model.kinds.package import Package

    if not isinstance(part, Package):
        return
    for name in part.remove:
        request.named_by[f"remove:{canonicalize_name(name)}"] = (manifest, "remove")
    if not part.no_deps:
        for req in part.overrides:
            request.named_by[f"overrides:{canonicalize_name(Requirement(req).name)}"] = (
                manifest, "overrides")


def base_constraints(base: Inventory, request: ClosureRequest) -> list[str]:
    """``name==version`` of every distribution of the base that no part names (a version
    that is not PEP 440 cannot be a constraint: that distribution is left free)."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version

    named = {canonicalize_name(Requirement(r).name) for r in
             (*request.requirements, *request.overrides, *request.no_deps)}
    named |= {canonicalize_name(n) for n in (*request.excludes, *request.pinned)}
    out = []
    for dist in base.dists:
        try:
            Version(dist.version)
            line = str(Requirement(f"{dist.name}=={dist.version}"))
        except (InvalidVersion, InvalidRequirement):
            continue
        if canonicalize_name(dist.name) not in named:
            out.append(line)
    return sorted(set(out))


_PROJECT = "frank-closure-request"


def _project(request: ClosureRequest, requirements: list[str], mapped: list[str]) -> str:
    """A pyproject.toml asking for the request's requirements, with its indexes explicit
    and each mapped distribution sourced from its index: how uv takes indexes per package
    (``uv pip compile`` reads ``tool.uv.index`` and ``tool.uv.sources`` from it)."""
    q = json.dumps  # a JSON string is a TOML basic string
    # uv applies a source only to the project's own dependencies (astral-sh/uv#8253): each
    # mapped distribution is one, unversioned; _check_sources refuses one nothing asks for
    wanted = [*requirements, *mapped]
    lines = ["[project]", f"name = {q(_PROJECT)}", 'version = "0"',
             f"requires-python = {q('>=' + request.python)}",
             "dependencies = [" + ", ".join(q(r) for r in wanted) + "]", ""]
    # an override given with --overrides loses its source (uv takes it from PyPI): one of a
    # mapped distribution is the project's own override, which keeps it
    ours = _mapped_overrides(request)
    if ours:
        lines += ["[tool.uv]", "override-dependencies = [" + ", ".join(q(r) for r in ours)
                  + "]", ""]
    for name, url in sorted(request.indexes.items()):
        lines += ["[[tool.uv.index]]", f"name = {q(name)}", f"url = {q(url)}",
                  "explicit = true", ""]
    lines.append("[tool.uv.sources]")
    lines += [f"{q(dist)} = {{ index = {q(name)} }}"
              for dist, name in sorted(request.from_index.items())]
    return "\n".join(lines) + "\n"


def _mapped_overrides(request: ClosureRequest) -> list[str]:
    """The request's overrides of distributions mapped to an index."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    mapped = {canonicalize_name(d) for d in request.from_index}
    return [r for r in request.overrides if canonicalize_name(Requirement(r).name) in mapped]


def pylock_path(stack_file: Path) -> Path:
    """``stacks/served.toml`` -> ``stacks/pylock.served.toml`` (PEP 751 names it so)."""
    stem = stack_file.stem.replace(".", "-")
    return stack_file.with_name(f"pylock.{stem}.toml")


def _uv() -> str:
    found = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    if not Path(found).exists():
        raise FrankError("uv is not installed (pip install uv); frank resolves the Python "
                         "closure with it")
    return found


def _run_uv(cmd: list[str], cwd: str, stack_file: Path, request: ClosureRequest) -> str:
    """Run uv (no UV_ variables, the host's CA bundle); its failure is one line, pointed at
    the stack's mapping when it is about a distribution that no index has
    (``_not_found``)."""
    from frank.store.fetch import ca_bundle

    env = {k: v for k, v in os.environ.items() if not k.startswith("UV_")}
    bundle = ca_bundle()
    if bundle:
        env["SSL_CERT_FILE"] = bundle
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    if proc.returncode != 0:
        lines = [x for x in proc.stderr.splitlines() if x.strip()]
        why = next((x for x in lines if "\u00d7" in x or "error" in x.lower()),
                   lines[0] if lines else "uv failed")
        detail = " ".join(x.strip() for x in lines[1:4])
        raise _held_by_image(_not_found(FrankError(
            f"resolving the Python closure failed: {why.strip()} {detail}", file=stack_file),
            request, stack_file), " ".join(x.strip() for x in lines), request)
    return proc.stdout


def resolve(request: ClosureRequest, out: Path, *, stack_file: Path) -> None:
    """Resolve ``request`` with uv and write the pylock atomically.

    Requirements a part installs without their dependencies (``no_deps``) are resolved on
    their own with ``--no-deps`` and left out of the rest of the closure (excluded), so
    neither they nor their dependencies come in by way of another requirement."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    alone = [str(Requirement(r).name) for r in request.no_deps]
    mapped = sorted(d for d in request.from_index
                    if canonicalize_name(d) not in {canonicalize_name(a) for a in alone})
    if request.base_names:  # an override is asked for here: the names first (a typo
        check_names(request, {}, stack_file, alone=alone, mapped=mapped)  # fails in uv)
    text = ""
    if request.requirements:
        text = _compile(request, request.requirements, stack_file,
                        excludes=[*request.excludes, *alone], mapped=mapped)
    if request.no_deps:
        more = _compile(request, request.no_deps, stack_file, excludes=request.excludes,
                        no_deps=True, mapped=[])
        text = (text.rstrip("\n") + "\n\n" + more[more.index("[[packages]]"):]) \
            if text and "[[packages]]" in more else (text or more)
    if not request.base_names:
        check_names(request, tomllib.loads(text) if text else {}, stack_file, alone=alone,
                    mapped=mapped if request.requirements else [])
    text += f'\n[tool.frank]\nrequest = "{request.digest()}"\n'
    wheels = select_wheels(tomllib.loads(text), request, file=out)
    _check_pins(wheels, request, out)
    _check_indexes(wheels, request)
    write_atomic(out, text)


def check_names(request: ClosureRequest, doc: dict[str, Any], stack_file: Path, *,
                alone: list[str], mapped: list[str]) -> None:
    """Every name a part's ``remove`` and ``overrides`` give is a distribution that is there:
    the official image's, or one of the closure (resolved again without the removals, and
    without the overrides asked for as requirements, only when a name is in neither). One
    that is not is one line naming it and the closest real name: a typo used to be
    accepted and change nothing (issue 54)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    from frank.model.closest import did_you_mean

    base = set(request.base_names)
    have = {str(canonicalize_name(p["name"])) for p in doc.get("packages", [])}
    unsure: dict[str, tuple[Path, str]] = {}
    for key, origin in request.named_by.items():
        what, name = key.split(":", 1)
        # on the image path an override is asked for, so being resolved proves nothing
        if name in base or (what == "overrides" and not base and name in have):
            continue
        unsure[name] = origin
    if not unsure:
        return
    asked = {key.split(":", 1)[1] for key in request.named_by if key.startswith("overrides:")}
    own = [r for r in request.requirements
           if not base or str(canonicalize_name(Requirement(r).name)) not in asked]
    bare = _compile(request, own, stack_file, excludes=alone, mapped=mapped,
                    check=False) if own else ""
    there = base | {str(canonicalize_name(p["name"]))
                    for p in (tomllib.loads(bare).get("packages", []) if bare else [])}
    for name, (manifest, field_name) in sorted(unsure.items()):
        if name not in there:
            place = ("in neither the base image nor the stack's Python closure" if base
                     else "not in the stack's Python closure")
            raise FrankError(f"{name} is {place}{did_you_mean(name, there | have)}",
                             file=manifest, field=field_name)


def _compile(request: ClosureRequest, requirements: list[str], stack_file: Path, *,
             excludes: list[str], mapped: list[str], no_deps: bool = False,
             check: bool = True) -> str:
    """One ``uv pip compile`` of ``requirements`` into pylock text (paths made relative);
    with indexes, through a project file that sources each mapped distribution from its
    index, checked against uv's annotations (``_check_sources``) on the main pass."""
    with tempfile.TemporaryDirectory(prefix="frank-closure-") as tmp:
        t = Path(tmp)
        if request.indexes:
            source = t / "pyproject.toml"
            source.write_text(_project(request, requirements, mapped))
        else:
            source = t / "requirements.in"
            source.write_text("".join(f"{r}\n" for r in requirements))
        given = set(_mapped_overrides(request)) if request.indexes else set()
        (t / "overrides.txt").write_text("".join(f"{r}\n" for r in request.overrides
                                                 if r not in given))
        (t / "excludes.txt").write_text("".join(f"{r}\n" for r in excludes))
        constraints = []
        if request.constraints:
            (t / "constraints.txt").write_text("".join(f"{r}\n" for r in request.constraints))
            constraints = ["--constraints", str(t / "constraints.txt")]
        cmd = [_uv(), "pip", "compile", str(source), "--python-version", request.python,
               "--python-platform", request.platform, "--no-header", "--quiet",
               "--overrides", str(t / "overrides.txt"), "--excludes", str(t / "excludes.txt"),
               "--no-config", *constraints, *(["--no-deps"] if no_deps else [])]
        for folder in sorted({str(w.path.parent) for w in request.local_wheels}):
            cmd += ["--find-links", folder]
        if request.indexes and not no_deps and check:  # which index, what asked for it
            _check_sources(_run_uv([*cmd, "--emit-index-annotation"], tmp, stack_file,
                                   request), request)
        _run_uv([*cmd, "--format", "pylock.toml", "-o", str(t / "pylock.toml")], tmp,
                stack_file, request)
        text = (t / "pylock.toml").read_text(encoding="utf-8")
    return text.replace(str(Path(tmp)), ".")


def _not_found(exc: FrankError, request: ClosureRequest, stack_file: Path) -> FrankError:
    """uv's failure when it says a distribution "was not found in the package registry":
    one mapped to an index its index lacks, or one a part pins that PyPI lacks (a wheel
    from another index the stack does not declare)."""
    import re

    from packaging.utils import canonicalize_name

    from frank.model.closest import closest, did_you_mean

    for dist, index in sorted(request.from_index.items()):
        if f"Because {dist} was not found in the package registry" in exc.message:
            path, where = request.index_origin[dist]
            return FrankError(f"index {index} ({request.indexes[index]}) has no {dist} "
                              "that fits" + did_you_mean(dist, _index_projects(
                                  request.indexes[index])), file=path, field=where)
    for dist in sorted(str(canonicalize_name(d)) for d in request.pinned):
        if dist not in request.from_index and (
                f"Because {dist} was not found in the package registry" in exc.message
                or f"Because there is no version of {dist}==" in exc.message):
            return FrankError(f"{dist}, pinned by a part, is not on PyPI: declare the index "
                              "it comes from in [indexes] and map it to it here",
                              file=stack_file, field=f"from_index.{dist}")
    missing = re.findall(r"Because (\S+) was not found in the package registry", exc.message)
    for dist in missing:  # a real one left unmapped by a mapping's typo
        near = closest(dist, [d for d in request.from_index if d not in missing])
        if near is None:
            continue
        listed = _index_projects(request.indexes[request.from_index[near]])
        if listed and str(canonicalize_name(near)) not in {
                str(canonicalize_name(n)) for n in listed} and dist in listed:
            path, where = request.index_origin[near]
            return FrankError(f"{near} is mapped but its index has no such project, and "
                              f"{dist}, which the closure needs, is not on PyPI: the closest "
                              f"is {dist}", file=path, field=where)
    return exc


def _held_by_image(exc: FrankError, said: str, request: ClosureRequest) -> FrankError:
    """uv's "No solution found" when a version the official image holds (a constraint) is
    in the way: say that the version is the image's and which ``overrides`` line would
    change it (issue 54: uv's words came through alone)."""
    import re

    from packaging.requirements import Requirement

    if "No solution found" not in said:
        return exc
    for line in sorted(request.constraints):
        held = Requirement(line)
        name, version = held.name, str(held.specifier).removeprefix("==")
        if not re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w-])", said):
            continue
        wants = re.findall(rf"(?<![\w.-]){re.escape(name)}((?:[<>=!~]=?|===)[\w.*+!-]+"
                           rf"(?:,\s*(?:[<>=!~]=?)[\w.*+!-]+)*)", said)
        wanted = next((w for w in wants if w.replace(" ", "") != f"=={version}"), None)
        spec = wanted.replace(" ", "") if wanted else f">{version}"
        return FrankError(f"{exc.message}; {name} {version} is the base image's version, "
                          "which the closure keeps unless a part overrides it: a package "
                          f'part with overrides = ["{name}{spec}"] would change it',
                          file=exc.file, field=exc.field)
    return exc


def _index_projects(url: str) -> list[str]:
    """The projects a PEP 503 index lists on its root page (for the closest name to one it
    lacks); none when the page cannot be read."""
    import re
    import ssl
    import urllib.request

    from frank.store.fetch import ca_bundle

    try:
        context = ssl.create_default_context(cafile=ca_bundle() or None)
        from frank.store.fetch import netrc_auth

        request = urllib.request.Request(url.rstrip("/") + "/", headers=netrc_auth(url))
        with urllib.request.urlopen(request, timeout=10, context=context) as reply:
            page = reply.read(4 << 20).decode("utf-8", "replace")
    except (OSError, ValueError):
        return []
    return [m.strip().rstrip("/") for m in re.findall(r">([^<>]+)</a>", page)]


def _annotations(text: str) -> dict[str, tuple[list[str], str | None]]:
    """uv's annotated requirements output: name -> (what asked for it, the index URL)."""
    from packaging.utils import canonicalize_name

    out: dict[str, tuple[list[str], str | None]] = {}
    name = ""
    for line in text.splitlines():
        if line and not line.startswith((" ", "#")):
            name = str(canonicalize_name(line.split("==")[0].split(" @ ")[0].strip()))
            out[name] = ([], None)
            continue
        note = line.strip().removeprefix("#").strip()
        if not name or not note:
            continue
        via = out[name][0]
        if note.startswith("from "):
            out[name] = (via, note.removeprefix("from ").strip())
        elif note != "via":
            via.append(note.removeprefix("via ").strip())
    return out


def _check_sources(text: str, request: ClosureRequest) -> None:
    """uv takes an index's sources only for the project's own dependencies, so each mapped
    distribution is one (``_project``): here, each must also be asked for by a part or by
    another distribution of the closure (a mapping alone must not add one), and must have
    come from its index."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    found = _annotations(text)
    asked = {canonicalize_name(Requirement(r).name) for r in request.requirements}
    alone = {canonicalize_name(Requirement(r).name) for r in request.no_deps}
    for dist, index in sorted(request.from_index.items()):
        if canonicalize_name(dist) in alone:  # resolved on its own pass (no_deps)
            continue
        path, where = request.index_origin[dist]
        via, source = found.get(dist, ([], None))
        others = [v for v in via if not v.startswith(f"{_PROJECT} ")]
        if dist not in asked and not others:
            from frank.model.closest import did_you_mean

            raise FrankError(f"{dist} is not in the stack's Python closure (no part and no "
                             "distribution asks for it, so no index would serve it)"
                             + did_you_mean(dist, found), file=path, field=where)
        url = request.indexes[index]
        if source is None or source.rstrip("/") != url.rstrip("/"):
            raise FrankError(f"{dist} was resolved from {source or 'no index'}, not from "
                             f"{index} ({url})", file=path, field=where)


def current(request: ClosureRequest, path: Path) -> bool:
    """Whether the pylock at ``path`` was resolved from exactly this request (offline)."""
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError):
        return False
    return bool(doc.get("tool", {}).get("frank", {}).get("request") == request.digest())


def find_sibling(request: ClosureRequest, out: Path, own: Path | None = None) -> Path | None:
    """A current pylock of another stack that asked the same, beside ``own`` (the stack's real
    pylock: ``out`` may be a working copy elsewhere, as a revert's is)."""
    own = own or out
    return next((other for other in sorted(own.parent.glob("pylock.*.toml"))
                 if other not in (out, own) and current(request, other)), None)


def copy_sibling(request: ClosureRequest, out: Path, own: Path | None = None) -> bool:
    """Reuse (copy, offline) another stack's pylock that was resolved from the same request."""
    other = find_sibling(request, out, own)
    if other is not None:
        write_atomic(out, other.read_bytes())
    return other is not None


def target_tags(python: str) -> list[Tag]:
    """The wheel tags a CPython of ``python`` (e.g. "3.11") on manylinux_2_36 x86_64 takes."""
    from packaging.tags import compatible_tags, cpython_tags

    major, minor = (int(x) for x in python.split(".")[:2])
    platforms = [f"manylinux_2_{m}_x86_64" for m in range(_GLIBC[1], 16, -1)]
    platforms += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64",
                  "linux_x86_64"]
    return [*cpython_tags((major, minor), platforms=platforms),
            *compatible_tags((major, minor), platforms=platforms)]


def _environment(python: str) -> dict[str, str]:
    return {"implementation_name": "cpython", "platform_python_implementation": "CPython",
            "python_version": python, "python_full_version": f"{python}.0",
            "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
            "platform_machine": "x86_64", "implementation_version": f"{python}.0",
            "platform_release": "", "platform_version": "", "extra": ""}


def _wheel_url(entry: dict[str, Any], lock_file: Path) -> str:
    if "url" in entry:
        return str(entry["url"])
    if "path" in entry:
        path = Path(entry["path"])
        return (path if path.is_absolute() else (lock_file.parent / path).resolve()).as_uri()
    raise FrankError("a wheel entry has neither url nor path", file=lock_file)


def select_wheels(doc: dict[str, Any], request: ClosureRequest, *, file: Path) -> list[Wheel]:
    """Per package of a pylock, the best wheel for the target; a package without one fails."""
    from packaging.markers import Marker
    from packaging.utils import canonicalize_name, parse_wheel_filename

    from frank.model.pins import wheel_filename

    tags = target_tags(request.python)
    rank = {t: i for i, t in enumerate(tags)}
    env = _environment(request.python)
    out: list[Wheel] = []
    for pkg in doc.get("packages", []):
        name = canonicalize_name(pkg["name"])
        marker = pkg.get("marker")
        if marker and not Marker(marker).evaluate(env):
            continue
        best: tuple[int, dict[str, Any], str] | None = None
        for entry in pkg.get("wheels", []):
            url = _wheel_url(entry, file)
            filename = entry.get("name") or wheel_filename(url)
            _, _, _, wheel_tags = parse_wheel_filename(filename)
            score = min((rank[t] for t in wheel_tags if t in rank), default=None)
            if score is not None and (best is None or score < best[0]):
                best = (score, entry, filename)
        if best is None:
            raise FrankError(f"{name} {pkg.get('version')} has no wheel for CPython "
                             f"{request.python} on manylinux_2_36 x86_64 (frank builds no "
                             "sdists inside an image)", file=file, field=f"packages.{name}")
        _, entry, filename = best
        out.append(Wheel(name=name, version=str(pkg.get("version", "")), filename=filename,
                         url=_wheel_url(entry, file), sha256=entry["hashes"]["sha256"],
                         size=entry.get("size")))
    return sorted(out, key=lambda w: w.name)


def _check_pins(wheels: list[Wheel], request: ClosureRequest, file: Path) -> None:
    from packaging.utils import canonicalize_name

    by_name = {w.name: w for w in wheels}
    for dist, sha in request.pinned.items():
        wheel = by_name.get(canonicalize_name(dist))
        if wheel is None:
            raise FrankError(f"{dist} is pinned by a part but not in the resolved closure",
                             file=file)
        if wheel.sha256 != sha:
            raise FrankError(f"{dist}: the resolver chose {wheel.filename} (sha256 "
                             f"{wheel.sha256[:16]}…) but a part pins sha256 {sha[:16]}…",
                             file=file)


def _check_indexes(wheels: list[Wheel], request: ClosureRequest) -> None:
    """Each distribution mapped to an index is in the closure (a field frank accepts must
    have its effect): read back from a pylock, which a hand may have edited."""
    names = {w.name for w in wheels}
    for dist in sorted(request.from_index):
        if dist not in names:
            path, where = request.index_origin[dist]
            raise FrankError(f"{dist} is not in the stack's Python closure (nothing asks for "
                             "it, so no index would serve it)", file=path, field=where)


def load(path: Path, request: ClosureRequest) -> list[Wheel]:
    """The target's wheels from a current pylock; a stale or missing one is an error."""
    try:
        text = path.read_text(encoding="utf-8")
        doc = tomllib.loads(text)
    except FileNotFoundError:
        raise FrankError("the Python closure is not locked (run `frank lock`)",
                         file=path) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise FrankError(f"not a valid pylock: {exc}", file=path) from None
    except RecursionError:
        raise FrankError(NESTED_TOO_DEEP, file=path) from None
    wheels = select_wheels(doc, request, file=path)
    _check_pins(wheels, request, path)
    _check_indexes(wheels, request)
    return wheels


def file_digest(path: Path) -> str:
    """The pylock's sha256, for the stack lock."""
    return sha256_bytes(path.read_bytes())
