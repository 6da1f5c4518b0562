"""`frank trial run`: execute the sealed order, one engine start at a time.

Each start: check the arm's stack still locks to the sealed digest, start the engine, wait
for /health, scrape /metrics, run the workload with the server's URL in its environment,
scrape again, stop the engine and wait until it is gone (the next start reuses the port),
then append the start to the results file. A start that fails is recorded as a crash; a
later `run` resumes at the first start without a result.

Where the engine comes from (``--from``): by default the arm's image (``out/<stack>/image``,
see ``trial.images``): built from the sealed lock, every blob re-hashed before each start,
run through a container engine as ``frank run`` does, its manifest digest recorded per
start. ``--from host`` runs the one launcher on the host instead (``python -m frank.run.launch``
on that exact lock, with the host's packages): one process group per start, so the
engine's workers cannot outlive it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from frank.errors import FrankError
from frank.resolve.lock import render_lock
from frank.resolve.project import lock_stack
from frank.run.container import RunPlan
from frank.run.procs import group_members
from frank.trial.design import Start
from frank.trial.images import ArmImage, arm_image, check_same_image
from frank.trial.metric import Expr, MetricError, deltas, parse, parse_prometheus, workload_json
from frank.trial.model import Trial, repo_of, results_path
from frank.trial.results import StartRecord, append, read_results
from frank.trial.seal import load_sealed, utc_now

Report = Callable[[str], None]
# An engine brought up for one start: entered once it serves, it gives the engine's exit
# status (None while it runs); a FrankError before that is the start's crash.
Serve = Callable[[], AbstractContextManager[Callable[[], int | None]]]
Source = Literal["image", "host"]


@dataclass(frozen=True)
class RunOptions:
    """Limits for one start."""

    workload: str
    ready_timeout: float = 600.0
    workload_timeout: float = 3600.0
    stop_timeout: float = 60.0
    keep_going: bool = False
    source: Source = "image"
    engine: str = "auto"  # the container engine (image starts)
    hub_cache: Path | None = None  # the weights' hub cache to mount (image starts)


def logs_dir(trial_file: Path) -> Path:
    """Engine and workload logs, one pair per start: ``trials/NAME.logs/``."""
    return trial_file.with_name(f"{trial_file.stem}.logs")


def current_locks(trial: Trial, trial_file: Path) -> dict[str, dict[str, Any]]:
    """Each arm's lock as it is now; a stack whose lock changed since sealing is refused."""
    root = repo_of(trial_file)
    out: dict[str, dict[str, Any]] = {}
    for arm in ("A", "B"):
        spec = getattr(trial.arms, arm)
        locked = lock_stack(str(root / spec.stack))
        if locked.lock.digest != spec.digest:
            raise FrankError(f"arm {arm}: {spec.stack} now locks to {locked.lock.digest}, the "
                             f"trial sealed {spec.digest}: the stack changed since sealing; "
                             f"a sealed trial measures only the stacks it sealed: plan a new "
                             f"one (`frank trial plan {trial.arms.A.stack} "
                             f"{trial.arms.B.stack} --name NEW ... --seal`) or put "
                             f"{spec.stack} back as it was sealed",
                             file=trial_file, field=f"arms.{arm}.digest")
        out[arm] = json.loads(render_lock(locked.lock))
    return out




def stop_engine(proc: subprocess.Popen[bytes], timeout: float) -> int:
    """SIGTERM the launcher (it forwards to the engine); SIGKILL the group after timeout."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        code = proc.wait()
    deadline = time.monotonic() + 10
    while group_members(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in group_members(proc.pid):  # only this start's engine processes
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return code


def _port_busy(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1)
        return s.connect_ex((host, port)) == 0


def scrape(base_url: str) -> dict[str, float]:
    """The engine's Prometheus metrics, summed over label sets."""
    with urllib.request.urlopen(base_url + "/metrics", timeout=30) as resp:
        return parse_prometheus(resp.read().decode("utf-8", "replace"))


def run_workload(command: str, env: dict[str, str], cwd: Path, timeout: float
                 ) -> subprocess.CompletedProcess[str] | None:
    """Run the workload in its own process group; None if it ran past ``timeout``.

    Why a group: a shell command's children would otherwise outlive a timeout (and keep
    its output pipes open), hitting the next start's engine.
    """
    proc = subprocess.Popen(command, shell=True, cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        raise
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def _tail(path: Path) -> str:
    lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "(empty log)"


@contextlib.contextmanager
def host_engine(lock_file: Path, root: Path, engine_log: Path, base_url: str,
                opts: RunOptions) -> Iterator[Callable[[], int | None]]:
    """The launcher on the host, in its own process group, until the start is done."""
    from frank.run import launch

    argv = [sys.executable, "-m", "frank.run.launch", "--lock", str(lock_file),
            "--ready-timeout", str(opts.ready_timeout)]
    with engine_log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=root, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        if not launch.wait_ready(base_url + "/health", proc, opts.ready_timeout):
            code = proc.poll()
            why = (f"engine exited with code {code} before ready" if code is not None
                   else f"engine not ready in {opts.ready_timeout:g} s")
            raise FrankError(f"{why}: {_tail(engine_log)}")
        yield proc.poll
    finally:
        stop_engine(proc, opts.stop_timeout)


@contextlib.contextmanager
def image_engine(plan: RunPlan, engine_log: Path, opts: RunOptions
                 ) -> Iterator[Callable[[], int | None]]:
    """The arm's image in a working container (``frank run``'s), removed when done."""
    from frank.run import supervise

    with engine_log.open("wb") as out, supervise.serving(plan, opts.ready_timeout, out) as r:
        assert r.proc is not None
        yield r.proc.poll


@contextlib.contextmanager
def warm_engine(image: ArmImage, engine_log: Path, opts: RunOptions, fields: dict[str, Any],
                logs: Path) -> Iterator[Callable[[], int | None]]:
    """``image_engine`` with the warm cache of the arm's image for this device when the
    store has one (``frank.run.warmuse``); ``fields["warm_cache"]`` records which, or why
    none. The plan the start ran is written to ``logs``."""
    from frank.assemble.engines import get_engine
    from frank.run import container as image_run
    from frank.run import warmuse
    from frank.ship import warmsign
    from frank.store.blobs import BlobStore

    gpus = int((image.lock.get("target") or {}).get("gpus", 0) or 0)
    store = BlobStore()
    # as `frank run`: where the image is attested, only a warm cache its signer signed
    check = warmsign.run_check(store.root, Path(image.image.layout), image.digest,
                               warmsign.public_key_path())
    with warmuse.attached(store, image.digest, gpus, cold=False, check=check) as warm:
        fields["warm_cache"] = warm.artifact.digest if warm.artifact else \
            "none: " + warm.note.removeprefix("no warm cache: ")
        plan = image_run.plan(image.image, image.lock, get_engine(opts.engine),
                              w=image.weights, extra_env={}, args=[], warm_dir=warm.host,
                              warm_env=warm.env, warm_note=warm.note)
        logs.write_text(json.dumps(plan.as_json(), indent=2) + "\n", encoding="utf-8")
        with image_engine(plan, engine_log, opts) as exited:
            yield exited


def run_start(start: Start, lock: dict[str, Any], expr: Expr, opts: RunOptions, *,
              trial_digest: str, stack: str, root: Path, logs: Path,
              report: Report, image: ArmImage | None = None) -> StartRecord:
    """One engine start, end to end; never raises for an engine or workload failure.

    ``image``: start the arm's image (its manifest digest is recorded); None: the host's
    launcher on ``lock``.
    """
    logs.mkdir(parents=True, exist_ok=True)
    tag = f"start-{start.index:03d}"
    engine_log = logs / f"{tag}.engine.log"
    fields: dict[str, Any] = {"start": start.index, "block": start.block, "arm": start.arm,
                              "digest": lock["digest"], "trial": trial_digest, "stack": stack}
    env_more: dict[str, str] = {}
    serve: Serve
    if image is None:
        lock_file = logs / f"{tag}.lock.json"
        lock_file.write_text(json.dumps(lock, indent=2, sort_keys=True) + "\n",
                             encoding="utf-8")
        host = str(lock["flags"].get("host", "127.0.0.1"))
        host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
        port = int(lock["flags"].get("port", 8000))
        base_url = f"http://{host}:{port}"

        def serve() -> AbstractContextManager[Callable[[], int | None]]:
            return host_engine(lock_file, root, engine_log, base_url, opts)
    else:
        from frank.assemble.engines import get_engine
        from frank.run import container as image_run

        plan = image_run.plan(image.image, image.lock, get_engine(opts.engine),
                              w=image.weights, extra_env={}, args=[])
        (logs / f"{tag}.run.json").write_text(json.dumps(plan.as_json(), indent=2) + "\n",
                                              encoding="utf-8")
        base_url = plan.url.removesuffix("/health")
        parsed = urllib.parse.urlsplit(plan.url)
        host, port = parsed.hostname or "127.0.0.1", parsed.port or 80
        fields["image"] = image.digest
        env_more["FRANK_TRIAL_IMAGE"] = image.digest

        def serve() -> AbstractContextManager[Callable[[], int | None]]:
            assert image is not None
            return warm_engine(image, engine_log, opts, fields, logs / f"{tag}.run.json")

    def crash(error: str, **more: Any) -> StartRecord:
        return StartRecord(**fields, status="crash", error=error, finished=utc_now(), **more)

    if _port_busy(host, port):
        return crash(f"port {port} on {host} is already in use before the engine started",
                     started=utc_now())
    fields["started"] = utc_now()
    report("starting engine")
    serving = False
    try:
        with serve() as exited:
            serving = True
            return _measure(start, expr, opts, fields, base_url, exited, engine_log, logs,
                            stack, env_more, root, report, crash)
    except FrankError as exc:
        if serving:
            raise
        return crash(exc.message)
    except (urllib.error.URLError, OSError) as exc:
        return crash(f"engine metrics endpoint failed: {exc}")


def _measure(start: Start, expr: Expr, opts: RunOptions, fields: dict[str, Any],
             base_url: str, exited: Callable[[], int | None], engine_log: Path, logs: Path,
             stack: str, env_more: dict[str, str], root: Path, report: Report,
             crash: Callable[..., StartRecord]) -> StartRecord:
    """Scrape, run the workload, scrape again: the start's record (the engine serving)."""
    fields["ready"] = utc_now()
    before = scrape(base_url) if expr.series else {}
    report("running workload")
    env = {**os.environ, "FRANK_TRIAL_BASE_URL": base_url,
           "OPENAI_BASE_URL": base_url + "/v1", "FRANK_TRIAL_ARM": start.arm,
           "FRANK_TRIAL_BLOCK": str(start.block), "FRANK_TRIAL_START": str(start.index),
           "FRANK_TRIAL_STACK": stack, **env_more}
    work = run_workload(opts.workload, env, root, opts.workload_timeout)
    if work is None:
        return crash(f"workload ran past {opts.workload_timeout:g} s")
    (logs / f"start-{start.index:03d}.workload.log").write_text(
        f"$ {opts.workload}\n--- stdout\n{work.stdout}\n--- stderr\n{work.stderr}",
        encoding="utf-8")
    code = exited()
    if code is not None:
        return crash(f"engine exited with code {code} during the workload: "
                     f"{_tail(engine_log)}")
    if work.returncode != 0:
        err = (work.stderr.strip().splitlines() or ["(no stderr)"])[-1][:300]
        return crash(f"workload exited with code {work.returncode}: {err}")
    after = scrape(base_url) if expr.series else {}
    found = deltas(before, after, expr.series)
    out_json = workload_json(work.stdout)
    value: float | None
    try:
        value = expr.value(found, out_json)
        error = None
    except MetricError as exc:
        value, error = None, str(exc)
    report("stopping engine")
    return StartRecord(**fields, status="ok", value=value, error=error, metrics=found,
                       finished=utc_now())


def _images(trial: Trial, locks: dict[str, dict[str, Any]], root: Path, opts: RunOptions
            ) -> dict[str, ArmImage] | None:
    """Each arm's verified image (None with ``--from host``); the container engine must be
    there too, so a run that cannot start refuses before its first start."""
    if opts.source == "host":
        return None
    from frank.assemble.engines import get_engine

    images = {arm: arm_image(trial, arm, locks[arm], root, hub_cache=opts.hub_cache)
              for arm in ("A", "B")}
    get_engine(opts.engine)
    return images


@contextlib.contextmanager
def exclusive(trial_file: Path) -> Iterator[None]:
    """One `run` of a trial at a time (two would run a start twice); a lock left by a dead
    process is taken over."""
    path = trial_file.with_name(f"{trial_file.stem}.run.lock")
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                pid = int(path.read_text().strip() or "0")
                os.kill(pid, 0)
            except (ValueError, ProcessLookupError, FileNotFoundError):
                path.unlink(missing_ok=True)  # stale
                continue
            except PermissionError:
                pass
            raise FrankError(f"another `frank trial run` (pid {pid}) is running this trial",
                             file=path) from None
        with os.fdopen(fd, "w") as handle:
            handle.write(f"{os.getpid()}\n")
        try:
            yield
        finally:
            path.unlink(missing_ok=True)
        return
    raise FrankError("could not take the run lock", file=path)


def run_trial(trial_file: Path, opts: RunOptions, *, progress: bool = True) -> list[StartRecord]:
    """Run every sealed start that has no result yet, in the sealed order."""
    trial, digest = load_sealed(trial_file)
    with exclusive(trial_file):
        return _run_locked(trial_file, trial, digest, opts, progress)


def check_same_warm(record: StartRecord, before: list[StartRecord], results: Path) -> None:
    """Cold and warm starts are not mixed in one arm: a start whose warm cache (an artifact,
    or none) differs from the arm's earlier successful starts is refused, not recorded."""
    cache = (record.warm_cache or "none").split(":")[0]
    for r in before:
        if r.arm == record.arm and r.status == "ok" and record.status == "ok" and \
                (r.warm_cache or "none").split(":")[0] != cache and r.image == record.image:
            raise FrankError(f"start {record.start} of arm {record.arm} ran with warm cache "
                             f"{record.warm_cache or 'none'}, start {r.start} with "
                             f"{r.warm_cache or 'none'}: an arm's starts must not mix cold and "
                             "warm (remove the results and run again, or `frank warm` first)",
                             file=results, field="warm_cache")


def _run_locked(trial_file: Path, trial: Trial, digest: str, opts: RunOptions,
                progress: bool) -> list[StartRecord]:
    try:
        expr = parse(trial.metric.expr)
    except MetricError as exc:
        raise FrankError(str(exc), file=trial_file, field="metric.expr") from None
    locks = current_locks(trial, trial_file)
    root = repo_of(trial_file)
    images = _images(trial, locks, root, opts)  # both arms, every blob, before any start
    results = results_path(trial_file)
    existing = read_results(results)
    for r in existing:
        if r.trial != digest:
            raise FrankError(f"start {r.start} was recorded under trial digest {r.trial}, but "
                             f"the trial is sealed as {digest} (was it edited and re-sealed?)",
                             file=results, field="trial")
    done = {r.start for r in existing if r.status == "ok"}
    todo = [s for s in trial.starts() if s.index not in done]
    for arm in ("A", "B"):
        check_same_image(arm, images[arm].digest if images else None, existing, results)
    new: list[StartRecord] = []
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=console, disable=not progress, transient=False) as bar:
        task = bar.add_task(f"trial {trial.name}", total=len(trial.order),
                            completed=len(trial.order) - len(todo))
        for s in todo:
            def report(what: str, s: Start = s) -> None:
                bar.update(task, description=f"start {s.index}/{len(trial.order)} "
                                             f"(block {s.block}, arm {s.arm}): {what}")

            # The stack and its image may change while the trial runs: check every start.
            if s.index != todo[0].index:
                locks = current_locks(trial, trial_file)
                if images:
                    images[s.arm] = arm_image(trial, s.arm, locks[s.arm], root,
                                              hub_cache=opts.hub_cache)
            image = images[s.arm] if images else None
            check_same_image(s.arm, image.digest if image else None, existing + new, results)
            spec = getattr(trial.arms, s.arm)
            record = run_start(s, locks[s.arm], expr, opts, trial_digest=digest,
                               stack=spec.stack, root=root, logs=logs_dir(trial_file),
                               report=report, image=image)
            check_same_warm(record, existing + new, results)
            append(results, [record])
            new.append(record)
            bar.advance(task)
            shown = f"{record.value:.6g}" if record.value is not None else record.error
            ran = f", image {record.image}" if record.image else ""
            console.print(f"start {s.index} (block {s.block}, arm {s.arm}{ran}): "
                          f"{record.status}: {shown}", highlight=False)
            if record.status == "crash" and not opts.keep_going:
                raise FrankError(f"start {s.index} (block {s.block}, arm {s.arm}) crashed: "
                                 f"{record.error}; recorded; run again to resume",
                                 file=results, field="status")
        bar.update(task, description=f"trial {trial.name}: all sealed starts recorded")
    return new
