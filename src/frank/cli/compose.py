"""`frank compose STACK`: resolve, lock, plan, and build the image (or its context)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from frank.assemble.plan import build_plan
from frank.cli.output import emit_json, json_option
from frank.errors import FrankError
from frank.fsutil import inside_repo
from frank.history.repolock import repo_lock
from frank.image.outdir import staged_output
from frank.image.progress import status
from frank.resolve.lock import lock_is_current, render_lock, write_lock
from frank.resolve.project import lock_stack, repo_root_for, stack_path


@click.command()
@click.argument("stack")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=None,
              help="Output folder (default: out/<stack>).")
@click.option("--locked", is_flag=True, help="Refuse to run if the lock would change.")
@click.option("--builder", type=click.Choice(["auto", "oci", "buildah", "podman", "docker",
                                              "none"]), default="auto", show_default=True,
              help="auto: embedded daemonless builder unless a layer runs commands; "
                   "none: write the plan and context only.")
@click.option("--mirror", "mirrors", multiple=True,
              type=click.Path(path_type=Path, file_okay=False),
              help="A folder of pinned files named by their sha256, consulted before the "
                   "network (also FRANK_MIRROR); for air-gapped builds.")
@click.option("--release", is_flag=True,
              help="Trust only bytes the lock pins: derive every layer, the base and the "
                   "config again from the pinned downloads in a scratch store, compare with "
                   "what the cache offers, drop what differs (docs/trust.md).")
@json_option
def compose(stack: str, out_dir: Path | None, locked: bool, builder: str,
            mirrors: tuple[Path, ...], release: bool, as_json: bool) -> None:
    """Resolve STACK, lock it, plan its layers, write the build context, build the image."""
    from rich.console import Console

    console = Console(stderr=True, quiet=as_json)
    top = repo_root_for(Path(stack) if stack.endswith(".toml") else None)
    with repo_lock(repo_root_for(stack_path(stack, top))):  # the stack and its lock agree
        with status(console, "resolving and hashing inputs"):
            result = lock_stack(stack, closure="use" if locked else "resolve")
        lock_file = result.lock_file
        if locked:
            if not lock_is_current(lock_file, render_lock(result.lock)):
                raise FrankError("lock is missing or out of date (run `frank lock`)",
                                 file=lock_file, field="--locked")
        else:
            write_lock(result.lock, lock_file)
    root = result.resolved.root
    plan = build_plan(result.lock, root)
    out = (out_dir or root / "out" / result.lock.stack).absolute()
    if out_dir is None:  # out/ or out/STACK linking into another tree: refused
        inside_repo(root, out, file=f"out/{result.lock.stack}", field="out")
    built = None
    report = None
    audit_kept = False
    findings: list[str] = []
    taken: list[str] = []  # host builds release mode took by their output_sha256
    with staged_output(out) as stage:  # the old output stays whole until this one is
        with status(console, f"writing build context to {out}"):
            from frank.assemble.context import write_context

            write_context(plan, result.lock, root, stage)
        if builder != "none":
            if release:
                from frank.audit.release import compare, scratch_cache

                with scratch_cache(result.lock, root) as scratch:
                    built, report, audit_kept = _build(plan, result, root, stage, out,
                                                       builder, mirrors, as_json, console,
                                                       release=True)
                    findings = [f.line() for f in compare(scratch, built.layout)]
                    taken = list(scratch.taken)
            else:
                built, report, audit_kept = _build(plan, result, root, stage, out, builder,
                                                   mirrors, as_json, console)
    summary = {
        "stack": result.lock.stack, "lock": str(lock_file), "digest": result.lock.digest,
        "out": str(out), "engine": plan.engine.model_dump() if plan.engine else None,
        "needs_run": plan.needs_run, "impure": plan.impure,
        "closure_bytes": sum(w.size or 0 for x in plan.layers for w in x.wheels),
        "layers": [{"index": x.index, "name": x.name, "key": x.key} for x in plan.layers],
        "image": None if built is None else {
            "digest": built.digest, "layout": str(out / "image"), "builder": built.builder,
            "why": built.why, "layers_built": built.layers_built,
            "layers_reused": built.layers_reused},
        "audit": None if report is None else {
            "ok": report.ok, "differences": report.lines(), "seconds": report.cost.seconds,
            "cpu_seconds": report.cost.cpu_seconds, "files": report.cost.files,
            "record": str(out / "audit.json"), "kept": audit_kept},
        "release": {"cache_differences": findings} if release else None,
    }
    for line in findings:  # on stderr in both forms: a CI log shows the first difference
        click.echo(line, err=True)
    if as_json:
        emit_json(summary)
        if (report is not None and not report.ok) or findings:
            sys.exit(1)
        return
    click.echo(f"{result.lock.stack}: {result.lock.digest}")
    if plan.engine:
        click.echo(f"engine path: {plan.engine.strategy} ({plan.engine.why})")
    for layer in plan.layers:
        click.echo(f"  layer {layer.index:2d} {layer.name:28s} {layer.key[:16]}")
    click.echo(f"wrote {out}/plan.json and {out}/context/Dockerfile")
    if built is not None:
        click.echo(f"image {built.digest} in {out / 'image'} (builder {built.builder}: "
                   f"{built.why}; {built.layers_built} layers built, "
                   f"{built.layers_reused} reused)")
    if report is not None:
        for line in report.lines():
            click.echo(f"audit: {line}")
        click.echo(f"audit: {'the image is what the lock says' if report.ok else 'FAILED'} "
                   f"({report.cost.files} files, {report.cost.bytes / 1e9:.2f} GB in "
                   f"{report.cost.seconds:.1f} s, {report.cost.cpu_seconds:.1f} s CPU; "
                   f"{_how_audited(report, audit_kept)}{out / 'audit.json'})")
    if release and built is not None:
        said = f"differed: {len(findings)} record(s) dropped" if findings else "agrees"
        pinned = f" ({', '.join(taken)}: kept outputs taken at their output_sha256)" \
            if taken else ""
        click.echo("release: every layer, the base and the config derived from the lock's "
                   f"pins{pinned}; the cache {said}")
    if (report is not None and not report.ok) or findings:
        sys.exit(1)


def _how_audited(report: Any, audit_kept: bool) -> str:
    """Where the audit's verdict came from, when not from reading the image."""
    if audit_kept:
        return "kept from the compose that built this digest; "
    if report.cost.verdict_kept:
        return "the files' verdict kept from an audit of the same layers, the config checked; "
    return ""


def _build(plan: Any, result: Any, root: Path, stage: Path, out: Path, builder: str,
           mirrors: tuple[Path, ...], as_json: bool, console: Any, *,
           release: bool = False) -> tuple[Any, Any, bool]:
    """Build into ``stage`` and audit (or keep the audit of an unchanged image). In
    ``release`` mode no audit record, kept reading or kept base is used, and no ledger."""
    from frank.assemble.builder import build
    from frank.audit.layers import TarReader
    from frank.audit.report import load_record, save_record

    # each streamed layer's bytes are parsed for the audit as they are written
    built = build(plan, root, stage, builder,  # type: ignore[arg-type]
                  mirrors=mirrors, quiet=as_json, tap=TarReader)
    # an output already current is carried over, not written into the stage
    audited = built.layout if (built.layout / "oci-layout").is_file() else out / "image"
    # nothing built: the image is the one the last compose audited (same digest, its
    # blobs hashed again by the output check), as run and push reuse that record
    report = load_record(out / "image", built.digest) \
        if built.layers_built == 0 and not release else None
    audit_kept = report is not None
    if report is None:
        with console.status("auditing the image against its lock"):
            from frank.audit.auditor import audit_layout  # 0.1 s of imports a no-op skips
            from frank.store.blobs import BlobStore

            report = audit_layout(audited, result.lock, root, known=built.tapped,
                                  keep_known=not release,
                                  store=BlobStore(full_verify=True) if release else None)
    report = report.model_copy(update={"layout": str(out / "image")})
    save_record(report, stage)
    return built, report, audit_kept
