"""The image on its target: what the engine will run there, held to code the target runs.

The stack's ``[target] arch`` names the device (sm_120). The facts come from the lock's
parts (``frank.model.targets``: a part's ``[[targets]]`` for the device's family), never from
the image; the image is only looked at. Five verdicts, each with its evidence:

- **libraries**: a library with no code the device runs (no SASS for it, no PTX the driver
  can compile for it) fails unless a part declares its kernels unused there, citing the
  engine's rule; a declaration must name files the image holds, and a rule declared
  ``pure`` is evaluated from the image's copy of the engine's source (``purerule``);
- **dead device code**: per owner, the bytes of entries the device cannot run;
- **the engine's path**: for each backend the engine selects (``when`` it applies to the
  locked closure), every kernel in call order must have code the device runs: a FlashInfer
  module built ahead of time (``flashinfer/data/aot/<m>/<m>.so`` or the jit-cache
  package), a library (and its symbol), a folder of cubins; the first without one fails;
- **run-time tools**: a tool the engine calls must be in the image (PATH or the places
  declared) unless what it would build is there already: a file with code the device runs
  and, at the top of the site folder, an extension module ``import <name>`` loads (a
  suffix the image's Python imports, ``PyInit_<name>``), not a file that merely matches;
- **the first start**: what still compiles on the device (FlashInfer modules not built
  ahead of time, extensions a tool would build, Triton and TileLang kernels counted in
  the sources, PTX-only libraries the driver compiles).
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
import re
from collections import defaultdict
from dataclasses import dataclass

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from frank.audit.cuda import CudaCode, has_symbol
from frank.audit.layers import Entry, MergedView
from frank.audit.purerule import NotPure, evaluate
from frank.audit.report import (
    DeadCode,
    Difference,
    FirstStart,
    KernelVerdict,
    TargetReport,
    ToolVerdict,
    UnusedVerdict,
)
from frank.model.archs import CudaTarget, parse_arch, runs_on
from frank.model.targets import TargetFacts
from frank.resolve.lock import Lock

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# decorators, counted as bytes (a regex over vLLM's 2,000 sources cost 3 s of the audit)
_TRITON = (b"@triton.jit",)
_TILELANG = (b"@tilelang.jit", b"@T.prim_func")


@dataclass(frozen=True)
class Declared:
    """A part's facts for the device's family."""

    part: str
    facts: TargetFacts


def declared(lock: Lock, major: int) -> list[Declared]:
    """Every part's ``[[targets]]`` entry for the family of capability ``major``."""
    out = []
    for part in lock.parts:
        for raw in part.spec.get("targets") or []:
            facts = TargetFacts.model_validate(raw)
            if facts.covers(major):
                out.append(Declared(part.name, facts))
    return out


def runs(code: CudaCode, device: CudaTarget) -> str | None:
    """``sass``, ``ptx`` (the driver compiles it) or None: how ``code`` runs on ``device``."""
    if any(_runs(a, device, False) for a in code.sass):
        return "sass"
    if any(_runs(a, device, True) for a in code.ptx):
        return "ptx"
    return None


def _runs(arch: str, device: CudaTarget, ptx: bool) -> bool:
    try:
        return runs_on(parse_arch(arch), device, ptx=ptx)
    except ValueError:
        return False


@dataclass
class TargetAudit:
    """One pass over the merged view for one device."""

    view: MergedView
    lock: Lock
    site: str  # image path of the site folder, no leading slash
    versions: dict[str, str]  # canonical distribution name -> locked version
    device: CudaTarget
    files: list[tuple[str, CudaCode]]  # every file with GPU code
    owned: dict[str, str]
    image_path: str  # the config's PATH

    def run(self) -> tuple[TargetReport, list[Difference], set[str]]:
        """The report, its differences, and the files whose kernels are declared unused."""
        decls = declared(self.lock, self.device.major)
        diffs: list[Difference] = []
        unused_files: set[str] = set()
        unused = []
        for d in decls:
            for u in d.facts.unused:
                hits = self._glob(u.path)
                verdict = UnusedVerdict(part=d.part, path=u.path, rule=u.rule, why=u.why,
                                        files=hits)
                if not hits:
                    diffs.append(Difference(
                        part=d.part, path=self._shown(u.path),
                        check="declared unused library not in the image",
                        lock=f"a file to declare ({u.rule})", image="nothing"))
                if u.pure:
                    verdict.evaluated, problem = self._pure(u.pure)
                    if problem:
                        diffs.append(Difference(part=d.part, path=self._shown(u.path),
                                                check="declared rule cannot be evaluated",
                                                lock=u.pure, image=problem))
                    elif verdict.evaluated:
                        diffs.append(Difference(
                            part=d.part, path=self._shown(u.path),
                            check="declared unused, but the engine's rule selects it",
                            lock=f"{u.pure} false on {self.device.spell('sm')}",
                            image="it returns True"))
                unused_files.update(hits)
                unused.append(verdict)
        kernels, kdiffs = self._paths(decls)
        tools, tdiffs = self._tools(decls)
        report = TargetReport(
            device=self.device.spell("sm"), family=f"{self.device.major}.x",
            declared_by=sorted({d.part for d in decls}), unused=unused,
            dead=self._dead(), path=kernels, tools=tools,
            first_start=self._first_start(decls, kernels, tools))
        return report, diffs + kdiffs + tdiffs, {"/" + f for f in unused_files}

    # -- helpers ----------------------------------------------------------------------
    def _shown(self, pattern: str) -> str:
        """A declared path as an image path with its leading slash."""
        return pattern if pattern.startswith("/") else f"/{self.site}/{pattern}"

    def _glob(self, pattern: str) -> list[str]:
        """Image paths (no leading slash) of regular files matching a glob relative to the
        site folder, or absolute."""
        full = pattern[1:] if pattern.startswith("/") else f"{self.site}/{pattern}"
        fixed = full.split("*", 1)[0].rsplit("/", 1)[0]
        return [p for p, e in self.view.under(fixed)
                if e.kind in ("file", "hardlink") and fnmatch.fnmatchcase(p, full)
                and p.count("/") == full.count("/")]

    def _read(self, path: str) -> bytes | None:
        hit = self.view.visible.get(path)
        entry = self.view.get(path)
        if hit is None or entry is None or entry.kind != "file":
            return None
        return self.view.read(hit[0], entry)

    def _pure(self, cite: str) -> tuple[bool | None, str]:
        file, _, qualname = cite.partition(":")
        source = self._read(f"{self.site}/{file}")
        if source is None:
            return None, f"the image holds no /{self.site}/{file}"
        try:
            return evaluate(source.decode("utf-8", "replace"), qualname, self.device.major,
                            self.device.minor), ""
        except (NotPure, SyntaxError) as exc:
            return None, str(exc)

    def _code(self, path: str) -> CudaCode | None:
        entry = self.view.get(path)
        return entry.cuda if entry is not None else None

    def _when(self, when: str | None) -> bool:
        if when is None:
            return True
        req = Requirement(when)
        have = self.versions.get(str(canonicalize_name(req.name)))
        return have is not None and req.specifier.contains(have, prereleases=True)

    def _paths(self, decls: list[Declared]) -> tuple[list[KernelVerdict], list[Difference]]:
        out: list[KernelVerdict] = []
        diffs: list[Difference] = []
        for d in decls:
            for step in d.facts.path:
                if not self._when(step.when):
                    continue
                failed = False
                for k in step.kernels:
                    v = self._kernel(d.part, step.role, step.backend, k)
                    out.append(v)
                    if not v.ok and not failed:
                        failed = True
                        diffs.append(Difference(
                            part=d.part, path=v.where or f"/{self.site}",
                            check=f"engine path: {step.role} via {step.backend}: {k.what} "
                                  f"({k.ref}, {k.cite}) has no code for "
                                  f"{self.device.spell('sm')}",
                            lock="SASS, PTX or a module built ahead of time",
                            image=v.evidence))
        return out, diffs

    def _kernel(self, part: str, role: str, backend: str, k: object) -> KernelVerdict:
        from frank.model.targets import KernelRef

        assert isinstance(k, KernelRef)
        base = {"part": part, "role": role, "backend": backend, "what": k.what,
                "ref": k.ref, "cite": k.cite}
        dev = self.device.spell("sm")
        if k.flashinfer_module:
            path = self._aot_module(k.flashinfer_module)
            if path is None:
                return KernelVerdict(**base, ok=False, where="",
                                     evidence="not built ahead of time: FlashInfer compiles "
                                              "it at first start (JIT)")
            code = self._code(path)
            how = runs(code, self.device) if code else None
            return KernelVerdict(**base, ok=how is not None, where="/" + path,
                                 evidence=f"built ahead of time; {_archs(code)}" if how
                                 else f"built ahead of time without {dev} code: "
                                      f"{_archs(code)}")
        if k.library:
            hits = self._glob(k.library)
            if not hits:
                return KernelVerdict(**base, ok=False, where=self._shown(k.library),
                                     evidence="no such file in the image")
            path = hits[0]
            code = self._code(path)
            how = runs(code, self.device) if code else None
            if how is None:
                return KernelVerdict(**base, ok=False, where="/" + path,
                                     evidence=_archs(code))
            wrong = self._not_module(path)
            if wrong:
                return KernelVerdict(**base, ok=False, where="/" + path,
                                     evidence=f"{_archs(code)}; {wrong}")
            if k.symbol and not self._symbol(path, k.symbol):
                return KernelVerdict(**base, ok=False, where="/" + path,
                                     evidence=f"{_archs(code)}; no symbol {k.symbol}")
            return KernelVerdict(**base, ok=True, where="/" + path, evidence=_archs(code))
        folder = self._shown(k.cubins or "").lstrip("/")
        items = [(p, e.cuda) for p, e in self.view.under(folder) if e.cuda is not None]
        good = [p for p, c in items if runs(c, self.device)]
        seen: set[str] = set()
        for _, c in items:
            seen |= c.sass | c.ptx
        return KernelVerdict(**base, ok=bool(good), where="/" + folder,
                             evidence=f"{len(good)} of {len(items)} cubins run on {dev}; "
                                      f"archs {' '.join(sorted(seen)) or 'none'}")

    def _not_built(self, path: str) -> str | None:
        """Why a file a tool would build does not stand in for the build (None: it does).
        It must hold code the device runs; one at the top of the site folder is an
        extension module, so it must also be importable there (``_not_module``)."""
        code = self._code(path)
        if code is None or runs(code, self.device) is None:
            return f"/{path} is not built for {self.device.spell('sm')}: {_archs(code)}"
        return self._not_module(path)

    def _not_module(self, path: str) -> str | None:
        """For a shared object at the top of the site folder, why ``import <name>`` would
        not load it as module ``<name>`` (None: it would, or it is no such file): a suffix
        the image's Python does not import, or no ``PyInit_<name>`` (CPython's entry)."""
        rel = path.removeprefix(self.site + "/")
        if rel == path or "/" in rel or not rel.endswith(".so"):
            return None
        name, _, tag = rel.partition(".")
        if tag not in self._ext_tags():
            return (f"/{path}: the image's Python imports no .{tag} "
                    f"(it imports {', '.join('.' + t for t in self._ext_tags())})")
        if not self._symbol(path, f"PyInit_{name}"):
            return f"/{path} defines no PyInit_{name}: it is not the {name} module"
        return None

    def _ext_tags(self) -> list[str]:
        """The extension suffixes of the site folder's CPython (``python3.11`` in it)."""
        m = re.search(r"/python3\.([0-9]+)/", f"/{self.site}/")
        tags = [f"cpython-3{m.group(1)}-x86_64-linux-gnu.so"] if m else []
        return [*tags, "abi3.so", "so"]

    def _aot_module(self, name: str) -> str | None:
        for folder in (f"{self.site}/flashinfer/data/aot", f"{self.site}/flashinfer_jit_cache"):
            for path, entry in self.view.under(folder):
                if path.endswith(f"/{name}/{name}.so") and entry.kind in ("file", "hardlink"):
                    return path
        return None

    def _symbol(self, path: str, symbol: str) -> bool:
        hit = self.view.visible.get(path)
        entry = self.view.get(path)
        if hit is None or entry is None:
            return False
        with self.view.layers[hit[0]].blob.open("rb") as f:
            fd = f.fileno()

            def read(offset: int, size: int) -> bytes:
                return os.pread(fd, max(0, min(size, entry.size - offset)),
                                entry.offset + offset)
            return has_symbol(read, entry.size, symbol)

    def _tools(self, decls: list[Declared]) -> tuple[list[ToolVerdict], list[Difference]]:
        out: list[ToolVerdict] = []
        diffs: list[Difference] = []
        for d in decls:
            for t in d.facts.tools:
                if not self._when(t.when):
                    continue
                hits = [hit for b in t.built for hit in self._glob(b)]
                refused = [why for why in map(self._not_built, hits) if why]
                built = next((h for h in hits if self._not_built(h) is None), None)
                found = self._which(t.tool, t.paths)
                lacking = [n for n in t.needs if self.view.get(n) is None]
                ok = built is not None or (found is not None and not lacking)
                out.append(ToolVerdict(part=d.part, tool=t.tool, by=t.by, cite=t.cite,
                                       found="/" + found if found else "",
                                       built="/" + built if built else "",
                                       needed=built is None, ok=ok, lacking=lacking,
                                       would_build=", ".join(t.built) if t.built and
                                       built is None else ""))
                if not ok:
                    diffs.append(Difference(
                        part=d.part, path=f"PATH {self.image_path}",
                        check=f"run-time tool missing: {t.by} calls {t.tool} ({t.cite})",
                        lock=f"{' and '.join([t.tool, *t.needs])} in the image" + (
                            f", or one of {', '.join(t.built)} built" if t.built else ""),
                        image=(f"{t.tool} at /{found}, but not {', '.join(lacking)}"
                               if found else f"no {t.tool}") + "".join(
                            f"; {why}" for why in refused)))
        return out, diffs

    def _which(self, tool: str, paths: list[str]) -> str | None:
        dirs = [p.lstrip("/") for p in self.image_path.split(":") if p]
        candidates = [f"{d}/{tool}" for d in dirs] + [
            hit for p in paths for hit in self._glob(p)]
        for cand in candidates:
            path = self._resolve(cand)
            if path is not None:
                return path
        return None

    def _resolve(self, path: str, depth: int = 0) -> str | None:
        """The regular, executable file ``path`` leads to, following symlinks in the view."""
        path = posixpath.normpath(path).lstrip("/")
        parts = path.split("/")
        for i in range(1, len(parts)):  # a symlinked folder on the way (/bin -> usr/bin)
            head = "/".join(parts[:i])
            hit = self.view.visible.get(head)
            if hit is not None and hit[1].kind == "symlink" and depth < 16:
                link = hit[1].link
                base = link if link.startswith("/") else posixpath.join(
                    posixpath.dirname(head), link)
                return self._resolve(posixpath.join(base, *parts[i:]), depth + 1)
        hit = self.view.visible.get(path)
        if hit is None:
            return None
        entry = hit[1]
        if entry.kind == "symlink" and depth < 16:
            link = entry.link
            target = link if link.startswith("/") else posixpath.join(
                posixpath.dirname(path), link)
            return self._resolve(target, depth + 1)
        real = self.view.get(path)
        if real is not None and real.kind == "file" and real.mode & 0o111:
            return path
        return None

    def _dead(self) -> list[DeadCode]:
        dead: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
        for path, code in self.files:
            owner = self.owned.get(path, "unowned")
            row = dead[owner]
            lost = sum(n for kind, arch, n in code.sizes
                       if not _runs(arch, self.device, kind == "ptx"))
            row[0] += lost
            row[1] += sum(n for _, _, n in code.sizes)
            row[2] += 1 if lost and lost == sum(n for _, _, n in code.sizes) else 0
        return sorted((DeadCode(owner=o, bytes=b, device_bytes=t, files_all_dead=f)
                       for o, (b, t, f) in dead.items() if b),
                      key=lambda x: -x.bytes)

    def _first_start(self, decls: list[Declared], kernels: list[KernelVerdict],
                     tools: list[ToolVerdict]) -> FirstStart:
        jit = sorted({k.ref.removeprefix("flashinfer module ") for k in kernels
                      if k.ref.startswith("flashinfer module ") and not k.ok})
        builds = sorted({t.would_build for t in tools if t.would_build})
        triton = tilelang = 0
        for d in decls:
            for dist in d.facts.jit_sources:
                for path, entry in self._sources(dist):
                    data = self._read(path) if entry.size < (4 << 20) else None
                    if data:
                        triton += sum(data.count(m) for m in _TRITON)
                        tilelang += sum(data.count(m) for m in _TILELANG)
        ptx_only = sorted("/" + p for p, c in self.files
                          if runs(c, self.device) == "ptx")
        return FirstStart(flashinfer_jit=jit, tool_builds=builds, triton_kernels=triton,
                          tilelang_kernels=tilelang, ptx_only=ptx_only)

    def _sources(self, dist: str) -> list[tuple[str, Entry]]:
        """The .py files of a distribution, by its top-level package folder."""
        top = dist.replace("-", "_")
        return [(p, e) for p, e in self.view.under(f"{self.site}/{top}")
                if p.endswith(".py") and e.kind == "file"]


def _archs(code: CudaCode | None) -> str:
    if code is None:
        return "no GPU code"
    return f"SASS {' '.join(sorted(code.sass)) or '-'}, PTX {' '.join(sorted(code.ptx)) or '-'}"
