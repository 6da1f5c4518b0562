"""`frank audit IMAGE|STACK`: the built image against its lock, one line per difference.

A stack is audited against its current lock (its image is ``out/<stack>/image``); an OCI
layout against the lock it carries, in the repo that built it (the plan needs the repo's
files). Exit 0: the image is what the lock says; 1: it is not (every difference named);
2: bad input.
"""

from __future__ import annotations

import click

from frank.cli.output import emit_json, json_option
from frank.cli.targets import built_image


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
    sys.exit(0 if report.ok else 1)
