"""Run a derived part's program at lock time, offline and twice; keep its output by key.

What a run sees, so that two runs (and two machines) give the same bytes:

- a fresh temporary folder as its working directory, holding ``prog/`` (a copy of the
  program's tree), ``in/<name>`` (each input, verified by its hash), ``out/`` and ``tmp/``;
- argv ``prog/<main> --out out/<output> [--<param> <value>]... in/<input>...``;
- a clean environment: ``PATH=/usr/bin:/bin``, ``LC_ALL=C.UTF-8``, ``TZ=UTC``,
  ``HOME=TMPDIR=tmp``, ``SOURCE_DATE_EPOCH`` (the plan's, 1980-01-01) and
  ``PYTHONHASHSEED=0``; the interpreter that runs frank with ``-P -s -S -B`` (no site
  packages, no bytecode written, no script folder on the path);
- no network: a network namespace of its own (``unshare --net``, as root or through a user
  namespace) where one can be made, and always a Python-level guard (a PEP 578 audit hook
  installed before the program's first line): a socket, a write outside ``out/`` and
  ``tmp/``, a read outside the run's folder and the standard library, or a started program
  ends the run at once with a line naming what it tried. The guard catches mistakes; it is
  not a sandbox against a hostile program (ctypes gets past it), which the namespace is for
  the network.

The program runs twice, in two folders; outputs that differ fail naming the first differing
line. Anything wrong (no output, a write elsewhere, a network call, a non-zero exit, two
different outputs, an output that is not UTF-8 text) is one line naming the manifest and the
field, exit 2, and nothing is kept. A good output goes into the store (``BlobStore``) and an
index entry ``$FRANK_CACHE/derived/<key>.json`` records it; every run is appended to
``$FRANK_CACHE/derived/runs.jsonl`` (how a test tells a reuse from a run).
"""

from __future__ import annotations

import ast
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from frank.errors import FrankError
from frank.fsutil import write_atomic
from frank.hashing import (
    check_link_inside,
    sha256_bytes,
    sha256_file,
    sha256_json,
    tree_files,
)
from frank.model.kinds.derived import Derived
from frank.resolve.resolver import Resolved

SOURCE_DATE_EPOCH = 315532800  # the build plan's (1980-01-01), fixed on every machine
TIMEOUT_S = 600
VIOLATION = "frank-derive-refused:"
_VIOLATION_RC = 86
Mode = Literal["use", "check", "resolve", "upgrade"]

# Run by the interpreter before the program: install the guard, then run main as __main__.
# argv: GUARD_JSON MAIN ARGS...  (GUARD_JSON: the folders it may read and write)
GUARD = r'''
import json, os, sys
_cfg = json.loads(sys.argv[1])
_R = tuple(_cfg["read"]); _W = tuple(_cfg["write"]); _TAG = _cfg["tag"]
_NET = frozenset(("socket.connect", "socket.getaddrinfo", "socket.sendto", "socket.sendmsg",
    "socket.bind", "socket.gethostbyname", "socket.gethostbyaddr", "socket.getnameinfo",
    "urllib.Request"))
_RUN = frozenset(("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
    "os.fork", "os.forkpty", "ctypes.dlopen"))
_CHANGE = frozenset(("os.remove", "os.rename", "os.replace", "os.mkdir", "os.rmdir",
    "os.symlink", "os.link", "os.truncate", "os.chmod", "os.chown", "os.utime",
    "shutil.copyfile", "shutil.rmtree", "shutil.move"))
_WF = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
def _stop(what):
    os.write(2, (_TAG + " " + what.replace("\n", " ") + "\n").encode("utf-8", "replace"))
    os._exit(86)
def _inside(p, roots):
    p = os.path.realpath(os.fsdecode(p))
    return any(p == r or p.startswith(r + os.sep) for r in roots)
def _hook(event, args):
    if event in _NET:
        _stop("reaches the network: " + event + " " + repr(args[1:] if args else ())[:120])
    elif event in _RUN:
        _stop("starts a program: " + event + " " + repr(args[:1])[:120])
    elif event == "open":
        path, mode, flags = args
        if isinstance(path, int) or path is None:
            return
        writing = (flags or 0) & _WF if mode is None else any(c in str(mode) for c in "wax+")
        if writing and not _inside(path, _W):
            _stop("writes outside its output: " + os.fsdecode(path))
        if not writing and not _inside(path, _R) and not os.fsdecode(path).startswith("/dev/"):
            _stop("reads a file it did not declare: " + os.fsdecode(path))
    elif event in _CHANGE:
        for a in args[:2]:
            if isinstance(a, (str, bytes, os.PathLike)) and not _inside(a, _W):
                _stop("writes outside its output: " + event + " " + os.fsdecode(a))
sys.addaudithook(_hook)
sys.argv = sys.argv[2:]
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
import runpy
runpy.run_path(sys.argv[0], run_name="__main__")
'''


@dataclass(frozen=True)
class Output:
    """A derived part's output as the lock records it."""

    key: str
    sha256: str
    size: int

    def record(self) -> dict[str, Any]:
        return {"key": self.key, "sha256": self.sha256, "size": self.size}


def derivation_key(part: Derived, inputs: dict[str, str]) -> str:
    """The key a derived output is kept and found by."""
    return sha256_json(part.derivation(inputs))


def cache_root() -> Path:
    from frank.store.blobs import default_root

    return default_root()


def _index_path(key: str) -> Path:
    return cache_root() / "derived" / f"{key}.json"


def kept(key: str) -> Output | None:
    """The output kept for ``key``, if its index entry reads and its blob is there and
    still holds those bytes (checked by content: the store is not trusted)."""
    try:
        doc = json.loads(_index_path(key).read_text(encoding="utf-8"))
        out = Output(key=str(doc["key"]), sha256=str(doc["sha256"]), size=int(doc["size"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if out.key != key or output_bytes(out.sha256) is None:
        return None
    return out


def output_bytes(sha256: str) -> bytes | None:
    """The kept output of that sha256 from the store, checked by content, or None. Read
    directly (no ``BlobStore``, which makes folders): a read command that places a derived
    file (``frank diff`` plans both stacks) stays a pure read, so its answer can be kept."""
    import re

    if not re.fullmatch(r"[0-9a-f]{64}", sha256):
        return None
    try:
        data = (cache_root() / "blobs" / "sha256" / sha256).read_bytes()
    except OSError:
        return None
    return data if sha256_bytes(data) == sha256 else None


@functools.cache
def network_cut() -> tuple[str, ...]:
    """The ``unshare`` prefix that gives the program a network namespace of its own (as root,
    else through a user namespace), or ``()`` where none can be made (the audit-hook guard
    alone then keeps it off the network)."""
    exe = shutil.which("unshare")
    if exe is None:
        return ()
    tries: list[tuple[str, ...]] = [(exe, "--net", "--")] if os.geteuid() == 0 else []
    tries.append((exe, "--user", "--map-root-user", "--net", "--"))
    for prefix in tries:
        try:
            if subprocess.run([*prefix, "true"], capture_output=True, timeout=30,
                              check=False).returncode == 0:
                return prefix
        except (OSError, subprocess.SubprocessError):
            continue
    return ()


def check_stdlib_only(program: Path, manifest: Path, root: Path) -> None:
    """Refuse a program that imports anything but the standard library and its own modules
    (it runs without site-packages: the import would fail, or, worse, find something)."""
    files = [f for f in tree_files(program) if f.suffix == ".py"]
    own = {f.relative_to(program).parts[0].removesuffix(".py") for f in files}
    allowed = set(sys.stdlib_module_names) | own | {"__future__"}
    for file in files:
        try:
            tree = ast.parse(file.read_bytes(), filename=str(file))
        except SyntaxError as exc:
            raise FrankError(f"{file.relative_to(root)}: line {exc.lineno}: "
                             f"{exc.msg}", file=manifest, field="program") from None
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 \
                else []
            for name in names:
                top = name.split(".")[0]
                if top and top not in allowed:
                    raise FrankError(
                        f"{file.relative_to(root)} line "
                        f"{getattr(node, 'lineno', 0)} imports {name}, which is not in the "
                        "standard library: a derived part's "
                        "program runs on the standard library alone", file=manifest,
                        field="program")


def _argv(part: Derived) -> list[str]:
    args = [f"prog/{part.program.main}", "--out", f"out/{part.output}"]
    for name, value in sorted(part.params.items()):
        text = json.dumps(value) if isinstance(value, bool) else str(value)
        args += [f"--{name}", text]
    return args + [f"in/{i.file_name}" for i in part.inputs_]


def _stdlib_dirs() -> list[str]:
    import sysconfig

    paths = sysconfig.get_paths()
    dirs = {paths["stdlib"], paths["platstdlib"], *(p for p in sys.path if p.endswith(".zip"))}
    return sorted(os.path.realpath(d) for d in dirs)


def run_once(part: Derived, files: dict[str, Path], root: Path, manifest: Path,
             work: Path) -> bytes:
    """One run of the program in ``work`` (empty); returns the output's bytes."""
    program = root / part.program.path
    for file in tree_files(program):  # exactly the files its tree hash covers
        dest = work / "prog" / file.relative_to(program)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if file.is_symlink():
            check_link_inside(file, program)
            os.symlink(os.readlink(file), dest)
        else:
            shutil.copyfile(file, dest)
    (work / "in").mkdir()
    for item in part.inputs_:
        shutil.copyfile(files[item.label], work / "in" / item.file_name)
    for d in ("out", "tmp"):
        (work / d).mkdir()
    real = os.path.realpath(work)
    guard = json.dumps({"read": [real, *_stdlib_dirs()],
                        "write": [os.path.join(real, "out"), os.path.join(real, "tmp")],
                        "tag": VIOLATION})
    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8", "TZ": "UTC",
           "HOME": str(work / "tmp"), "TMPDIR": str(work / "tmp"),
           "SOURCE_DATE_EPOCH": str(SOURCE_DATE_EPOCH), "PYTHONHASHSEED": "0",
           "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUTF8": "1"}
    cmd = [*network_cut(), sys.executable, "-P", "-s", "-S", "-B", "-c", GUARD, guard,
           *_argv(part)]
    where = f"{part.program.path}/{part.program.main}"
    try:
        proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, timeout=TIMEOUT_S,
                              check=False, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise FrankError(f"{where} ran past {TIMEOUT_S} s", file=manifest,
                         field="program") from None
    err = proc.stderr.decode("utf-8", "replace")
    refused = next((ln for ln in err.splitlines() if ln.startswith(VIOLATION)), None)
    if refused is not None:
        raise FrankError(f"{where} {refused.removeprefix(VIOLATION).strip()}",
                         file=manifest, field="program")
    if proc.returncode != 0:
        said = _said(part, err, manifest)
        if said is not None:
            raise said
        tail = " | ".join(ln.strip() for ln in err.strip().splitlines()[-3:]) or "no output"
        raise FrankError(f"{where} exited {proc.returncode}: {tail[:400]}", file=manifest,
                         field="program")
    out = work / "out" / part.output
    made = sorted(p.relative_to(work).as_posix() for p in (work / "out").rglob("*"))
    if not out.is_file() or out.is_symlink():
        raise FrankError(f"{where} wrote nothing at out/{part.output}"
                         f"{' (it wrote ' + ', '.join(made) + ')' if made else ''}",
                         file=manifest, field="output")
    extra = [m for m in made if m != f"out/{part.output}"]
    if extra:
        raise FrankError(f"{where} wrote {extra[0]} besides its output out/{part.output}",
                         file=manifest, field="output")
    return out.read_bytes()


def _said(part: Derived, err: str, manifest: Path) -> FrankError | None:
    """The program's own one-line refusal, named as the user knows it: ``in/<name>:
    FIELD: why`` is about that input (its repo path or hub label), ``--<param>: why`` about
    the manifest's ``params.<param>``. None for anything else."""
    lines = err.strip().splitlines()
    if not lines:
        return None
    last = lines[-1].strip()
    for item in part.inputs_:
        prefix = f"in/{item.file_name}: "
        if last.startswith(prefix):
            rest = last.removeprefix(prefix)
            field, _, why = rest.partition(": ")
            return FrankError(why or field, file=item.label, field=field if why else None)
    if last.startswith("--"):
        option, _, why = last.partition(": ")
        name = option.removeprefix("--")
        if why and name in part.params:
            return FrankError(why, file=manifest, field=f"params.{name}")
    return None


def first_difference(a: bytes, b: bytes) -> str:
    """Where two outputs first differ: line number and both lines (cut short)."""
    at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
              min(len(a), len(b)))
    line = a[:at].count(b"\n") + 1
    start = a.rfind(b"\n", 0, at) + 1

    def excerpt(data: bytes) -> str:
        end = data.find(b"\n", at)
        text = data[start:end if end >= 0 else len(data)].decode("utf-8", "replace")
        col = at - start
        return repr(text[max(0, col - 30):col + 30])

    return (f"byte {at}, line {line}: first run {excerpt(a)}, second run {excerpt(b)} "
            f"({len(a)} and {len(b)} bytes)")


def _input_files(part: Derived, inputs: dict[str, str], root: Path) -> dict[str, Path]:
    """Each input's file: a repo file (hashed again as it is copied), a hub file from the
    store, a mirror or the hub, verified by its sha256."""
    out: dict[str, Path] = {}
    for item in part.inputs_:
        if item.path is not None:
            out[item.label] = root / item.path
            continue
        from frank.store.fetch import Fetcher, Pinned, mirror_dirs

        hub = item.hub
        assert hub is not None
        url = f"https://huggingface.co/{hub.repo_id}/resolve/{hub.revision}/{hub.filename}"
        out[item.label] = Fetcher(mirrors=mirror_dirs()).fetch(Pinned(url,
                                                                      inputs[item.label]))
    return out


def derive(part: Derived, inputs: dict[str, str], manifest: Path, root: Path) -> Output:
    """Run a derived part's program twice, compare, keep the output; return it. ``inputs``
    are the hashes the output is keyed by: the program's tree and every input file must
    still have them, before and after the runs."""
    from frank.hashing import sha256_tree
    from frank.store.blobs import BlobStore

    key = derivation_key(part, inputs)
    program = root / part.program.path
    tree = f"{part.program.path.rstrip('/')}/"
    if not program.is_dir() or sha256_tree(program) != inputs.get(tree):
        raise FrankError(f"{tree} is not the program the lock names (tree "
                         f"{str(inputs.get(tree))[:16]}...): run `frank lock`",
                         file=manifest, field="program.path")
    check_stdlib_only(program, manifest, root)
    files = _input_files(part, inputs, root)

    def unchanged(when: str) -> None:
        for label, path in files.items():
            if sha256_file(path) != inputs.get(label):
                raise FrankError(f"{label} does not have the sha256 the lock names "
                                 f"({str(inputs.get(label))[:16]}...) {when}", file=manifest,
                                 field="inputs")

    unchanged("(run `frank lock`)")
    store = BlobStore()
    outputs = []
    started = time.monotonic()
    for _ in range(2):
        with tempfile.TemporaryDirectory(dir=store.tmp_dir, prefix="derive-") as tmp:
            outputs.append(run_once(part, files, root, manifest, Path(tmp)))
    unchanged("after the program ran (it changed while it ran)")
    if outputs[0] != outputs[1]:
        raise FrankError(f"{part.program.path}/{part.program.main} gave two different "
                         f"outputs from the same inputs: {first_difference(*outputs)}",
                         file=manifest, field="output")
    data = outputs[0]
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FrankError(f"out/{part.output} is not UTF-8 text (byte {exc.start}): a derived "
                         "file travels in the build plan as text", file=manifest,
                         field="output") from None
    digest = store.put_bytes(data)
    out = Output(key=key, sha256=digest.split(":", 1)[1], size=len(data))
    write_atomic(_index_path(key), json.dumps(out.record(), sort_keys=True) + "\n")
    _log_run(part, key, out, time.monotonic() - started)
    return out


def _log_run(part: Derived, key: str, out: Output, seconds: float) -> None:
    """One line per derivation run (a single O_APPEND write: concurrent runs interleave
    whole lines)."""
    line = json.dumps({"part": part.name, "version": part.version, "key": key,
                       "sha256": out.sha256, "seconds": round(seconds, 3),
                       "time": int(time.time())}, sort_keys=True) + "\n"
    fd = os.open(cache_root() / "derived" / "runs.jsonl",
                 os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _recorded(lock: Any, name: str, key: str) -> Output | None:
    old = lock.part(name) if lock is not None else None
    rec = old.derived if old is not None else {}
    if rec.get("key") == key and "sha256" in rec and "size" in rec:
        return Output(key=key, sha256=str(rec["sha256"]), size=int(rec["size"]))
    return None


def derive_outputs(resolved: Resolved, previous: Any, siblings: Callable[[], list[Any]],
                   mode: Mode) -> dict[str, dict[str, Any]]:
    """Each derived part's output record, by part name.

    Found without running, in this order: the stack's own lock (same key), the other locks
    of the repo, the store's index (its blob checked by content). ``check`` looks in the
    locks only (offline, fast, never runs: a missing output makes the lock stale); ``use``
    (a read command) also in the store, else it is an error asking for `frank lock`;
    ``resolve`` and ``upgrade`` run the program when nothing holds it, and make sure the
    store holds the bytes the build will place (re-running and comparing to the lock when
    it does not, as on a fresh clone).
    """
    out: dict[str, dict[str, Any]] = {}
    for rp in resolved.parts:
        part = rp.manifest.part
        if not isinstance(part, Derived):
            continue
        key = derivation_key(part, rp.inputs)
        found = _recorded(previous, part.name, key)
        if found is None:
            found = next((o for lock in siblings() if (o := _recorded(lock, part.name, key))
                          is not None), None)
        if mode == "check":
            out[part.name] = (found.record() if found is not None else
                              {"key": key, "sha256": "not derived (run `frank lock`)",
                               "size": 0})
            continue
        if found is None or (mode != "use" and output_bytes(found.sha256) is None):
            from_store = kept(key)
            if from_store is not None and (found is None or from_store.sha256 == found.sha256):
                found = from_store
            elif mode == "use":
                raise FrankError(f"the output of {part.name} {part.version} is not derived "
                                 "yet (run `frank lock`)", file=rp.manifest.path,
                                 field="program")
            else:
                made = derive(part, rp.inputs, rp.manifest.path, resolved.root)
                if found is not None and made.sha256 != found.sha256:
                    raise FrankError(
                        f"the program made {made.sha256[:16]}... from the locked inputs, the "
                        f"lock records {found.sha256[:16]}...: the output is not reproducible "
                        "here", file=rp.manifest.path, field="output")
                found = made
        out[part.name] = found.record()
    return out


def placed_bytes(part: Derived, record: dict[str, Any], inputs: dict[str, str],
                 manifest: Path, root: Path) -> bytes:
    """The output a build places, as the lock records it: the kept bytes from the store,
    else (a fresh clone, another machine) made again by the pinned program from the locked
    inputs, offline, which must give the same sha256 (or the build stops, naming both)."""
    sha = str(record.get("sha256"))
    data = output_bytes(sha)
    if data is not None:
        return data
    made = derive(part, inputs, manifest, root)
    if made.sha256 != sha:
        raise FrankError(f"{part.program.path}/{part.program.main} made {made.sha256[:16]}... "
                         f"from the locked inputs here, the lock records {sha[:16]}...: the "
                         "output is not reproducible on this machine", file=manifest,
                         field="output")
    kept_now = output_bytes(sha)
    assert kept_now is not None
    return kept_now
