"""JSON Schema of what people write (each part kind, stacks, base images), from the models.

``frank schema`` writes them under ``schemas/`` and names each shipped file's schema on its
first line (taplo's ``#:schema`` comment, which the Even Better TOML extension reads), so an
editor completes and checks parts and stacks as people type; ``check-jsonschema`` holds every
shipped TOML to them in the tests. The models stay the one source: a field's comment in the
model's source becomes its ``description`` (what an editor shows on hover, and the docs'
field tables), so nothing here is written twice by hand.
"""

from __future__ import annotations

import ast
import inspect
import io
import json
import os
import sys
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from frank.fsutil import write_atomic
from frank.model.imagefile import BaseImageFile
from frank.model.kinds import _KINDS, all_kinds
from frank.model.stack import ImageChoice, ModelSpec, StackFile, Target
from frank.model.stackfiles import is_stack_name
from frank.model.tomlio import read_toml

SCHEMA_DIR = "schemas"
DIRECTIVE = "#:schema "
DRAFT = "https://json-schema.org/draft/2020-12/schema"
REGENERATE = "frank schema"  # the one command that makes schemas/ and the stamps current


def part_schema_name(kind: str) -> str:
    """The file name of one kind's schema."""
    return f"part-{kind}.json"


def _field_comments(cls: type) -> dict[str, str]:
    """``field -> comment`` from a class's source: the comment on a field's line, or the
    comment lines right above it (how frank's models say what a field means)."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    source = inspect.cleandoc("\n" + source) if source.startswith(" ") else source
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    lines = source.splitlines()
    out: dict[str, str] = {}
    tree = ast.parse(source)
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    for node in body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        words: list[str] = []
        line = node.lineno - 1
        while line in comments and lines[line - 1].lstrip().startswith("#"):
            words.insert(0, comments[line])
            line -= 1
        if node.lineno in comments:
            words.append(comments[node.lineno])
        if words:
            out[node.target.id] = " ".join(w for w in words if w)
    return out


def _model_classes() -> dict[str, type[BaseModel]]:
    """Every pydantic model in frank's model stage, by class name (the schema's ``$defs``
    keys), so nested models get their fields' comments too."""
    found: dict[str, type[BaseModel]] = {}
    for name, module in sorted(sys.modules.items()):
        if not name.startswith("frank.model"):
            continue
        for value in vars(module).values():
            if (isinstance(value, type) and issubclass(value, BaseModel)
                    and value.__module__.startswith("frank.model")):
                found.setdefault(value.__name__, value)
    return found


def _describe(schema: dict[str, Any], cls: type[BaseModel]) -> None:
    """Add each field's source comment as its description (a declared one wins)."""
    notes: dict[str, str] = {}
    for base in reversed(cls.__mro__):
        if isinstance(base, type) and issubclass(base, BaseModel) and base is not BaseModel:
            notes.update(_field_comments(base))
    for field, prop in schema.get("properties", {}).items():
        if field in notes and "description" not in prop:
            prop["description"] = notes[field]


def _finish(schema: dict[str, Any], cls: type[BaseModel], title: str) -> dict[str, Any]:
    classes = _model_classes()
    _describe(schema, cls)
    for name, sub in schema.get("$defs", {}).items():
        if name in classes:
            _describe(sub, classes[name])
    return {"$schema": DRAFT, "title": title, **{k: v for k, v in schema.items()
                                                 if k != "title"}}


def _partial(cls: type[BaseModel]) -> dict[str, Any]:
    """A table a stack may give in part (``extends`` merges it field by field): the model's
    fields with none required; the whole is checked after the merge."""
    schema = cls.model_json_schema()
    _describe(schema, cls)
    schema.pop("required", None)
    return schema


def stack_schema() -> dict[str, Any]:
    """``stacks/*.toml``: the file as written; ``[model]``, ``[target]``, ``[image]`` as
    partial tables."""
    schema = StackFile.model_json_schema()
    defs = schema.setdefault("$defs", {})
    for field, cls in (("model", ModelSpec), ("target", Target), ("image", ImageChoice)):
        defs[cls.__name__] = _partial(cls)
        prop = schema["properties"][field]
        keep = {k: v for k, v in prop.items() if k in ("description", "default")}
        schema["properties"][field] = {"$ref": f"#/$defs/{cls.__name__}", **keep}
    return _finish(schema, StackFile, "frank stack")


def schemas() -> dict[str, dict[str, Any]]:
    """Every schema ``frank schema`` writes, by file name."""
    out: dict[str, dict[str, Any]] = {}
    for kind, cls in zip(_KINDS, all_kinds(), strict=True):
        out[part_schema_name(kind)] = _finish(cls.model_json_schema(), cls,
                                              f"frank part: kind = {kind!r}")
    out["stack.json"] = stack_schema()
    out["image.json"] = _finish(BaseImageFile.model_json_schema(), BaseImageFile,
                                "frank base image")
    return out


def render(schema: dict[str, Any]) -> str:
    """One schema as the bytes written: stable, readable in a diff."""
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


@dataclass(frozen=True)
class Shipped:
    """A TOML file people write, and the schema that describes it."""

    path: Path
    schema: str  # file name under schemas/
    # a base image file's bytes are hashed into every stack digest that uses it
    # (``definition_sha256``): a first line added there would move every digest, so those
    # files are checked against their schema but not stamped
    stamp: bool = True


def _part_roots(root: Path) -> Iterator[Path]:
    yield root
    examples = root / "examples"
    if examples.is_dir():
        yield from sorted(p for p in examples.iterdir() if (p / "parts").is_dir()
                          or (p / "stacks").is_dir())


def shipped(root: Path) -> list[Shipped]:
    """Every part manifest, stack and base image file of the repo and its examples."""
    out: list[Shipped] = []
    for base in _part_roots(root):
        for path in sorted((base / "parts").glob("*/*.toml")):
            kind = read_toml(path).get("kind")
            if isinstance(kind, str) and kind in _KINDS:
                out.append(Shipped(path, part_schema_name(kind)))
        for path in sorted((base / "stacks").glob("*.toml")):
            if is_stack_name(path.name):
                out.append(Shipped(path, "stack.json"))
        for path in sorted((base / "images").glob("*.toml")):
            out.append(Shipped(path, "image.json", stamp=False))
    return out


def directive(root: Path, item: Shipped) -> str:
    """The first line that names ``item``'s schema, relative to the file (as taplo reads
    it)."""
    target = root / SCHEMA_DIR / item.schema
    return DIRECTIVE + Path(os.path.relpath(target, item.path.parent)).as_posix()


def stamped(text: str, line: str) -> str:
    """``text`` with ``line`` as its first line (an older directive replaced)."""
    first, sep, rest = text.partition("\n")
    if first.startswith(DIRECTIVE.rstrip()):
        return line + "\n" + rest if sep else line + "\n"
    return line + "\n" + text


@dataclass
class Report:
    """What ``frank schema`` changed (or, with ``check``, would change)."""

    schemas: list[str]
    stamps: list[str]

    @property
    def stale(self) -> bool:
        return bool(self.schemas or self.stamps)


def update(root: Path, *, check: bool) -> Report:
    """Make ``schemas/`` and every shipped file's ``#:schema`` line current; with ``check``,
    only say what is not."""
    report = Report([], [])
    folder = root / SCHEMA_DIR
    wanted = {name: render(s) for name, s in schemas().items()}
    present = {p.name for p in folder.glob("*.json")} if folder.is_dir() else set()
    for name, text in sorted(wanted.items()):
        path = folder / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            report.schemas.append(f"{SCHEMA_DIR}/{name}")
            if not check:
                folder.mkdir(exist_ok=True)
                write_atomic(path, text)
    for name in sorted(present - set(wanted)):
        report.schemas.append(f"{SCHEMA_DIR}/{name} (no such schema any more)")
        if not check:
            (folder / name).unlink()
    for item in shipped(root):
        if not item.stamp:
            continue
        text = item.path.read_text(encoding="utf-8")
        new = stamped(text, directive(root, item))
        if new != text:
            report.stamps.append(item.path.relative_to(root).as_posix())
            if not check:
                write_atomic(item.path, new)
    return report


def _type_of(prop: dict[str, Any]) -> str:
    """A property's type in a few words (``string``, ``list of string``, ``Revert``)."""
    if "$ref" in prop:
        return str(prop["$ref"]).rsplit("/", 1)[-1]
    if "const" in prop:
        return json.dumps(prop["const"])
    if "enum" in prop:
        return " | ".join(json.dumps(v) for v in prop["enum"])
    for key in ("anyOf", "oneOf"):
        if key in prop:
            kinds = [_type_of(p) for p in prop[key] if p.get("type") != "null"]
            return " or ".join(dict.fromkeys(kinds))
    kind = prop.get("type", "any")
    if kind == "array":
        return f"list of {_type_of(prop.get('items', {}))}"
    if kind == "object":
        values = prop.get("additionalProperties")
        if isinstance(values, dict):
            return f"table of {_type_of(values)}"
        return "table"
    return str(kind)


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "\\|").split())


def field_table(schema: dict[str, Any], *, heading: str = "###") -> str:
    """Markdown tables of a schema's fields, then of each table it nests (``$defs``), for the
    docs: made from the schema, so the docs say what the models accept."""

    def one(model: dict[str, Any]) -> list[str]:
        required = set(model.get("required", []))
        rows = ["| field | type | required | default | what it is |",
                "|---|---|---|---|---|"]
        for name, prop in model.get("properties", {}).items():
            default = "" if prop.get("default") is None else f"`{json.dumps(prop['default'])}`"
            rows.append(f"| `{name}` | {_cell(_type_of(prop))} | "
                        f"{'yes' if name in required else ''} | {default} | "
                        f"{_cell(prop.get('description', ''))} |")
        return rows

    out = one(schema)
    for name, sub in schema.get("$defs", {}).items():
        if sub.get("properties"):
            out += ["", f"{heading} `{name}`", ""]
            if sub.get("description"):
                out += [_cell(sub["description"]), ""]
            out += one(sub)
    return "\n".join(out) + "\n"
