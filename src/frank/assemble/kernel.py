"""Compile a kernel part on the host with its pinned toolchain, offline, cached by content.

nvcc comes from NVIDIA's wheels pinned in the manifest (``toolchain``), fetched through
``frank.store.fetch`` and unpacked once per set of hashes (``$FRANK_CACHE/toolchains/<key>``).
The part's ``build`` command runs on a copy of its source tree with ``$NVCC``,
``$CUOBJDUMP``, ``$CUDA_ARCHS`` and ``$PATH`` set and no network, and the built tree is
kept at ``$FRANK_CACHE/kernels/<key>``; the key hashes the source tree, the toolchain's
wheels, the archs, the build command and the host C++ compiler's version line (nvcc calls
the host's g++, which no wheel provides, so it cannot be pinned: a different one gives a
different key rather than a silently different library).

Two builds give byte-identical libraries because the build always sees the same paths:
nvcc writes them into what it makes (cudafe++ names anonymous namespaces after the source
file's path, the fatbin records nvlink's ``-L <toolchain>`` line). So in a private mount
and network namespace (``unshare``, as root or through a user namespace) a tmpfs is
mounted on BUILD_ROOT with the source copy bound at ``src`` and the toolchain, read-only,
at ``toolchain``. Where no such namespace can be made the build runs at its real paths
with the network reachable; the key records that, and the library is then identical only
between builds in the same cache.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from frank.errors import FrankError
from frank.hashing import sha256_json, sha256_tree, tree_files
from frank.model.kinds.kernel import Kernel
from frank.store.fetch import Fetcher, Pinned

BUILD_ROOT = Path("/tmp/frank-kernel-build")  # the fixed path every isolated build sees
LAYOUT = "frank-kernelbuild/1"  # bump when the unpacked layout or the build env changes
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
HOST_CXX = "g++"
BUILD_TIMEOUT_S = 3600
_WHY = re.compile(r"\berror\b|\bfatal\b|cannot find|undefined reference|no sm_", re.IGNORECASE)
_MOUNT_SCRIPT = """set -e
root="$1"
mount -t tmpfs -o mode=0755 frank-kernel-build "$root"
mkdir "$root/src" "$root/toolchain" "$root/tmp"
mount --bind "$2" "$root/src"
mount --bind "$3" "$root/toolchain"
mount -o remount,bind,ro "$root/toolchain"
cd "$root/src"
exec bash -c "$4"
"""


def compile_kernel(kernel: Kernel, root: Path, manifest: Path,
                   fetcher: Fetcher | None = None) -> Path:
    """The built tree of ``kernel`` (its source copy after ``build`` ran), from the cache
    when the same inputs were built before; a failed build is a FrankError quoting why."""
    if kernel.source is None:
        raise FrankError("a kernel without source cannot be built", file=manifest,
                         field="source")
    if not kernel.toolchain:
        raise FrankError("no toolchain wheels pinned (nvidia-cuda-nvcc and what it needs)",
                         file=manifest, field="toolchain")
    fetcher = fetcher or Fetcher()
    src = root / kernel.source
    if not src.is_dir():
        raise FrankError(f"{kernel.source!r} is not a directory", file=manifest,
                         field="source")
    prefix = isolation()
    key = sha256_json({
        "layout": LAYOUT, "source": sha256_tree(src),
        "toolchain": [w.sha256 for w in kernel.toolchain], "archs": kernel.nvcc_archs(),
        "build": kernel.build, "host_cxx": host_compiler(), "isolated": prefix is not None,
    })
    kernels = fetcher.store.root / "kernels"
    built = kernels / key
    if built.is_dir():
        return built
    toolchain = unpack_toolchain(kernel, manifest, fetcher)
    env = _build_env(kernel, toolchain, manifest, isolated=prefix is not None)
    kernels.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=kernels))
    try:
        copy = work / "src"
        _copy_tree(src, copy)
        (work / "tmp").mkdir()
        log = kernels / f"{key}.log"
        if prefix is None:
            env["TMPDIR"] = env["HOME"] = str(work / "tmp")
        rc = _run_build(kernel.build, copy, toolchain, env, prefix, log)
        if rc != 0:
            raise FrankError(f"kernel build failed (exit {rc}): {_why(log, kernel, copy)}; "
                             f"full log: {log}", file=manifest, field="build")
        try:
            copy.rename(built)
        except OSError:
            if not built.is_dir():  # not a concurrent build of the same key: a real error
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return built


@functools.cache
def isolation() -> tuple[str, ...] | None:
    """The ``unshare`` prefix that gives a build its own mount table and no network (as
    root, else through a user namespace), or None where neither can be made here."""
    exe = shutil.which("unshare")
    if exe is None:
        return None
    BUILD_ROOT.mkdir(parents=True, exist_ok=True)
    tries: list[tuple[str, ...]] = [(exe, "--net", "--mount")] if os.geteuid() == 0 else []
    tries.append((exe, "--user", "--map-root-user", "--net", "--mount"))
    for prefix in tries:
        try:
            probe = subprocess.run([*prefix, "mount", "-t", "tmpfs", "probe", str(BUILD_ROOT)],
                                   capture_output=True, timeout=30, check=False)
        except (OSError, subprocess.SubprocessError):
            continue
        if probe.returncode == 0:
            return prefix
    return None


def host_compiler() -> str:
    """The first line of the host C++ compiler's ``--version``: part of the key, since nvcc
    compiles host code with it and no wheel pins it."""
    exe = shutil.which(HOST_CXX, path=SYSTEM_PATH)
    if exe is None:
        raise FrankError(f"nvcc needs a host C++ compiler: no {HOST_CXX} on {SYSTEM_PATH}")
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=False)
    lines = out.stdout.splitlines()
    if out.returncode != 0 or not lines:
        raise FrankError(f"{exe} --version failed: {out.stderr.strip()[:200]}")
    return lines[0].strip()


def unpack_toolchain(kernel: Kernel, manifest: Path, fetcher: Fetcher) -> Path:
    """The toolchain's wheels fetched (verified) and unpacked once per set of hashes."""
    wheels = kernel.toolchain or []
    key = sha256_json({"layout": LAYOUT, "wheels": [w.sha256 for w in wheels]})
    dest = fetcher.store.root / "toolchains" / key
    if dest.is_dir():
        return dest
    return unpack_wheels(fetcher, [(str(w.url), Pinned(str(w.url), w.sha256)) for w in wheels],
                         dest, manifest)


def unpack_wheels(fetcher: Fetcher, pins: list[tuple[str, Pinned]], dest: Path, manifest: Path,
                  finish: Callable[[Path], None] | None = None) -> Path:
    """Each wheel fetched (verified) and unpacked into ``dest``, made whole in a temp folder
    and renamed into place (a concurrent unpack of the same set wins or loses whole):
    ``lib64`` links beside the NVIDIA wheels' ``lib``, then ``finish(tmp)`` if given.
    ``pins`` are (label for errors, pin); a failed fetch names ``manifest``'s toolchain."""
    try:
        got = fetcher.fetch_all([pin for _, pin in pins])
    except FrankError as exc:
        raise FrankError(exc.message, file=manifest, field="toolchain") from None
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=dest.parent))
    try:
        for label, pin in pins:
            _unzip(got[pin.sha256], tmp, label, manifest)
        link_lib64(tmp)
        if finish is not None:
            finish(tmp)
        try:
            tmp.rename(dest)
        except OSError:
            if not dest.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def link_lib64(root: Path) -> None:
    """``nvidia/*/lib64 -> lib``: nvcc.profile links from lib64 (the toolkit's layout); the
    wheels ship lib."""
    for lib in root.glob("nvidia/*/lib"):
        if not (lib.parent / "lib64").exists():
            (lib.parent / "lib64").symlink_to("lib")


def _unzip(wheel: Path, dest: Path, label: str, manifest: Path) -> None:
    """Extract a wheel keeping its executable bits; a member that would leave ``dest`` or
    is a link is refused."""
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            parts = Path(info.filename).parts
            mode = info.external_attr >> 16
            if (info.filename.startswith("/") or ".." in parts
                    or stat.S_ISLNK(mode)):
                raise FrankError(f"{label}: unsafe member {info.filename!r}", file=manifest,
                                 field="toolchain")
            target = dest.joinpath(*parts)
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, target.open("wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
            target.chmod(0o755 if mode & 0o111 else 0o644)


def _tool(toolchain: Path, name: str) -> Path | None:
    found = sorted(toolchain.glob(f"nvidia/*/bin/{name}"))
    return found[0].relative_to(toolchain) if found else None


def _copy_tree(src: Path, dest: Path) -> None:
    """The files that are the source's content (what its hash covers), modes kept."""
    for path in tree_files(src):
        target = dest / path.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        target.chmod(0o755 if path.stat().st_mode & 0o111 else 0o644)


def _build_env(kernel: Kernel, toolchain: Path, manifest: Path, *,
               isolated: bool) -> dict[str, str]:
    """The build's whole environment: the toolchain's tools, the archs, fixed temp and home
    folders (the host's environment does not leak in: it is not part of the key)."""
    nvcc = _tool(toolchain, "nvcc")
    if nvcc is None:
        raise FrankError("the toolchain wheels hold no nvcc (pin nvidia-cuda-nvcc)",
                         file=manifest, field="toolchain")
    base = BUILD_ROOT / "toolchain" if isolated else toolchain
    env = {
        "PATH": f"{(base / nvcc).parent}:{SYSTEM_PATH}",
        "NVCC": str(base / nvcc),
        "CUDA_ARCHS": kernel.nvcc_archs(),
        "TMPDIR": str(BUILD_ROOT / "tmp"),
        "HOME": str(BUILD_ROOT / "tmp"),
        "LC_ALL": "C", "TZ": "UTC", "SOURCE_DATE_EPOCH": "0",
    }
    cuobjdump = _tool(toolchain, "cuobjdump")
    if cuobjdump is not None:
        env["CUOBJDUMP"] = str(base / cuobjdump)
    return env


def _run_build(build: str, copy: Path, toolchain: Path, env: dict[str, str],
               prefix: tuple[str, ...] | None, log: Path) -> int:
    """Run ``build`` on ``copy``, in the namespace when there is one; its output goes to
    ``log``; the exit status."""
    if prefix is not None:
        argv = [*prefix, "bash", "-c", _MOUNT_SCRIPT, "frank-kernel-build", str(BUILD_ROOT),
                str(copy), str(toolchain), build]
        cwd = None
    else:
        argv = ["bash", "-c", build]
        cwd = copy
    fd, tmp_log = tempfile.mkstemp(prefix=f".{log.name}.", dir=log.parent)
    try:
        with os.fdopen(fd, "w") as out:
            if prefix is None:
                out.write("frank: no mount/network namespace here (unshare): built at its "
                          "real path, network reachable\n")
            out.flush()
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                    cwd=cwd, start_new_session=True)
            try:
                rc = proc.wait(timeout=BUILD_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                _kill(proc)
                out.write(f"frank: error: build timed out after {BUILD_TIMEOUT_S} s\n")
                rc = 124
            except BaseException:  # ^C: the whole build goes, not just its bash
                _kill(proc)
                raise
        os.chmod(tmp_log, 0o644)
        os.replace(tmp_log, log)
    except BaseException:
        Path(tmp_log).unlink(missing_ok=True)
        raise
    return rc


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _why(log: Path, kernel: Kernel, copy: Path) -> str:
    """The log lines that say why (compiler ``error`` lines), paths as in the repo."""
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    picked = list(dict.fromkeys(ln for ln in lines if _WHY.search(ln)))[:3] or lines[-2:]
    src = f"{kernel.source}/"
    return " | ".join(ln.replace(f"{BUILD_ROOT}/src/", src).replace(f"{copy}/", src)
                      for ln in picked) or "no output"
