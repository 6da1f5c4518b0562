"""Resolve a hub branch or tag to its 40-hex revision: the local cache first, then the hub."""

from __future__ import annotations

import os
import re
from pathlib import Path

from frank.errors import FrankError

_HEX40 = re.compile(r"[0-9a-f]{40}")


def cache_dir() -> Path:
    """The hub cache folder huggingface-hub uses (HF_HUB_CACHE, HF_HOME, or the default)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    return home / "hub"


def resolve_revision(repo_id: str, ref: str) -> str:
    """The revision hash ``ref`` points to: read from the cache's refs, else asked of the hub."""
    if _HEX40.fullmatch(ref):
        return ref
    refs = cache_dir() / f"models--{repo_id.replace('/', '--')}" / "refs" / ref
    if refs.is_file():
        value = refs.read_text().strip()
        if _HEX40.fullmatch(value):
            return value
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise FrankError(f"{repo_id}@{ref} is not in the hub cache {cache_dir()} "
                         "and HF_HUB_OFFLINE=1")
    try:
        from huggingface_hub import HfApi

        sha = HfApi().model_info(repo_id, revision=ref).sha
    except Exception as exc:  # the hub client raises many types; one line is what matters
        raise FrankError(f"hub lookup of {repo_id}@{ref} failed: "
                         f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                         ) from None
    if not sha or not _HEX40.fullmatch(sha):
        raise FrankError(f"hub gave no revision hash for {repo_id}@{ref}")
    return sha
