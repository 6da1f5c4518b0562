"""``frank diff --format html``: the diff as one self-contained page a reviewer attaches to a
pull request: the parts (and their fields), the stack's own settings, the Python closure and
the image layers, what changed first and what stayed the same folded away.

jinja2 renders it with autoescaping on (manifests are untrusted input: a summary or a field
value is text on the page, never markup); the page loads nothing from anywhere.
"""

from __future__ import annotations

from typing import Any

STATE_ORDER = {"added": 0, "removed": 1, "changed": 2, "version": 2, "same": 3}


def _text(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "(none)"
    return str(value)


def _closure_change(row: dict[str, Any]) -> str:
    return "removed" if row["new"] is None else "added" if row["old"] is None else "version"


def render_html(result: dict[str, Any]) -> str:
    """The page for one ``diff_locks`` answer (with ``k8s`` when asked)."""
    from jinja2 import Environment, PackageLoader, StrictUndefined

    env = Environment(loader=PackageLoader("frank.history", "templates"), autoescape=True,
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                      keep_trailing_newline=True)
    env.filters["text"] = _text
    layers = sorted(result["layers"], key=lambda x: STATE_ORDER.get(x["state"], 2))
    changed_layers = [x for x in layers if x["state"] != "same"]
    closure = [{**c, "change": _closure_change(c)} for c in result["closure"]]
    return env.get_template("diff.html.j2").render(
        a=result["a"], b=result["b"], same=result["same"], parts=result["parts"],
        config=result["config"], closure=closure, changed_layers=changed_layers,
        same_layers=[x for x in layers if x["state"] == "same"],
        k8s=result.get("k8s"))
