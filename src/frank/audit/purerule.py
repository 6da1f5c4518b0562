"""Evaluate an engine rule that is a pure function of the device capability, from the
image's own copy of its source, without a GPU and without running the engine's code.

vLLM decides some things with one-line predicates (``supports_compute_capability``:
``return device_capability.major == 10``). Such a function is parsed from the file the
image holds (the patched one, if a patch touched it) and interpreted here over a small
subset of Python: comparisons, ``and``/``or``/``not``, constants, tuples, and the
capability's ``major``, ``minor`` and ``to_int()``. Anything else is refused as "not a pure
function of the capability": the host never executes code that came from an image.
"""

from __future__ import annotations

import ast
import operator
from typing import Any


class NotPure(ValueError):
    """The function reads something besides the capability, or uses other syntax."""


_CMP: dict[type[ast.cmpop], Any] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
}


def find_function(source: str, qualname: str) -> ast.FunctionDef:
    """``Class.method`` or ``function`` at module level."""
    tree = ast.parse(source)
    body: list[ast.stmt] = tree.body
    *owners, name = qualname.split(".")
    for owner in owners:
        cls = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == owner), None)
        if cls is None:
            raise NotPure(f"no class {owner}")
        body = cls.body
    fn = next((n for n in body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    if fn is None:
        raise NotPure(f"no function {qualname}")
    return fn


def evaluate(source: str, qualname: str, major: int, minor: int) -> bool:
    """What the function returns for a device of capability ``major.minor``."""
    fn = find_function(source, qualname)
    params = [a.arg for a in fn.args.args if a.arg not in ("self", "cls")]
    if len(params) != 1:
        raise NotPure(f"{qualname} takes {len(params)} arguments, not the capability alone")
    stmts = [s for s in fn.body if not (isinstance(s, ast.Expr)
                                        and isinstance(s.value, ast.Constant))]
    if len(stmts) != 1 or not isinstance(stmts[0], ast.Return) or stmts[0].value is None:
        raise NotPure(f"{qualname} is not a single return statement")
    return bool(_eval(stmts[0].value, params[0], major, minor))


def _eval(node: ast.expr, param: str, major: int, minor: int) -> Any:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | str | bool | None):
        return node.value
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return tuple(_eval(e, param, major, minor) for e in node.elts)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
            and node.value.id == param and node.attr in ("major", "minor"):
        return major if node.attr == "major" else minor
    if isinstance(node, ast.Call) and not node.args and not node.keywords \
            and isinstance(node.func, ast.Attribute) and node.func.attr == "to_int" \
            and isinstance(node.func.value, ast.Name) and node.func.value.id == param:
        return major * 10 + minor
    if isinstance(node, ast.BoolOp):
        values = [_eval(v, param, major, minor) for v in node.values]
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return not _eval(node.operand, param, major, minor)
    if isinstance(node, ast.Compare):
        left = _eval(node.left, param, major, minor)
        for op, comp in zip(node.ops, node.comparators, strict=True):
            right = _eval(comp, param, major, minor)
            if not _CMP[type(op)](left, right):
                return False
            left = right
        return True
    raise NotPure(f"line {getattr(node, 'lineno', '?')}: {ast.unparse(node)} is not read "
                  "from the capability alone")
