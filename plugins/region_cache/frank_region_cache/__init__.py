"""frank's region cache: a vLLM general plugin that caches prompt-region token ids.

Importing this package is cheap and touches neither vLLM nor torch; `register()` is what
vLLM calls (from the `vllm.general_plugins` entry point) in each of its processes.
"""

from __future__ import annotations

from .core import RegionCache, RegionSplitter, make_region_cache

__all__ = ["RegionCache", "RegionSplitter", "make_region_cache", "register"]
__version__ = "0.1.0"


def register() -> None:
    """vLLM entry point. Idempotent, creates no CUDA context, never raises."""
    from .hook import install

    install()
