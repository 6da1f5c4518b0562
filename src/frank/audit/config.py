"""The image config held to the lock field by field (issue 53).

What the config must be is made again the way ``frank.image.oci.build_image`` makes it: the
base's config (from ``frank.audit.base``: derived from the base's pins, never the cached
base) with the plan's env merged in, its entrypoint and cmd, its labels. Every field of
``config`` is compared, those frank sets and those it leaves as the base has them (User,
WorkingDir, ExposedPorts, Volumes, StopSignal, and any other): an extra ``Env`` entry such as
``LD_PRELOAD``, another ``User`` or an added label is a difference. So are ``architecture``
and ``os``.
"""

from __future__ import annotations

from typing import Any

from frank.assemble.plan import BuildPlan
from frank.audit.report import Difference

NAMED = ("Env", "Entrypoint", "Cmd", "User", "WorkingDir", "Labels", "ExposedPorts",
         "Volumes", "StopSignal")


def expected_config(plan: BuildPlan, base_config: dict[str, Any]) -> dict[str, Any]:
    """The ``config`` object an image built from ``plan`` over this base holds."""
    from frank.image.oci import _merge_env

    cc = dict(base_config.get("config") or {})
    cc["Env"] = _merge_env(list(cc.get("Env") or []), dict(plan.config.env))
    if plan.config.entrypoint:
        cc["Entrypoint"] = list(plan.config.entrypoint)
        cc["Cmd"] = list(plan.config.cmd)
    elif plan.config.cmd:
        cc["Cmd"] = list(plan.config.cmd)
    cc["Labels"] = {**dict(cc.get("Labels") or {}), **dict(plan.config.labels)}
    return cc


def _env(items: list[Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, _, value = str(item).partition("=")
        out[key] = value
    return out


def _shown(value: Any) -> str:
    if value in (None, [], {}, ""):
        return "unset"
    return repr(value)


# What a container engine writes into the config of an image it builds from frank's
# Dockerfile (a step, `--builder buildah|docker`): the template's one ENV, with its fixed
# value, and buildah's version label. Tolerated, never required; nothing else is.
ENGINE_ENV = {"PIP_BREAK_SYSTEM_PACKAGES": "1"}
ENGINE_LABELS = ("io.buildah.version",)


def engine_built(image_config: dict[str, Any]) -> bool:
    """Whether a container engine wrote this config (its label, or docker's fields)."""
    cc = image_config.get("config") or {}
    labels = cc.get("Labels") or {} if isinstance(cc, dict) else {}
    return any(k in labels for k in ENGINE_LABELS) or "container_config" in image_config \
        or "docker_version" in image_config


def config_differences(plan: BuildPlan, base_config: dict[str, Any],
                       image_config: dict[str, Any]) -> list[Difference]:
    """Every field of the image's config that is not what the lock and base make."""
    want = expected_config(plan, base_config)
    have = image_config.get("config") or {}
    if not isinstance(have, dict):
        return [Difference(part="-", path="config", check="config object", lock="an object",
                           image=type(have).__name__)]
    # docker's export keeps no mark of its builder: the template's own ENV, at its one
    # value, is the mark (harmless where a forger adds it; any other value still differs)
    engine = engine_built(image_config) or any(
        _env(list(have.get("Env") or [])).get(k) == v for k, v in ENGINE_ENV.items())
    if engine:
        env = _env(list(have.get("Env") or []))
        extra = [f"{k}={v}" for k, v in ENGINE_ENV.items()
                 if env.get(k) == v and k not in _env(list(want.get("Env") or []))]
        want = {**want, "Env": [*(want.get("Env") or []), *extra]}
        labels = dict(have.get("Labels") or {})
        want["Labels"] = {**dict(want.get("Labels") or {}),
                          **{k: labels[k] for k in ENGINE_LABELS if k in labels}}
    out: list[Difference] = []

    def add(field: str, check: str, lock: Any, image: Any) -> None:
        out.append(Difference(part="-", path=f"config {field}", check=check,
                              lock=_shown(lock), image=_shown(image)))

    fields = list(NAMED) + sorted((set(want) | set(have)) - set(NAMED))
    for field in fields:
        w, h = want.get(field), have.get(field)
        if (w in (None, [], {}, "")) and (h in (None, [], {}, "")):
            continue
        if field == "Env":
            we, he = _env(list(w or [])), _env(list(h or []))
            for key in sorted(set(we) | set(he)):
                if we.get(key) != he.get(key):
                    add("Env", f"env {key}", we.get(key), he.get(key))
            if we == he and list(w or []) != list(h or []) and not engine:
                # (an engine puts the template's ENV between the base's and frank's)
                add("Env", "env order or a name given twice", w, h)
        elif field == "Labels" and isinstance(w, dict) and isinstance(h, dict):
            for key in sorted(set(w) | set(h)):
                if w.get(key) != h.get(key):
                    add("Labels", f"label {key}", w.get(key), h.get(key))
        elif w != h:
            add(field, field.lower(), w, h)
    for top in ("architecture", "os"):
        if base_config.get(top) is not None and image_config.get(top) != base_config.get(top):
            out.append(Difference(part="-", path=f"config {top}", check=top,
                                  lock=str(base_config.get(top)),
                                  image=str(image_config.get(top))))
    return out
