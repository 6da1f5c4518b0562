"""The vLLM side: wrap the renderer's prompt tokenization with the region cache.

Why feature detection and not version checks: the chat tokenization path moved between
releases (0.32/0.33: `BaseRenderer._tokenize_prompt` calls `tokenizer(...)` and its async
twin is built from it per instance; 0.24: `_tokenize_prompt` calls `tokenizer.encode` and
the async path goes through `BaseRenderer._encode`). We wrap whatever shape is present, and
if none is, we log an error and leave vLLM untouched: a missing cache must not stop a server.

Every cached result can be checked against vLLM's own tokenization
(FRANK_REGION_CACHE_VERIFY=1); a tokenizer that fails the start-up self-check is served
uncached.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .core import RegionCache, make_region_cache, special_affixes

# A child of vLLM's logger, so it shows in the server log with vLLM's own handlers.
log = logging.getLogger("vllm.frank_region_cache")

ENV_MAX_ENTRIES = "FRANK_REGION_CACHE_MAX_ENTRIES"
ENV_MAX_BYTES = "FRANK_REGION_CACHE_MAX_BYTES"
ENV_STATS = "FRANK_REGION_CACHE_STATS"
ENV_VERIFY = "FRANK_REGION_CACHE_VERIFY"
DEFAULT_MAX_ENTRIES = 4096
DEFAULT_MAX_BYTES = 1 << 30

_HANDLED_KWARGS = {"add_special_tokens", "truncation", "max_length"}


@dataclass(frozen=True)
class Settings:
    """Settings read from the environment once, at install time."""

    max_entries: int
    max_bytes: int
    stats_path: str | None
    verify: bool

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        e = os.environ if env is None else env
        return cls(
            max_entries=int(e.get(ENV_MAX_ENTRIES, DEFAULT_MAX_ENTRIES)),
            max_bytes=int(e.get(ENV_MAX_BYTES, DEFAULT_MAX_BYTES)),
            stats_path=e.get(ENV_STATS) or None,
            verify=e.get(ENV_VERIFY, "0") not in ("", "0", "false", "no"),
        )


class TokenizerCache:
    """A region cache for one tokenizer, plus the BOS/EOS the post-processor adds."""

    def __init__(self, tokenizer: Any, settings: Settings) -> None:
        self.tokenizer = tokenizer
        self.cache: RegionCache = make_region_cache(
            tokenizer, settings.max_entries, settings.max_bytes
        )
        self.prefix, self.suffix = special_affixes(
            lambda text, sp: list(tokenizer(text, add_special_tokens=sp)["input_ids"])
        )

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        ids = self.cache.encode(text)
        if add_special_tokens and (self.prefix or self.suffix):
            return [*self.prefix, *ids, *self.suffix]
        return ids

    def self_check(self) -> str | None:
        """Compare against the tokenizer on probes built from its own added tokens.

        Returns a description of the first mismatch, or None. Runs on a scratch cache so
        the real counters start at zero.
        """
        specials = sorted(self.cache.splitter.tokens)[:8]
        bodies = ["", "hello", " world ", "\n\n", "  x\ty ", "ünï 東京 🚀", "a" * 50]
        probes = [b + s + b2 for s in specials for b in bodies[:4] for b2 in bodies]
        probes.append("".join(s + "text " + s for s in specials))
        scratch = make_region_cache(self.tokenizer)
        for p in probes:
            for sp in (False, True):
                want = list(self.tokenizer(p, add_special_tokens=sp)["input_ids"])
                got = scratch.encode(p)
                if sp:
                    got = [*self.prefix, *got, *self.suffix]
                if got != want:
                    return f"probe {p!r} add_special_tokens={sp}: {got} != {want}"
        return None


class Hook:
    """Process-wide state: one TokenizerCache per tokenizer object, counters, stats file."""

    def __init__(self, settings: Settings, mode: str) -> None:
        self.settings = settings
        self.mode = mode
        self._caches: dict[int, TokenizerCache | None] = {}
        self._lock = threading.Lock()
        self.fallbacks = 0
        self.mismatches = 0
        self._error_logged = False

    def cache_for(self, tokenizer: Any) -> TokenizerCache | None:
        """The cache of this tokenizer, built and self-checked on first use; None = bypass."""
        key = id(tokenizer)
        with self._lock:
            if key in self._caches:
                known = self._caches[key]
                return known if known is not None and known.tokenizer is tokenizer else None
        tc: TokenizerCache | None
        try:
            tc = TokenizerCache(tokenizer, self.settings)
            problem = tc.self_check()
        except Exception as exc:  # an unusual tokenizer: serve it uncached
            tc, problem = None, f"{type(exc).__name__}: {exc}"
        if problem is not None:
            log.error("frank_region_cache: tokenizer not cached (self-check): %s", problem)
            tc = None
        else:
            assert tc is not None
            log.info(
                "frank_region_cache: caching %s (%d cut tokens, max_entries=%d, max_bytes=%d)",
                type(tokenizer).__name__,
                sum(t.cut_before for t in tc.cache.splitter.tokens.values()),
                self.settings.max_entries,
                self.settings.max_bytes,
            )
        with self._lock:
            self._caches[key] = tc
        return tc

    def encode(
        self, tokenizer: Any, text: Any, kwargs: dict[str, Any], reference: Callable[[], Any]
    ) -> list[int] | None:
        """Cached ids, or None when vLLM's own path must run (and then nothing is cached)."""
        if not isinstance(text, str) or set(kwargs) - _HANDLED_KWARGS:
            return None
        try:
            tc = self.cache_for(tokenizer)
            if tc is None:
                return None
            ids = tc.encode(text, bool(kwargs.get("add_special_tokens", True)))
            max_length = kwargs.get("max_length")
            if kwargs.get("truncation") and max_length is not None and len(ids) > max_length:
                self.fallbacks += 1  # the tokenizer would truncate: let it
                return None
            if self.settings.verify:
                want = list(reference())
                if want != ids:
                    self.mismatches += 1
                    tc.cache.stats.verify_mismatches += 1
                    log.error("frank_region_cache: ids differ from vLLM's; served vLLM's")
                    ids = want
            return ids
        except Exception:
            if not self._error_logged:
                log.exception("frank_region_cache: cache path failed; serving uncached")
                self._error_logged = True
            self.fallbacks += 1
            return None
        finally:
            self.write_stats()

    def snapshot(self) -> dict[str, Any]:
        """Counters summed over tokenizers, for the stats file and /metrics."""
        total: dict[str, Any] = {
            "requests": 0,
            "hits": 0,
            "misses": 0,
            "hit_tokens": 0,
            "miss_tokens": 0,
            "evictions": 0,
            "too_large": 0,
            "entries": 0,
            "bytes_held": 0,
            "verify_mismatches": 0,
        }
        with self._lock:
            caches = [c for c in self._caches.values() if c is not None]
        for c in caches:
            snap = c.cache.snapshot()
            for k in total:
                total[k] += snap[k]
        total |= {
            "installed": True,
            "mode": self.mode,
            "pid": os.getpid(),
            "time": time.time(),
            "max_entries": self.settings.max_entries,
            "max_bytes": self.settings.max_bytes,
            "verify": self.settings.verify,
            "fallbacks": self.fallbacks,
            "tokenizers": len(caches),
        }
        return total

    def write_stats(self, only_if_absent: bool = False) -> None:
        """Rewrite the stats file atomically (temp file + rename) so readers never see
        half a file."""
        path = self.settings.stats_path
        if not path or (only_if_absent and os.path.exists(path)):
            return
        try:
            d = os.path.dirname(os.path.abspath(path))
            os.makedirs(d, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=d, prefix=".region-cache-", suffix=".json")
            with os.fdopen(fd, "w") as f:
                json.dump(self.snapshot(), f)
            os.replace(tmp, path)
        except OSError:
            log.exception("frank_region_cache: cannot write stats to %s", path)


_HOOK: Hook | None = None
_INSTALL_LOCK = threading.Lock()


def _wrap_tokenize_prompt_call(base: type, hook: Hook) -> None:
    """0.32/0.33: `_tokenize_prompt(self, prompt, params)` calls `tokenizer(text, **kw)`."""
    orig = base._tokenize_prompt  # type: ignore[attr-defined]

    @functools.wraps(orig)
    def _tokenize_prompt(self: Any, prompt: Any, params: Any) -> Any:
        if not isinstance(prompt, dict) or self._wants_offsets(prompt, params):
            return orig(self, prompt, params)
        tokenizer = self.get_tokenizer()
        kwargs = params.get_encode_kwargs()
        text = prompt.get("prompt")
        ids = hook.encode(tokenizer, text, kwargs, lambda: tokenizer(text, **kwargs)["input_ids"])
        if ids is None:
            return orig(self, prompt, params)
        return self._build_tokens_prompt(ids, prompt, offset_mapping=None)

    _tokenize_prompt.__frank_region_cache__ = True  # type: ignore[attr-defined]
    base._tokenize_prompt = _tokenize_prompt  # type: ignore[attr-defined]


def _wrap_encode(base: type, hook: Hook) -> None:
    """0.24: `_tokenize_prompt` calls `tokenizer.encode(text, **kw)`; the async path calls
    `self._encode(text, **kw)`, which calls `tokenizer.encode`. Wrap both."""
    orig_tp = base._tokenize_prompt  # type: ignore[attr-defined]
    orig_enc = base._encode  # type: ignore[attr-defined]

    @functools.wraps(orig_tp)
    def _tokenize_prompt(self: Any, prompt: Any, params: Any) -> Any:
        if not isinstance(prompt, dict):
            return orig_tp(self, prompt, params)
        tokenizer = self.get_tokenizer()
        kwargs = params.get_encode_kwargs()
        text = prompt.get("prompt")
        ids = hook.encode(tokenizer, text, kwargs, lambda: tokenizer.encode(text, **kwargs))
        if ids is None:
            return orig_tp(self, prompt, params)
        return {"prompt_token_ids": ids, **prompt}

    @functools.wraps(orig_enc)
    def _encode(self: Any, *args: Any, **kwargs: Any) -> Any:
        if len(args) != 1:
            return orig_enc(self, *args, **kwargs)
        tokenizer = self.get_tokenizer()
        ids = hook.encode(tokenizer, args[0], kwargs, lambda: tokenizer.encode(args[0], **kwargs))
        return orig_enc(self, *args, **kwargs) if ids is None else ids

    for fn in (_tokenize_prompt, _encode):
        fn.__frank_region_cache__ = True  # type: ignore[attr-defined]
    base._tokenize_prompt = _tokenize_prompt  # type: ignore[attr-defined]
    base._encode = _encode  # type: ignore[attr-defined]


def detect_mode(base: type) -> str:
    """Which tokenization shape this vLLM's BaseRenderer has: 'call', 'encode' or 'none'."""
    has_tp = callable(getattr(base, "_tokenize_prompt", None))
    if (
        has_tp
        and callable(getattr(base, "_tokenize_prompt_async", None))
        and callable(getattr(base, "_encode", None))
    ):
        return "encode"  # 0.24: an async twin of its own that calls _encode
    if has_tp and callable(getattr(base, "_build_tokens_prompt", None)):
        return "call"  # 0.32/0.33: async twin made per instance from _tokenize_prompt
    return "none"


def install_on(base: type, settings: Settings) -> Hook | None:
    """Wrap `base` (a BaseRenderer-shaped class) unless it is wrapped already."""
    if getattr(getattr(base, "_tokenize_prompt", None), "__frank_region_cache__", False):
        return None
    mode = detect_mode(base)
    if mode == "none":
        log.error(
            "frank_region_cache: no known prompt tokenization path on %s; hook NOT active",
            base.__qualname__,
        )
        return None
    hook = Hook(settings, mode)
    if mode == "call":
        _wrap_tokenize_prompt_call(base, hook)
    else:
        _wrap_encode(base, hook)
    hook.write_stats(only_if_absent=True)
    log.info("frank_region_cache: installed (mode=%s, pid=%d)", mode, os.getpid())
    return hook


def install() -> Hook | None:
    """Wrap vLLM's BaseRenderer once per process. Idempotent; never raises."""
    global _HOOK
    with _INSTALL_LOCK:
        if _HOOK is not None:
            return _HOOK
        try:
            from vllm.renderers.base import BaseRenderer
        except Exception as exc:
            log.error(
                "frank_region_cache: vllm.renderers.base.BaseRenderer not importable (%s); "
                "hook NOT active",
                exc,
            )
            return None
        try:
            hook = install_on(BaseRenderer, Settings.from_env())
        except Exception:
            log.exception("frank_region_cache: install failed; hook NOT active")
            return None
        if hook is not None:
            _register_metrics(hook)
            _HOOK = hook
            if os.environ.get("VLLM_USE_RUST_FRONTEND", "0") not in ("", "0"):
                log.error(
                    "frank_region_cache: VLLM_USE_RUST_FRONTEND is set; the Rust front end "
                    "does not tokenize through BaseRenderer, so the cache will see no requests"
                )
        return _HOOK


def current_hook() -> Hook | None:
    """The installed hook of this process, if any."""
    return _HOOK


def _register_metrics(hook: Hook) -> None:
    """Expose the counters on vLLM's /metrics (prometheus default registry), if present."""
    try:
        from prometheus_client import REGISTRY
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
        )
    except Exception:
        return

    class _Collector:
        def collect(self) -> Any:
            s = hook.snapshot()
            for name in ("hits", "misses", "requests", "evictions"):
                yield CounterMetricFamily(
                    f"frank_region_cache_{name}", f"region cache {name}", value=s[name]
                )
            for name in ("entries", "bytes_held"):
                yield GaugeMetricFamily(
                    f"frank_region_cache_{name}", f"region cache {name}", value=s[name]
                )

    try:
        REGISTRY.register(_Collector())
    except Exception:
        log.debug("frank_region_cache: metrics not registered", exc_info=True)
