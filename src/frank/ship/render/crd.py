"""Custom resources checked against their CRD's published OpenAPI schema, offline.

The LeaderWorkerSet CRD is vendored as published (``schemas/``, see ``SOURCE.md``). The
API server prunes fields a structural schema does not name; this check refuses them instead
(``additionalProperties: false`` on every object schema that lists its properties and does
not preserve unknown fields), so a misspelt field fails here rather than vanishing there.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft7Validator

from frank.errors import FrankError

SCHEMAS = Path(__file__).with_name("schemas")
LWS_CRD = SCHEMAS / "leaderworkerset.x-k8s.io_leaderworkersets.yaml"


def _strict(schema: Any) -> Any:
    """The schema with unknown properties refused wherever it lists properties."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def crd_schema(path: Path, version: str) -> dict[str, Any]:
    """``spec.versions[name=version].schema.openAPIV3Schema`` of a CRD file."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    doc = yaml.load(path.read_text(encoding="utf-8"), Loader=loader)
    for v in doc["spec"]["versions"]:
        if v["name"] == version:
            schema: dict[str, Any] = v["schema"]["openAPIV3Schema"]
            return schema
    raise FrankError(f"the CRD has no version {version}", file=path)


@functools.cache
def lws_validator() -> Draft7Validator:
    """A validator for ``leaderworkerset.x-k8s.io/v1`` objects (read once per process)."""
    schema = _strict(copy.deepcopy(crd_schema(LWS_CRD, "v1")))
    # metadata is the API server's ObjectMeta; the CRD leaves it open
    schema["properties"]["metadata"] = {"type": "object"}
    return Draft7Validator(schema)


def lws_errors(obj: dict[str, Any]) -> list[str]:
    """Every schema violation, as ``path: message`` lines, sorted (empty: valid)."""
    out = []
    for err in lws_validator().iter_errors(obj):
        where = ".".join(str(p) for p in err.absolute_path) or "(top)"
        out.append(f"{where}: {err.message}")
    return sorted(out)


def validate_lws(obj: dict[str, Any]) -> None:
    """Refuse a LeaderWorkerSet its CRD would not accept (one line: the first violation)."""
    errors = lws_errors(obj)
    if errors:
        raise FrankError(f"the rendered LeaderWorkerSet does not match its CRD's schema "
                         f"({LWS_CRD.name}): {errors[0]}", field="leaderworkerset")
