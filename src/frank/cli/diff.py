"""`frank diff A B`: stacks (names or paths) or lock files, part by part."""

from __future__ import annotations

import click

from frank.cli.output import emit_json, json_option, print_table
from frank.diff import diff_locks
from frank.project import load_lock_any, repo_root_for


def _short(value: object) -> str:
    text = "-" if value is None else str(value)
    return text if len(text) <= 44 else text[:20] + "…" + text[-20:]


def _print_k8s(k8s: dict[str, object], a: str, b: str) -> None:
    unrendered = k8s["unrendered"]
    assert isinstance(unrendered, dict)
    for side, why in unrendered.items():
        click.echo(f"k8s: {a if side == 'a' else b} does not render: {why}")
    objects = k8s["objects"]
    assert isinstance(objects, list)
    if objects:
        rows = []
        for o in objects:
            # what the pods run first, then metadata
            fields = sorted(o["fields"], key=lambda f: (f.startswith("metadata"), f))
            shown = ", ".join(fields[:4]) + (f" (+{len(fields) - 4} more)" if len(fields) > 4
                                             else "")
            rows.append([o["kind"], o["state"], o["a"] or "-", o["b"] or "-", shown])
        print_table("kubernetes objects", ["kind", "state", a, b, "fields that change"], rows)


@click.command()
@click.argument("a")
@click.argument("b")
@click.option("--exit-code", is_flag=True, help="Exit 1 when the two differ.")
@click.option("--k8s", "with_k8s", is_flag=True,
              help="Also the Kubernetes objects `frank render k8s` would change, and how.")
@json_option
def diff(a: str, b: str, exit_code: bool, with_k8s: bool, as_json: bool) -> None:
    """Show what differs between A and B (stack names, stack paths or .lock files)."""
    lock_a, lock_b = load_lock_any(a), load_lock_any(b)
    result = diff_locks(lock_a, lock_b, repo_root_for())
    if with_k8s:
        from frank.render.objdiff import diff_objects

        result["k8s"] = diff_objects(lock_a, lock_b)
    if as_json:
        emit_json(result)
    else:
        click.echo(f"{a}: {result['a']['digest']}\n{b}: {result['b']['digest']}")
        if result["same"]:
            click.echo("same resolved content")
        rows = []
        for p in result["parts"]:
            rows.append([p["part"], p["change"], _short(p["old"]), _short(p["new"])])
            for f in p["fields"]:
                rows.append(["", f"  {f['field']}", _short(f["old"]), _short(f["new"])])
        for c in result["config"]:
            rows.append(["(stack)", c["field"], _short(c["old"]), _short(c["new"])])
        if rows:
            print_table("parts and config", ["part", "change", a, b], rows)
        print_table("image layers", ["layer", "state", a, b],
                    [[x["layer"], x["state"], _short(x["old"] and x["old"][:16]),
                      _short(x["new"] and x["new"][:16])] for x in result["layers"]])
        if with_k8s:
            _print_k8s(result["k8s"], a, b)
    if exit_code and not result["same"]:
        raise SystemExit(1)
