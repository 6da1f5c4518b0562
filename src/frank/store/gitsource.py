"""A git source at a full commit, checked out on the host and verified, for a builder stage.

Why on the host: the commit is the pin, and the host is where pins are fetched and checked
(the rule for every input). A container that clones would need git, the network and
GitHub; here the stage gets a plain tree. The clone is kept in frank's cache by repo URL
(``git/<sha256 of the URL>``), so a second build fetches only what is new; submodules come
at the commits the source records. The tree copied into the stage holds no ``.git``.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from frank.errors import FrankError
from frank.model.sources import check_inside, local_path
from frank.store.flock import held


def _git(args: list[str], *, cwd: Path | None, log: Path, what: str,
         local: bool = False) -> str:
    env = {k: v for k, v in os.environ.items() if k not in _GIT_ENV_DROP}
    env.update({"GIT_TERMINAL_PROMPT": "0", "GIT_NO_REPLACE_OBJECTS": "1"})
    if local:  # a repo inside this one (checked): its local submodules may be read too
        env.update({"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "protocol.file.allow",
                    "GIT_CONFIG_VALUE_0": "always"})
    proc = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          check=False)
    with log.open("a", encoding="utf-8") as out:
        out.write(f"$ git {' '.join(args)}\n{proc.stdout}{proc.stderr}")
    if proc.returncode != 0:
        why = [x.strip() for x in proc.stderr.splitlines() if x.strip()][-2:]
        raise FrankError(f"{what} failed: {' | '.join(why) or f'exit {proc.returncode}'} "
                         f"(log {log})")
    return proc.stdout.strip()


_GIT_ENV_DROP = ("GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_OBJECT_DIRECTORY", "GIT_DIR",
                 "GIT_REPLACE_REF_BASE", "GIT_WORK_TREE", "GIT_INDEX_FILE")


def _has_commit(mirror: Path, commit: str) -> bool:
    env = {k: v for k, v in os.environ.items() if k not in _GIT_ENV_DROP}
    env["GIT_NO_REPLACE_OBJECTS"] = "1"
    return subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=mirror,
                          env=env, capture_output=True, check=False).returncode == 0


def _foreign_objects(mirror: Path) -> bool:
    """Whether the cached clone reads objects from elsewhere (frank never writes these)."""
    info = mirror / "objects" / "info"
    return any((info / n).exists() for n in ("alternates", "http-alternates")) or \
        ((mirror / "refs" / "replace").is_dir() and any((mirror / "refs" / "replace").iterdir()))


def _move_aside(mirror: Path) -> None:
    bad = mirror.parent / "quarantine"
    bad.mkdir(exist_ok=True)
    os.replace(mirror, Path(tempfile.mkdtemp(prefix=mirror.name + "-", dir=bad)) / "git")


def _verified_fetch(mirror: Path, commit: str, src: Path, log: Path) -> None:
    """Fetch ``commit`` alone (depth 1) from the cached clone into ``src`` through git's
    pack protocol: the receiving side names every object by hashing it and fscks it, so
    an object in the cache whose bytes are not its name never reaches the checkout."""
    _git(["init", "-q", str(src)], cwd=None, log=log, what="git init")
    _git(["-c", "transfer.fsckObjects=true", "fetch", "-q", "--no-tags", "--depth", "1",
          "--upload-pack", "git -c uploadpack.allowAnySHA1InWant=true upload-pack",
          f"file://{mirror}", commit], cwd=src, log=log,
         what=f"reading commit {commit} from frank's cache")


def _mirror(repo: str, commit: str, *, root: Path, cache: Path, log: Path) -> Path:
    """frank's cached clone of ``repo`` (branches and tags under ``refs/frank/``), holding
    ``commit``; a local remote must be inside ``root``."""
    check_inside(repo, root)
    local = local_path(repo) is not None
    log.parent.mkdir(parents=True, exist_ok=True)
    mirror = cache / "git" / hashlib.sha256(repo.encode()).hexdigest()[:32]
    mirror.parent.mkdir(parents=True, exist_ok=True)
    with held(mirror.with_suffix(".lock")):
        if (mirror / "HEAD").is_file() and _foreign_objects(mirror):
            _move_aside(mirror)
        if not (mirror / "HEAD").is_file():
            tmp = Path(tempfile.mkdtemp(prefix=".clone-", dir=mirror.parent))
            _git(["init", "--bare", "-q", str(tmp)], cwd=None, log=log, what="git init")
            tmp.rename(mirror)
        if not _has_commit(mirror, commit):
            _git(["fetch", "-q", "--no-tags", repo, "+refs/heads/*:refs/frank/heads/*",
                  "+refs/tags/*:refs/frank/tags/*"], cwd=mirror, log=log,
                 what=f"fetching {repo}", local=local)
            if not _has_commit(mirror, commit):
                _git(["fetch", "-q", "--no-tags", repo, commit], cwd=mirror, log=log,
                     what=f"fetching commit {commit} of {repo}", local=local)
    return mirror


def checkout(repo: str, commit: str, submodules: bool, dest: Path, *, root: Path,
             cache: Path, log: Path) -> None:
    """Place the tree of ``repo`` at ``commit`` (and its submodules) at ``dest``, which must
    not exist yet; the commit checked out is verified to be the pinned one. A local remote,
    and every local submodule remote, must be inside ``root``."""
    mirror = _mirror(repo, commit, root=root, cache=cache, log=log)
    local = local_path(repo) is not None
    work = Path(tempfile.mkdtemp(prefix=".checkout-", dir=mirror.parent))
    try:
        src = work / "src"
        try:
            _verified_fetch(mirror, commit, src, log)
        except FrankError:  # the cache's objects are not what they are named: fetch anew
            with held(mirror.with_suffix(".lock")):
                _move_aside(mirror)
            shutil.rmtree(src, ignore_errors=True)
            return checkout(repo, commit, submodules, dest, root=root, cache=cache, log=log)
        _git(["checkout", "-q", "--detach", commit], cwd=src, log=log,
             what=f"checking out {commit}")
        if _git(["rev-parse", "HEAD"], cwd=src, log=log, what="git rev-parse") != commit:
            raise FrankError(f"{repo}: the checkout is not at the pinned commit {commit}")
        if submodules:
            # the source's own .gitmodules URLs are relative to the repo, not to the cache
            _git(["config", "remote.origin.url", repo], cwd=src, log=log, what="git config")
            _submodules(src, repo, root, log, local)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src, dest, symlinks=True,
                        ignore=lambda _d, names: [n for n in names if n == ".git"])
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _submodules(src: Path, repo: str, root: Path, log: Path, local: bool) -> None:
    """Check out the submodules at the commits the source records, level by level, each
    local remote checked to be inside the repo before git reads it."""
    _git(["submodule", "init", "-q"], cwd=src, log=log, what="git submodule init")
    urls = subprocess.run(["git", "config", "--get-regexp", r"^submodule\..*\.url$"],
                          cwd=src, capture_output=True, text=True, check=False).stdout
    for line in urls.splitlines():
        check_inside(line.split(maxsplit=1)[1], root)
    _git(["submodule", "update", "-q"], cwd=src, log=log,
         what=f"submodules of {repo}", local=local)
    listed = _git(["submodule", "status"], cwd=src, log=log, what="git submodule status")
    for line in listed.splitlines():
        path = line[1:].split()[1]
        _submodules(src / path, repo, root, log, local)


# setuptools-scm's default tag_regex: an optional ``name-`` prefix and ``v``, then the version
_TAG_VERSION = re.compile(r"^(?:[\w-]+-)?[vV]?(?P<version>\d+(?:\.\d+){0,2}[^+]*)(?:\+.*)?$")


def scm_version(repo: str, commit: str, *, root: Path, cache: Path, log: Path) -> str:
    """The version setuptools-scm gives a clean git checkout of ``commit`` with its default
    schemes (guess-next-dev, node-and-date): the tag's version at a tag, else the next
    version's ``.devN+g<hash>`` (N commits since the nearest version tag; ``0.1.devN`` with
    none). A builder stage's source has no ``.git`` (frank checks it out on the host), so
    the build is told this version instead of guessing one.

    Read from the commit's history and tags fetched out of frank's cached clone into a
    throwaway repo through git's pack protocol (objects named by hashing them, fscked)."""
    from packaging.version import InvalidVersion, Version

    mirror = _mirror(repo, commit, root=root, cache=cache, log=log)
    work = Path(tempfile.mkdtemp(prefix=".describe-", dir=mirror.parent))
    try:
        _git(["init", "-q", "--bare", str(work / "r")], cwd=None, log=log, what="git init")
        _git(["-c", "transfer.fsckObjects=true", "fetch", "-q", "--no-tags", "--upload-pack",
              "git -c uploadpack.allowAnySHA1InWant=true upload-pack", f"file://{mirror}",
              "+refs/frank/tags/*:refs/tags/*", commit], cwd=work / "r", log=log,
             what=f"reading the history of {commit} from frank's cache")
        where = work / "r"
        node = "g" + _git(["rev-parse", "--short", commit], cwd=where, log=log,
                          what="git rev-parse")
        tags = _git(["tag", "--merged", commit], cwd=where, log=log, what="git tag")
        usable = [t for t in tags.split() if _TAG_VERSION.match(t)]
        if not usable:
            count = _git(["rev-list", "--count", commit], cwd=where, log=log,
                         what="git rev-list")
            return str(Version(f"0.1.dev{count}+{node}"))
        said = _git(["describe", "--tags", "--long", *(f"--match={t}" for t in usable),
                     commit], cwd=where, log=log, what="git describe")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    tag, distance, _ = said.rsplit("-", 2)
    m = _TAG_VERSION.match(tag)
    assert m is not None
    try:
        version = str(Version(m.group("version")))
    except InvalidVersion:
        raise FrankError(f"{repo}: tag {tag} nearest {commit} is not a version") from None
    if distance == "0":
        return version
    return str(Version(f"{_next_version(version)}.dev{distance}+{node}"))


def _next_version(version: str) -> str:
    """setuptools-scm's guess of the version after ``version``: a dev release's own
    release, else the last number incremented (1.2.3 -> 1.2.4, 1.0rc1 -> 1.0rc2)."""
    if ".dev" in version:
        return version.split(".dev")[0]
    m = re.match(r"^(.*?)(\d+)$", version)
    return f"{m.group(1)}{int(m.group(2)) + 1}" if m else f"{version}.1"
