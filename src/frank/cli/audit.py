"""`frank audit IMAGE|STACK`: the built image against its lock, one line per difference.

A stack is audited against its current lock (its image is ``out/<stack>/image``); an OCI
layout against the lock it carries, in the repo that built it (the plan needs the repo's
files). Exit 0: the image is what the lock says; 1: it is not (every difference named);
2: bad input.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from frank.cli.output import emit_json, json_option

if TYPE_CHECKING:
    from frank.audit.report import TargetReport
from frank.cli.targets import built_image


def _print_target(t: TargetReport) -> None:
    """The target section: one line per verdict, its evidence on the line."""
    click.echo(f"  target {t.device} (family {t.family}; facts from "
               f"{', '.join(t.declared_by) or 'no part'}):")
    for u in t.unused:
        said = "" if u.evaluated is None else f"; evaluated: {u.evaluated}"
        click.echo(f"    unused: {u.path} ({len(u.files)} files): {u.rule}: {u.why}{said}")
    for k in t.path:
        click.echo(f"    path: {k.role} via {k.backend}: {k.what}: {k.ref}: "
                   f"{'ok' if k.ok else 'NONE'}: {k.evidence}")
    for tool in t.tools:
        state = (f"built: {tool.built}" if tool.built else f"found {tool.found}"
                 if tool.found else "MISSING")
        click.echo(f"    tool: {tool.tool} for {tool.by}: {state}")
    for d in t.dead[:12]:
        click.echo(f"    dead: {d.owner}: {d.bytes / 1e6:.1f} MB of {d.device_bytes / 1e6:.1f} "
                   f"MB device code cannot run on {t.device} ({d.files_all_dead} files "
                   f"wholly)")
    if len(t.dead) > 12:
        rest = sum(d.bytes for d in t.dead[12:])
        click.echo(f"    dead: {len(t.dead) - 12} more owners, {rest / 1e6:.1f} MB (--json)")
    click.echo(f"    first start compiles: {t.first_start.line()}")


@click.command("audit")
@click.argument("target", metavar="IMAGE|STACK")
@click.option("--require-target", is_flag=True,
              help="Also fail when a library holds neither SASS that runs on the stack's "
                   "[target] arch nor PTX the driver can compile for it.")
@json_option
def audit(target: str, require_target: bool, as_json: bool) -> None:
    """Check the image of IMAGE|STACK against its lock: files, distributions, GPU code."""
    import sys

    from frank.audit.auditor import audit_layout
    from frank.audit.report import save_record

    layout, locked = built_image(target)
    if locked is None:
        from frank.resolve.project import repo_root_for

        lock, root = None, repo_root_for(None)
    else:
        lock, root = locked.lock, locked.resolved.root
    report = audit_layout(layout, lock, root, require_target=require_target)
    if (layout.parent / "plan.json").is_file() and not require_target:
        save_record(report, layout.parent)
    if as_json:
        emit_json(report.model_dump(mode="json"))
    else:
        for line in report.lines():
            click.echo(line)
        click.echo(f"{report.stack}: image {report.digest[:19]} "
                   f"{'matches' if report.ok else 'does not match'} lock "
                   f"{report.lock_digest[:19]}: {len(report.differences)} differences; "
                   f"{report.dists} distributions, {report.cost.files} files, "
                   f"{report.cost.bytes / 1e9:.2f} GB in {report.cost.seconds:.1f} s "
                   f"({report.cost.cpu_seconds:.1f} s CPU)")
        for owner in report.cuda:
            click.echo(f"  gpu: {owner.line(report.target)}")
        for note in report.notes:
            click.echo(f"  note: {note}")
        if report.target_report is not None:
            _print_target(report.target_report)
    sys.exit(0 if report.ok else 1)
