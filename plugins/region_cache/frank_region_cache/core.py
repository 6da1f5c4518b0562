"""Region cache core: split a rendered prompt at atomic added tokens, cache ids per region.

Pure Python, independent of vLLM, so it can be unit-tested with any HF tokenizer.

Why cutting before an added token is exact: a `tokenizers` fast tokenizer first splits the
input on its added tokens (leftmost-longest match), then normalizes, pre-tokenizes and
encodes each remaining segment on its own. A cut placed exactly where a non-normalized
added token starts is therefore a segment boundary of the whole string too, and the ids of
the whole string are the concatenation of the ids of the pieces (with `add_special_tokens`
off; the post-processor's BOS/EOS are applied once, around the join). Tokens whose match
depends on their neighbours (`lstrip`, `single_word`) or on normalization are never cut at,
and no cut is made right after a `single_word`/`rstrip` token either.
"""

from __future__ import annotations

import array
import re
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

EncodeBatch = Callable[[list[str]], list[list[int]]]


class AddedTokenLike(Protocol):
    """The fields of `tokenizers.AddedToken` that decide whether a cut is safe."""

    content: str
    lstrip: bool
    rstrip: bool
    single_word: bool
    normalized: bool
    special: bool


@dataclass(frozen=True)
class CutToken:
    """One added token as the splitter sees it."""

    content: str
    cut_before: bool  # may a region start at this token?
    blocks_cut_after: bool  # would a cut right after it change its match?


def cut_tokens_from_added(
    added: Iterable[AddedTokenLike], encode_special_tokens: bool = False
) -> list[CutToken]:
    """Classify a tokenizer's non-normalized added tokens.

    Normalized added tokens are matched after normalization inside segments, so they never
    create a boundary we could use and are left out; they cannot span one either. With
    `encode_special_tokens` (transformers' split_special_tokens) special tokens are plain
    text to the tokenizer, so they are left out as well.
    """
    out: dict[str, CutToken] = {}
    for tok in added:
        if tok.normalized or not tok.content:
            continue
        if encode_special_tokens and tok.special:
            continue
        out[tok.content] = CutToken(
            content=tok.content,
            cut_before=not (tok.lstrip or tok.single_word),
            blocks_cut_after=bool(tok.single_word),
        )
    return list(out.values())


class RegionSplitter:
    """Cut text before each safe added token, matching the tokenizer's own leftmost-longest
    scan over *all* non-normalized added tokens (so a short token inside a longer one is
    not mistaken for a cut point)."""

    def __init__(self, tokens: Sequence[CutToken]) -> None:
        self.tokens = {t.content: t for t in tokens}
        ordered = sorted(self.tokens, key=len, reverse=True)
        self._re = re.compile("|".join(re.escape(t) for t in ordered)) if ordered else None

    def split(self, text: str) -> list[str]:
        """Regions whose concatenation is `text`; empty regions are dropped."""
        if self._re is None or not text:
            return [text] if text else []
        cuts: list[int] = []
        prev_end = -1
        prev_blocks = False
        for m in self._re.finditer(text):
            tok = self.tokens[m.group()]
            start = m.start()
            if tok.cut_before and start > 0 and not (prev_blocks and prev_end == start):
                cuts.append(start)
            prev_end, prev_blocks = m.end(), tok.blocks_cut_after
        if not cuts:
            return [text]
        regions = []
        last = 0
        for c in cuts:
            regions.append(text[last:c])
            last = c
        regions.append(text[last:])
        return regions


@dataclass
class Stats:
    """Counters, readable from outside through `RegionCache.snapshot()`."""

    requests: int = 0
    hits: int = 0
    misses: int = 0
    hit_tokens: int = 0
    miss_tokens: int = 0
    evictions: int = 0
    too_large: int = 0
    entries: int = 0
    bytes_held: int = 0
    max_entries: int = 0
    max_bytes: int = 0
    verify_mismatches: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


# The OrderedDict's own cost per entry (hash slot, entry, linked-list node), estimated
# for CPython 3.11 so that many tiny regions cannot slip past the byte bound.
ENTRY_OVERHEAD = 112


def entry_bytes(key: str, ids: array.array[int]) -> int:
    """Memory an entry holds: the key string, the packed ids (object headers included) and
    the dict's per-entry overhead."""
    return sys.getsizeof(key) + sys.getsizeof(ids) + ENTRY_OVERHEAD


class RegionCache:
    """LRU from region text to token ids, bounded by entry count and by bytes held.

    `encode_batch` must encode texts WITHOUT the post-processor's special tokens; the caller
    adds those around the joined ids. Only misses reach `encode_batch`, in one call.
    Thread-safe: the dict is guarded by a lock; encoding runs outside it.
    """

    def __init__(
        self,
        encode_batch: EncodeBatch,
        splitter: RegionSplitter,
        max_entries: int = 4096,
        max_bytes: int = 512 * 1024 * 1024,
        min_region_chars: int = 0,
    ) -> None:
        if max_entries < 0 or max_bytes < 0:
            raise ValueError("cache bounds must be >= 0")
        self.encode_batch = encode_batch
        self.splitter = splitter
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.min_region_chars = min_region_chars
        self._lru: OrderedDict[str, array.array[int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.stats = Stats(max_entries=max_entries, max_bytes=max_bytes)

    def encode(self, text: str) -> list[int]:
        """Ids of `text` (no special tokens added), from cached regions where possible."""
        regions = self.splitter.split(text)
        found: list[array.array[int] | list[int] | None] = []
        missing: list[int] = []
        with self._lock:
            self.stats.requests += 1
            for i, region in enumerate(regions):
                ids = self._lru.get(region)
                if ids is None:
                    found.append(None)
                    missing.append(i)
                else:
                    self._lru.move_to_end(region)
                    found.append(ids)
                    self.stats.hits += 1
                    self.stats.hit_tokens += len(ids)
        if missing:
            encoded = self.encode_batch([regions[i] for i in missing])
            with self._lock:
                for i, ids_list in zip(missing, encoded, strict=True):
                    packed = array.array("i", ids_list)
                    found[i] = ids_list  # joining the list skips re-boxing the ints
                    self.stats.misses += 1
                    self.stats.miss_tokens += len(packed)
                    self._put(regions[i], packed)
        out: list[int] = []
        for piece in found:
            assert piece is not None
            out.extend(piece)
        return out

    def _put(self, key: str, ids: array.array[int]) -> None:
        """Insert under the lock, then evict least recently used until both bounds hold."""
        if len(key) < self.min_region_chars:
            return
        size = entry_bytes(key, ids)
        if size > self.max_bytes or self.max_entries == 0:
            self.stats.too_large += 1
            return
        old = self._lru.pop(key, None)
        if old is not None:
            self._bytes -= entry_bytes(key, old)
        self._lru[key] = ids
        self._bytes += size
        while len(self._lru) > self.max_entries or self._bytes > self.max_bytes:
            k, v = self._lru.popitem(last=False)
            self._bytes -= entry_bytes(k, v)
            self.stats.evictions += 1
        self.stats.entries = len(self._lru)
        self.stats.bytes_held = self._bytes

    def clear(self) -> None:
        """Drop every entry; counters other than entries/bytes are kept."""
        with self._lock:
            self._lru.clear()
            self._bytes = 0
            self.stats.entries = 0
            self.stats.bytes_held = 0

    def regions(self) -> list[str]:
        """Cached region texts, least recently used first (for tests)."""
        with self._lock:
            return list(self._lru)

    def snapshot(self) -> dict[str, Any]:
        """A consistent copy of the counters."""
        with self._lock:
            return asdict(self.stats)


# --- adapting an HF tokenizer -------------------------------------------------------------


def added_tokens_of(tokenizer: Any) -> list[AddedTokenLike]:
    """Added tokens of a `tokenizers.Tokenizer` or a transformers fast tokenizer."""
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    get = getattr(backend, "get_added_tokens_decoder", None)
    if get is None:
        raise TypeError(f"{type(tokenizer).__name__} has no fast (tokenizers) backend")
    return list(get().values())


def backend_of(tokenizer: Any) -> Any:
    """The `tokenizers.Tokenizer` behind a transformers fast tokenizer (or itself)."""
    return getattr(tokenizer, "backend_tokenizer", tokenizer)


def backend_encode_batch(tokenizer: Any) -> EncodeBatch:
    """Encode missed regions in one call to the Rust backend, without special tokens.

    `encode_batch_fast` (tokenizers >= 0.21) skips offset tracking, which nobody reads here
    and which costs about a fifth of the encode; the ids are the same. Older tokenizers
    fall back to `encode_batch`.
    """
    backend = backend_of(tokenizer)
    fast = getattr(backend, "encode_batch_fast", None)
    batch = fast if callable(fast) else backend.encode_batch

    def encode_batch(texts: list[str]) -> list[list[int]]:
        return [e.ids for e in batch(texts, add_special_tokens=False)]

    return encode_batch


def special_affixes(encode: Callable[[str, bool], list[int]]) -> tuple[list[int], list[int]]:
    """Ids the post-processor puts before and after a text (e.g. BOS), found by probing.

    Raises ValueError when the post-processor does more than add a fixed prefix/suffix
    (then cached ids could not be made equal, and the caller must not cache).
    """
    probes = ["a", "hello world", "x\ny  z", "0123"]
    result: tuple[list[int], list[int]] | None = None
    for p in probes:
        with_sp, without = encode(p, True), encode(p, False)
        n = len(without)
        found = None
        for start in range(len(with_sp) - n + 1):
            if with_sp[start : start + n] == without:
                found = (with_sp[:start], with_sp[start + n :])
                break
        if found is None or (result is not None and found != result):
            raise ValueError("post-processor is not a fixed prefix/suffix")
        result = found
    assert result is not None
    return result


def make_region_cache(
    tokenizer: Any,
    max_entries: int = 4096,
    max_bytes: int = 512 * 1024 * 1024,
) -> RegionCache:
    """A RegionCache for a `tokenizers.Tokenizer` or transformers fast tokenizer."""
    encode_special = bool(getattr(backend_of(tokenizer), "encode_special_tokens", False))
    splitter = RegionSplitter(cut_tokens_from_added(added_tokens_of(tokenizer), encode_special))
    return RegionCache(backend_encode_batch(tokenizer), splitter, max_entries, max_bytes)
