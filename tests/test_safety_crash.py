"""Crash safety and races (issue 35 items 6-9): kill -9 at every rename, N commands at once.

Commands run in forked children (the CLI, as a user runs it, without the interpreter's
start-up each time) whose ``os.replace``/``os.rename`` (and the output swap's exchange)
count calls and SIGKILL the child at the Nth, for N = 1 .. all the renames the command
makes. After each kill every file must be old or new, the next command must finish or roll
back what was started, and nothing may be lost. The counts are printed (``-s`` shows them)
and kept small enough for CI (well under two minutes in all).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import frank.cli.compose
import frank.cli.lock
import frank.cli.revert
import frank.history.undo
from frank.cli import cli
from frank.errors import FrankError
from frank.image import outdir
from tests.spine_helpers import copy_repo, frank

COUNTS: dict[str, int] = {}


def _count(name: str, n: int = 1) -> None:
    COUNTS[name] = COUNTS.get(name, 0) + n


@pytest.fixture(scope="module", autouse=True)
def _report() -> Any:
    yield
    print(f"\nsafety harness: {json.dumps(COUNTS, sort_keys=True)}")


def _child(args: list[str], cwd: Path, kill_at: int, gate: int | None, report: int) -> None:
    code = 70
    try:
        os.chdir(cwd)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        if gate is not None:
            os.read(gate, 1)  # wait until every racer is ready
        seen = 0

        def counting(real: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(*a: Any, **k: Any) -> Any:
                nonlocal seen
                seen += 1
                if seen == kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)
                return real(*a, **k)
            return wrapper

        os.replace = counting(os.replace)  # type: ignore[assignment]
        os.rename = counting(os.rename)  # type: ignore[assignment]
        outdir._exchange = counting(outdir._exchange)  # type: ignore[assignment]
        try:
            cli.main(args, prog_name="frank", standalone_mode=True)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        os.write(report, str(seen).encode())
    except BaseException:
        import traceback

        Path(os.environ.get("FRANK_SAFETY_TRACE", os.devnull)).write_text(traceback.format_exc())
    finally:
        os._exit(code)


def start(args: list[str], cwd: Path, *, kill_at: int = 0,
          gate: int | None = None) -> tuple[int, int]:
    """Fork a child running ``frank ARGS``; (pid, fd its rename count comes back on)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        _child(args, cwd, kill_at, gate, w)
    os.close(w)
    return pid, r


def wait(pid: int, fd: int) -> tuple[int, int]:
    """(exit code, or -9 when killed; renames the child made)."""
    _, status = os.waitpid(pid, 0)
    data = os.read(fd, 64)
    os.close(fd)
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    return code, int(data or 0)


def run(args: list[str], cwd: Path, *, kill_at: int = 0) -> tuple[int, int]:
    return wait(*start(args, cwd, kill_at=kill_at))


def tree(root: Path, sub: str) -> dict[str, bytes]:
    """Files under root/sub (dot-names included), history lines without their time."""
    out = {}
    for p in sorted((root / sub).rglob("*")):
        if p.is_file() and p.name != ".frank.lock":
            data = p.read_bytes()
            if p.name.endswith(".history.jsonl"):
                lines = [json.loads(x) for x in data.decode().splitlines()]
                data = json.dumps([{k: v for k, v in x.items() if k != "time"}
                                   for x in lines]).encode()
            out[p.relative_to(root).as_posix()] = data
    return out


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_repo(tmp_path_factory.mktemp("template") / "repo")


def fresh(template: Path, dest: Path) -> Path:
    shutil.copytree(template, dest, symlinks=True)
    return dest


# -- item 7: revert, undo and lock at every kill point, and at once ---------------------------

REVERT = ["revert", "cpu-experts-sched", "--stack", "stacks/served.toml", "--why", "t"]


def test_revert_killed_at_every_rename_lands_whole_once(template: Path, tmp_path: Path) -> None:
    """served's revert writes served.toml, served.lock, the history and candidate.lock
    (candidate extends served); a kill anywhere leaves each old or new, and the next
    command lands all of it or none, so a second revert never takes a second step."""
    ref = fresh(template, tmp_path / "ref")
    old = tree(ref, "stacks")
    code, renames = run(REVERT, ref)
    assert code == 0 and renames >= 4
    new = tree(ref, "stacks")
    assert new != old and "stacks/served.history.jsonl" in new
    for n in range(1, renames + 1):
        repo = fresh(template, tmp_path / f"k{n}")
        code, _ = run(REVERT, repo, kill_at=n)
        assert code == -signal.SIGKILL
        _count("revert kills")
        now = tree(repo, "stacks")
        for name in ("stacks/served.toml", "stacks/served.lock", "stacks/candidate.lock"):
            assert now[name] in (old[name], new[name]), f"kill {n}: {name} is neither"
        run(["lock", "--check"], repo)  # the next command, whatever it is, recovers
        after = tree(repo, "stacks")
        _count("kill losses", int(after not in (old, new)))
        assert after in (old, new), f"kill {n}: after recovery {sorted(set(after) ^ set(new))}"
        again, _ = run(REVERT, repo)
        assert again == (2 if after == new else 0), f"kill {n}: the revert took two steps"


def test_undo_killed_at_every_rename_lands_whole_once(template: Path, tmp_path: Path) -> None:
    undo = ["revert", "--undo", "--stack", "stacks/served.toml"]
    ref = fresh(template, tmp_path / "ref")
    assert run(REVERT, ref)[0] == 0
    base = tree(ref, "stacks")
    shutil.copytree(ref, tmp_path / "reverted", symlinks=True)
    code, renames = run(undo, ref)
    assert code == 0
    new = tree(ref, "stacks")
    assert new["stacks/served.toml"] == (template / "stacks/served.toml").read_bytes()
    for n in range(1, renames + 1):
        repo = tmp_path / f"k{n}"
        shutil.copytree(tmp_path / "reverted", repo, symlinks=True)
        assert run(undo, repo, kill_at=n)[0] == -signal.SIGKILL
        _count("undo kills")
        run(["lock", "--check"], repo)
        _count("kill losses", int(tree(repo, "stacks") not in (base, new)))
        assert tree(repo, "stacks") in (base, new), f"kill {n}"


def test_concurrent_reverts_lose_none(template: Path, tmp_path: Path) -> None:
    """Four reverts of four parts of one stack at once, plus a `frank lock`: every one
    lands, the history has each once, and the locks match the final stack."""
    parts = ["cpu-experts-sched", "region-cache", "exl3-pack", "expert-plan"]
    for trial in range(4):
        repo = fresh(template, tmp_path / f"t{trial}")
        r, w = os.pipe()
        procs = [start(["revert", p, "--stack", "stacks/served.toml"], repo, gate=r)
                 for p in parts]
        procs.append(start(["lock", "stacks/served.toml", "stacks/candidate.toml"], repo,
                           gate=r))
        os.close(r)
        os.write(w, b"x" * len(procs))
        os.close(w)
        codes = [wait(*p)[0] for p in procs]
        _count("concurrent trials")
        _count("concurrent commands", len(procs))
        assert codes == [0] * len(procs)
        text = (repo / "stacks/served.toml").read_text()
        lost = [p for p in parts[:3] if f"{p} =" in text]
        lost += [] if 'expert-plan = "published"' in text else ["expert-plan"]
        _count("concurrent losses", len(lost))
        assert not lost, f"trial {trial}: reverts lost: {lost}"
        hist = (repo / "stacks/served.history.jsonl").read_text().splitlines()
        assert sorted(json.loads(x)["part"] for x in hist) == sorted(parts)
        ref = fresh(template, tmp_path / f"ref{trial}")
        (ref / "stacks/served.toml").write_text(text)
        assert run(["lock", "stacks/served.toml", "stacks/candidate.toml"], ref)[0] == 0
        for name in ("served.lock", "candidate.lock"):  # each lock is of the final stack
            got, want = (json.loads((r / "stacks" / name).read_text()) for r in (repo, ref))
            assert [(p["name"], p["version"], p["key"]) for p in got["parts"]] == \
                [(p["name"], p["version"], p["key"]) for p in want["parts"]]


def test_undo_restores_the_text_and_refuses_what_it_cannot(repo: Path) -> None:
    served = (repo / "stacks/served.toml").read_text()
    assert frank("revert", "cpu-experts-sched", cwd=repo).code == 0
    assert frank("revert", "region-cache", cwd=repo).code == 0
    one = frank("revert", "--undo", cwd=repo)
    assert one.code == 0 and "region-cache is back (undoing its revert)" in one.out
    assert "region-cache" in (repo / "stacks/served.toml").read_text()
    assert frank("revert", "--undo", cwd=repo).code == 0
    assert (repo / "stacks/served.toml").read_text() == served
    none = frank("revert", "--undo", cwd=repo)
    assert none.code == 2 and none.err.count("\n") == 1 and "nothing to undo" in none.err
    assert frank("revert", "region-cache", cwd=repo).code == 0
    (repo / "stacks/served.toml").write_text(
        (repo / "stacks/served.toml").read_text().replace('max-num-seqs = 1', 'max-num-seqs = 2'))
    moved = frank("revert", "--undo", cwd=repo)
    assert moved.code == 2 and "the stack changed since the revert" in moved.err
    both = frank("revert", "rs8", "--undo", cwd=repo)
    assert both.code == 2 and both.err.count("\n") == 1


# -- item 9: leftovers of a kill are never stacks, and go away --------------------------------

def test_leftover_temp_files_are_ignored_and_removed(repo: Path) -> None:
    stacks = repo / "stacks"
    leftovers = [stacks / ".served.revert.toml", stacks / ".served.lock.k2j3.tmp",
                 stacks / "served.frank-tmp-revert-abc.toml", stacks / ".served.adopt.toml"]
    for p in leftovers:
        p.write_text("garbage = [")
    (repo / "parts/rs8/.1.toml.txn-0123.tmp").write_text("x")
    folder = stacks / ".served.frank-tmp-revert-k2j3"  # a killed revert's closure copy
    folder.mkdir()
    (folder / "pylock.served.toml").write_text("x")
    leftovers.append(folder)
    result = frank("lock", "--check", cwd=repo)
    assert "garbage" not in result.err and "revert" not in result.err, result.err
    assert not [p for p in leftovers if p.exists()]
    assert not (repo / "parts/rs8/.1.toml.txn-0123.tmp").exists()
    assert "revert" not in frank("check", cwd=repo).err


def test_compose_clears_what_killed_composes_left(repo: Path) -> None:
    out = repo / "out"
    args = ("compose", "stacks/smoke-cpu.toml", "--builder", "none")
    assert frank(*args, cwd=repo).code == 0
    for name in (".smoke-cpu.k2j3l4m5", ".smoke-cpu.stage-dead", ".smoke-cpu.tmp-dead",
                 ".smoke-cpu.old"):
        (out / name / "x").mkdir(parents=True)
    (out / ".smoke-cpu.x.stage-other").mkdir()  # another stack's ("smoke-cpu.x") stays
    assert frank(*args, cwd=repo).code == 0
    assert sorted(p.name for p in out.iterdir()) == [".smoke-cpu.lock", ".smoke-cpu.x.stage-other",
                                                     "smoke-cpu"]


_HOLD = """
import sys, time
from pathlib import Path
from frank.store.blobs import BlobStore
BlobStore(Path(sys.argv[1]))
print("ready", flush=True)
time.sleep(60)
"""


def test_cache_temp_files_are_removed_once_nobody_uses_the_cache(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    open_store = [sys.executable, "-c", "import sys; from pathlib import Path; "
                  "from frank.store.blobs import BlobStore; BlobStore(Path(sys.argv[1]))",
                  str(cache)]
    subprocess.run(open_store, check=True)
    stale = [cache / "tmp" / ".blob-abc", cache / "tmp" / "stage-xyz"]
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(cache)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        stale[0].write_text("half a blob")  # as a build in the holder would have them
        stale[1].mkdir()
        subprocess.run(open_store, check=True)
        assert all(p.exists() for p in stale), "a cache in use keeps its temp files"
    finally:
        holder.kill()
        holder.wait()
    subprocess.run(open_store, check=True)
    assert not [p for p in stale if p.exists()]
    _count("cache cleanups")


# -- item 6: compose keeps the old output whole until the new one is ---------------------------

def _changed_stack(repo: Path) -> None:
    stack = repo / "stacks/smoke-cpu.toml"
    stack.write_text(stack.read_text() + '\n[env]\nFRANK_SAFETY_TEST = "1"\n'
                     if "[env]" not in stack.read_text() else
                     stack.read_text().replace("[env]\n", '[env]\nFRANK_SAFETY_TEST = "1"\n'))


def test_compose_builder_none_keeps_the_image(repo: Path) -> None:
    args = ("compose", "stacks/smoke-cpu.toml", "--builder", "none")
    assert frank(*args, cwd=repo).code == 0
    image = repo / "out/smoke-cpu/image"
    image.mkdir()
    (image / "index.json").write_text("{}")
    _changed_stack(repo)
    assert frank(*args, cwd=repo).code == 0
    assert (image / "index.json").read_text() == "{}", "the previous image is still there"
    assert "FRANK_SAFETY_TEST" in (repo / "out/smoke-cpu/plan.json").read_text()


def test_compose_killed_at_every_rename_keeps_the_old_output(template: Path,
                                                             tmp_path: Path) -> None:
    args = ["compose", "stacks/smoke-cpu.toml", "--builder", "none"]
    seed = fresh(template, tmp_path / "seed")
    assert run(args, seed)[0] == 0
    image = seed / "out/smoke-cpu/image"
    image.mkdir()
    (image / "index.json").write_text("{}")
    _changed_stack(seed)
    old = tree(seed, "out")
    ref = tmp_path / "ref"
    shutil.copytree(seed, ref, symlinks=True)
    code, renames = run(args, ref)
    assert code == 0 and renames >= 3
    new = tree(ref, "out")
    assert new != old and new["out/smoke-cpu/image/index.json"] == b"{}"
    for n in range(1, renames + 1):
        repo = tmp_path / f"k{n}"
        shutil.copytree(seed, repo, symlinks=True)
        assert run(args, repo, kill_at=n)[0] == -signal.SIGKILL
        _count("compose kills")
        now = {k: v for k, v in tree(repo, "out").items() if k.startswith("out/smoke-cpu/")}
        whole = [{k: v for k, v in t.items() if k.startswith("out/smoke-cpu/")}
                 for t in (old, new)]
        if "out/smoke-cpu/image/index.json" not in now:
            # killed between the exchange and moving the image over: the image waits in
            # the exchanged stage (the old output) for the next compose to move it
            aside = list((repo / "out").glob(".smoke-cpu.stage-*/image/index.json"))
            assert [p.read_bytes() for p in aside] == [b"{}"], f"kill {n}: image lost"
            _count("compose kills with the image aside")
            now["out/smoke-cpu/image/index.json"] = b"{}"
        assert now in whole, f"kill {n}: out/smoke-cpu is neither the old nor the new output"
        assert run(args, repo)[0] == 0
        _count("kill losses", int(tree(repo, "out") != new))
        left = sorted(tree(repo, "out"))
        assert tree(repo, "out") == new, f"kill {n}: the next compose left {left}"


def test_concurrent_composes_of_one_output(template: Path, tmp_path: Path) -> None:
    args = ["compose", "stacks/smoke-cpu.toml", "--builder", "none"]
    repo = fresh(template, tmp_path / "repo")
    assert run(args, repo)[0] == 0
    (repo / "out/smoke-cpu/image").mkdir()
    (repo / "out/smoke-cpu/image/index.json").write_text("{}")
    ref = tree(repo, "out")
    for _ in range(3):
        r, w = os.pipe()
        procs = [start(args, repo, gate=r) for _ in range(3)]
        os.close(r)
        os.write(w, b"xxx")
        os.close(w)
        assert [wait(*p)[0] for p in procs] == [0, 0, 0]
        _count("concurrent trials")
        _count("concurrent commands", 3)
        assert tree(repo, "out") == ref


# -- item 8: the layer index and what goes out ------------------------------------------------

@pytest.fixture
def mini(tmp_path: Path) -> Any:
    from frank.assemble.baselayout import BaseImage, layout_from_rootfs
    from frank.store.blobs import BlobStore

    root = tmp_path / "base-rootfs"
    (root / "etc").mkdir(parents=True)
    (root / "etc/os-release").write_text("ID=frank-mini\n")
    store = BlobStore(tmp_path / "cache")
    digest = layout_from_rootfs(root, store, tmp_path / "base", epoch=0, created_by="mini")
    return BaseImage(name="mini", layout=tmp_path / "base", digest=digest), store


def _spec(base: Any, tmp_path: Path) -> Any:
    from frank.image.spec import ImageSpec, LayerInput

    layers = []
    for name in ("a", "b"):
        src = tmp_path / f"src-{name}"
        src.mkdir(exist_ok=True)
        (src / f"{name}.txt").write_text(f"part {name}\n")
        layers.append(LayerInput(name=name, key=f"{ord(name):064x}",
                                 entries=((src, f"/{name}"),)))
    return ImageSpec(base_layout=base.layout, base_digest=base.digest, layers=tuple(layers),
                     env={}, entrypoint=[], cmd=[], labels={}, annotations={},
                     source_date_epoch=0)


@pytest.mark.parametrize("edit", ["copy another key's entry", "point the entry elsewhere",
                                  "point the entry elsewhere and forge its layer-keys record"])
@pytest.mark.parametrize("verify", ["", "full"])
def test_layer_index_pointing_at_another_blob_is_a_miss(mini: Any, tmp_path: Path, edit: str,
                                                        verify: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from frank.image.layer import index_key
    from frank.image.oci import build_image, read_layout
    from frank.store.blobs import BlobStore

    monkeypatch.setenv("FRANK_VERIFY", verify)
    base, _ = mini
    store = BlobStore(tmp_path / "cache")
    spec = _spec(base, tmp_path)
    good = build_image(spec, store, tmp_path / "out1", quiet=True)
    ka, kb = (store._layer_path(index_key(x, 0)) for x in spec.layers)
    if edit == "copy another key's entry":
        ka.write_bytes(kb.read_bytes())
    else:
        doc = json.loads(ka.read_bytes())
        other = json.loads(kb.read_bytes())["record"]
        doc["record"] = other
        ka.write_text(json.dumps(doc))
        if "forge" in edit:  # the blob's own record of the keys it was made for, too
            store._key_record(other["digest"], doc["key"]).write_text(doc["key"])
    assert build_image(spec, BlobStore(tmp_path / "cache"), tmp_path / "out2",
                       quiet=True) == good
    assert len({x.digest for x in read_layout(tmp_path / "out2").layers}) == 3


def test_a_corrupt_blob_with_a_matching_stamp_never_goes_out(mini: Any, tmp_path: Path) -> None:
    """A store blob edited in place with its mtime set back: the stat ledger sees the new
    ctime and hashes it (default mode). One whose ledger entry is forged to match (an
    untrusted writer of the cache, or bit rot, which moves no ctime) is caught only where
    nothing stored is trusted: ``FRANK_VERIFY=full`` (docs/trust.md)."""
    from frank.image.oci import build_image, read_layout
    from frank.store.blobs import BlobStore

    base, _ = mini
    store = BlobStore(tmp_path / "cache")
    spec = _spec(base, tmp_path)
    build_image(spec, store, tmp_path / "out1", quiet=True)
    digest = read_layout(tmp_path / "out1").layers[-1].digest
    blob = store.path(digest)
    data = bytearray(blob.read_bytes())
    data[700] ^= 0xFF
    st = blob.stat()
    blob.write_bytes(bytes(data))
    os.utime(blob, ns=(st.st_atime_ns, st.st_mtime_ns))  # size and mtime as they were
    store.ledger.save()
    fresh_store = BlobStore(tmp_path / "cache")
    with pytest.raises(FrankError, match="does not match its digest"):
        build_image(spec, fresh_store, tmp_path / "out2", quiet=True)
    assert not (tmp_path / "out2").exists()
    # made again, then edited and the ledger made to agree: full verification catches it
    build_image(spec, fresh_store, tmp_path / "out3", quiet=True)
    blob = store.path(digest)
    data = bytearray(blob.read_bytes())
    data[700] ^= 0xFF
    blob.write_bytes(bytes(data))
    fresh_store.note(digest)
    fresh_store.ledger.save()
    with pytest.raises(FrankError, match="does not match its digest"):
        build_image(spec, BlobStore(tmp_path / "cache", full_verify=True), tmp_path / "out4",
                    quiet=True)
    assert not (tmp_path / "out4").exists()


# -- issue 44 item 14: frank gc, alone with the store -------------------------------------------

def test_gc_frees_only_the_unreferenced_and_never_under_a_compose(
        repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`frank gc` keeps what the locks and out/ reference and removes an old stray blob,
    saying how much it freed; it waits for (or refuses beside) a command holding the store,
    and composes running beside it lose nothing. (This process never opens the store: its
    own shared hold would keep gc out.)"""
    import fcntl
    import hashlib
    import time

    cache = tmp_path / "cache"
    monkeypatch.setenv("FRANK_CACHE", str(cache))
    assert frank("compose", "stacks/smoke-cpu.toml", cwd=repo).code == 0
    data = b"a blob nothing references\n" * 1000
    stray = cache / "blobs/sha256" / hashlib.sha256(data).hexdigest()
    stray.write_bytes(data)
    month_ago = time.time() - 30 * 86400
    os.utime(stray, (month_ago, month_ago))
    with (cache / "users.lock").open("r") as held:
        fcntl.flock(held, fcntl.LOCK_SH)  # as a compose in progress holds it
        busy = frank("gc", "--keep-days", "0", "--wait", "1", cwd=repo)
    assert busy.code == 2 and "in use" in busy.err and len(busy.err.splitlines()) == 1
    assert stray.exists()
    done = frank("gc", "--keep-days", "1", "--json", cwd=repo)
    assert done.code == 0, done.err
    report = json.loads(done.out)
    assert report["removed"]["blobs"] == 1 and report["freed"] >= len(data)
    assert not stray.exists()
    layout = repo / "out/smoke-cpu/image"
    assert all((cache / "blobs/sha256" / p.name).is_file()
               for p in (layout / "blobs/sha256").iterdir())
    for _ in range(2):  # gc (keeping nothing by age) and composes at once
        procs = [subprocess.Popen([sys.executable, "-m", "frank", *args], cwd=repo,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                 for args in (("compose", "stacks/smoke-cpu.toml", "--locked"),
                              ("gc", "--keep-days", "0", "--wait", "120"),
                              ("compose", "stacks/smoke-cpu.toml", "--out",
                               str(tmp_path / "other")))]
        for proc in procs:
            _, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err.decode()
    from frank.image.verify import verify_layout

    assert verify_layout(layout).digest == verify_layout(tmp_path / "other/image").digest
    again = frank("compose", "stacks/smoke-cpu.toml", "--locked", cwd=repo)
    assert again.code == 0 and "0 layers built" in again.err + again.out, again.err
