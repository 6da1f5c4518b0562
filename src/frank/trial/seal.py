"""Sealing: the rule and the order get a content hash and a time before anything runs.

Why per-field hashes too: a changed rule must be refused with the field that changed, so a
reader knows what was edited. The overall hash is the trial's digest: every recorded start
carries it, so even a re-sealed (edited, then re-hashed) trial no longer matches results
recorded under the original seal.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import tomlkit

from frank.errors import FrankError
from frank.fsutil import write_atomic
from frank.hashing import sha256_json
from frank.model.tomlio import read_toml
from frank.trial.model import Trial, read_trial


def sealed_content(trial: Trial) -> dict[str, Any]:
    """What the seal covers: everything in the trial file but the seal itself, as the file
    writes it (no empty values: a subject's absent version, or the whole subject of a plan
    sealed before subjects existed, whose seal must still verify)."""
    return trial.model_dump(mode="json", exclude={"seal"}, exclude_none=True)


def _leaves(value: Any, prefix: str) -> dict[str, Any]:
    if isinstance(value, dict) and prefix != "order":
        out: dict[str, Any] = {}
        for key, sub in value.items():
            out.update(_leaves(sub, f"{prefix}.{key}" if prefix else key))
        return out
    return {prefix: value}


def field_hashes(trial: Trial) -> dict[str, str]:
    """sha256 of each sealed field (``design.alpha``, ``arms.B.digest``, ``order``...)."""
    return {k: sha256_json(v) for k, v in sorted(_leaves(sealed_content(trial), "").items())}


def content_hash(trial: Trial, sealed_at: str) -> str:
    """The trial digest: ``sha256:`` of the canonical JSON of the sealed content and the
    seal time (so the time cannot be moved either)."""
    return "sha256:" + sha256_json({"content": sealed_content(trial), "sealed_at": sealed_at})


def utc_now() -> str:
    """Now, UTC, to the microsecond (start timestamps must order starts)."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def seal_file(path: Path) -> Trial:
    """Add ``[seal]`` to an unsealed trial file, keeping its comments; refuse a sealed one."""
    trial = read_trial(path)
    if trial.seal is not None:
        raise FrankError(f"already sealed at {trial.seal.time} ({trial.seal.hash})",
                         file=path, field="seal")
    doc = tomlkit.parse(path.read_text(encoding="utf-8"))
    seal = tomlkit.table()
    now = utc_now()
    seal["hash"] = content_hash(trial, now)
    seal["time"] = now
    fields = tomlkit.table()
    fields.update(field_hashes(trial))
    seal["fields"] = fields
    doc.add(tomlkit.nl())
    doc.add(tomlkit.comment("Sealed: any edit above this line is detected and refused."))
    doc["seal"] = seal
    write_atomic(path, tomlkit.dumps(doc))
    return read_trial(path)


def _compare(now: dict[str, str], sealed: dict[str, str], path: Path) -> None:
    for key in sorted(set(now) | set(sealed)):
        if key not in sealed:
            raise FrankError("field added after sealing; the sealed plan is refused",
                             file=path, field=key)
        if key not in now:
            raise FrankError("field removed after sealing; the sealed plan is refused",
                             file=path, field=key)
        if now[key] != sealed[key]:
            raise FrankError("edited after sealing (its hash no longer matches the seal); "
                             "the sealed plan is refused", file=path, field=key)


def verify(trial: Trial, path: Path) -> str:
    """The trial digest of an intact sealed trial; an unsealed or edited one is an error."""
    if trial.seal is None:
        raise FrankError("trial is not sealed: run `frank trial seal` before running or "
                         "deciding it", file=path, field="seal")
    _compare(field_hashes(trial), trial.seal.fields, path)
    digest = content_hash(trial, trial.seal.time)
    if digest != trial.seal.hash:
        raise FrankError(f"content hash {digest} does not match the sealed {trial.seal.hash}",
                         file=path, field="seal.hash")
    return digest


def load_sealed(path: Path) -> tuple[Trial, str]:
    """Read a trial file and check its seal: (trial, trial digest).

    The fields are compared on the raw file first, so an edit that also breaks the schema
    (say, a changed block count) is still reported as the sealed field that changed.
    """
    if path.is_file():
        raw = read_toml(path)
        seal = raw.pop("seal", None)
        fields = seal.get("fields") if isinstance(seal, dict) else None
        if isinstance(fields, dict):
            now = {k: sha256_json(v) for k, v in sorted(_leaves(raw, "").items())}
            _compare(now, {str(k): str(v) for k, v in fields.items()}, path)
    trial = read_trial(path)
    return trial, verify(trial, path)
