"""Unit tests of the region cache core and its vLLM hook, without vLLM.

The reference is always the tokenizer itself on the whole text: cached ids must equal it.
Tokenizers are trained here with `tokenizers` (no download). A deliberately wrong splitter
runs through the same check to show the check can fail.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
PLUGIN_SRC = REPO / "plugins" / "region_cache"
if str(PLUGIN_SRC) not in sys.path:
    sys.path.insert(0, str(PLUGIN_SRC))
TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from fixtures.tiny_model import (  # noqa: E402
    BOS,
    IM_END,
    IM_START,
    build_tokenizer,
    synthetic_corpus,
)
from frank_region_cache import hook as hook_mod  # noqa: E402
from frank_region_cache.core import (  # noqa: E402
    CutToken,
    RegionCache,
    RegionSplitter,
    backend_encode_batch,
    cut_tokens_from_added,
    entry_bytes,
    make_region_cache,
    special_affixes,
)
from tokenizers import (  # noqa: E402
    AddedToken,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    trainers,
)

# --- tokenizers under test ------------------------------------------------------------------


@pytest.fixture(scope="module")
def bpe() -> Tokenizer:
    """The tiny model's tokenizer: byte-level BPE, llama-3 split, BOS post-processor."""
    return build_tokenizer()


def _metaspace_tokenizer(prepend_scheme: str) -> Tokenizer:
    """SentencePiece-like (llama-2/mistral style) BPE: spaces become '▁', prefix added."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme=prepend_scheme)
    tok.decoder = decoders.Metaspace(prepend_scheme=prepend_scheme)
    trainer = trainers.BpeTrainer(
        vocab_size=1500,
        special_tokens=["<unk>", "<s>", "</s>", "[INST]", "[/INST]"],
        show_progress=False,
    )
    tok.train_from_iterator(synthetic_corpus(seed=1, lines=3000), trainer)
    return tok


@pytest.fixture(scope="module")
def metaspace_first() -> Tokenizer:
    return _metaspace_tokenizer("first")


@pytest.fixture(scope="module")
def metaspace_always() -> Tokenizer:
    return _metaspace_tokenizer("always")


@pytest.fixture(scope="module")
def tricky() -> Tokenizer:
    """The BPE plus added tokens whose flags make some cuts unsafe."""
    tok = build_tokenizer()
    tok.add_special_tokens(
        [
            AddedToken("<mask>", lstrip=True, rstrip=False, normalized=False, special=True),
            AddedToken("<eat>", lstrip=False, rstrip=True, normalized=False, special=True),
            AddedToken("tool", single_word=True, normalized=False, special=True),
            AddedToken("<|im", normalized=False, special=True),  # prefix of <|im_start|>
        ]
    )
    tok.add_tokens([AddedToken("frobnicate", normalized=True)])
    return tok


def ref_ids(tok: Tokenizer, text: str, special: bool = False) -> list[int]:
    return tok.encode(text, add_special_tokens=special).ids


# --- prompts ---------------------------------------------------------------------------------

SPECIAL_TEXT = [BOS, IM_START, IM_END, "<mask>", "<eat>", "<|im", "[INST]", "[/INST]", "<s>"]


def region_contents(rng: random.Random) -> list[str]:
    """Region bodies covering the edge cases named in the issue."""
    long_region = "\n".join(synthetic_corpus(seed=7, lines=150))
    return [
        long_region,  # repeats between prompts
        long_region[:-1] + "X",  # changed by one character
        "x" + long_region[1:],
        "",  # empty
        " ",
        "\n",
        "  leading spaces",
        "trailing spaces  ",
        "trailing newlines\n\n",
        "\t\ttabs\t",
        "ünïcødé 東京 数据 🚀🚀 — «quotes» ½",
        "emoji at edge 🚀",
        "🚀 at start",
        f"text with {IM_START} inside",  # special-token text inside content
        f"{IM_END}{IM_END}",
        f"{BOS}{IM_START}user{IM_END}",
        "a <mask> b <mask>c   <mask>",
        "eat <eat>   spaces <eat>\n",
        "the tool call tooling tool_x (tool)",
        "<|im <|im_start <|im_start|",  # prefixes of special tokens
        "frobnicate the frobnicated",
        "[INST] inst [/INST] <s> sp",
        "1234567890 000 12",
        "'s 're 've don't",
        " ".join(rng.choice(["def", "x", "=", "(", ")", "\n", "  "]) for _ in range(60)),
    ]


def make_prompts(n: int, seed: int = 0) -> list[str]:
    """Chat-like prompts: control tokens between regions drawn from `region_contents`."""
    rng = random.Random(seed)
    bodies = region_contents(rng)
    roles = ["system", "user", "assistant", "tool", ""]
    prompts = []
    for _ in range(n):
        parts = [rng.choice(["", BOS, "prefix text "])]
        for _ in range(rng.randint(1, 6)):
            sep_before = rng.choice(["", " ", "\n", "  "])
            sep_after = rng.choice(["\n", "", " "])
            parts.append(
                f"{sep_before}{IM_START}{rng.choice(roles)}{sep_after}"
                f"{rng.choice(bodies)}{IM_END}{rng.choice(['', chr(10), ' '])}"
            )
        if rng.random() < 0.5:
            parts.append(f"{IM_START}assistant\n")
        if rng.random() < 0.3:
            parts.append(rng.choice(SPECIAL_TEXT) + rng.choice(bodies)[:40])
        prompts.append("".join(parts))
    return prompts


def mismatches(cache: RegionCache, tok: Tokenizer, prompts: list[str]) -> int:
    """How many prompts the cache gets wrong (each prompt twice: miss, then hit)."""
    bad = 0
    for p in prompts:
        want = ref_ids(tok, p)
        for _ in range(2):
            if cache.encode(p) != want:
                bad += 1
    return bad


# --- exactness ---------------------------------------------------------------------------------


@pytest.mark.parametrize("tok_name", ["bpe", "metaspace_first", "metaspace_always", "tricky"])
def test_cached_ids_equal_uncached(tok_name: str, request: pytest.FixtureRequest) -> None:
    tok: Tokenizer = request.getfixturevalue(tok_name)
    cache = make_region_cache(tok, max_entries=64, max_bytes=4 << 20)
    prompts = make_prompts(300, seed=hash(tok_name) % 1000)
    assert mismatches(cache, tok, prompts) == 0
    s = cache.snapshot()
    assert s["hits"] > s["misses"] > 0  # the check really went through the cache


def test_single_region_edits_match(bpe: Tokenizer) -> None:
    """Every one-character edit around a cut point of a long shared region stays exact."""
    cache = make_region_cache(bpe)
    head = f"{BOS}{IM_START}system\n" + "\n".join(synthetic_corpus(seed=3, lines=40))
    tail = f"{IM_END}\n{IM_START}user\nquestion{IM_END}\n{IM_START}assistant\n"
    base = head + tail
    cut = len(head)
    for i in range(cut - 6, cut + 8):
        for ch in ["", " ", "\n", "a", "🚀", "<"]:
            p = base[:i] + ch + base[i + 1 :]
            assert cache.encode(p) == ref_ids(bpe, p), (i, ch)


def test_post_processor_bos_once(bpe: Tokenizer) -> None:
    """add_special_tokens=True adds BOS exactly once around the joined ids (no double BOS)."""
    prefix, suffix = special_affixes(lambda t, sp: ref_ids(bpe, t, sp))
    assert prefix == [bpe.token_to_id(BOS)] and suffix == []
    cache = make_region_cache(bpe)
    for p in make_prompts(50, seed=5):
        assert prefix + cache.encode(p) + suffix == ref_ids(bpe, p, True)


def test_special_affixes_rejects_non_affix_post_processor() -> None:
    def weird(text: str, sp: bool) -> list[int]:
        ids = [ord(c) for c in text]
        return ids[::-1] if sp and len(ids) > 1 else ids

    with pytest.raises(ValueError):
        special_affixes(weird)


def test_split_special_tokens_are_not_cut(bpe: Tokenizer) -> None:
    """With encode_special_tokens the specials are plain text: no cut may be made there."""
    tok = Tokenizer.from_str(bpe.to_str())
    tok.encode_special_tokens = True
    cache = make_region_cache(tok)
    assert not cache.splitter.tokens
    prompts = make_prompts(30, seed=9)
    assert mismatches(cache, tok, prompts) == 0


def test_splitter_cuts_only_before_safe_tokens(tricky: Tokenizer) -> None:
    cache = make_region_cache(tricky)
    sp = cache.splitter
    text = f"a{IM_START}b<mask>c<eat>d tool{IM_START}e<|im f{IM_END}"
    regions = sp.split(text)
    assert "".join(regions) == text
    # lstrip/single_word tokens never start a region; a region never starts right after
    # a single_word token; "<|im" inside "<|im_start|>" is not a cut.
    assert regions == [
        "a",
        f"{IM_START}b<mask>c",
        "<eat>d tool" + IM_START + "e",
        "<|im f",
        IM_END,
    ]
    assert sp.split("") == []


# --- the check can fail --------------------------------------------------------------------


class EveryNChars(RegionSplitter):
    """Wrong on purpose: cuts every n characters, through words and merges."""

    def __init__(self, n: int) -> None:
        super().__init__([])
        self.n = n

    def split(self, text: str) -> list[str]:
        return [text[i : i + self.n] for i in range(0, len(text), self.n)]


class CutAfterSpecials(RegionSplitter):
    """Wrong on purpose: also cuts before lstrip tokens (ignores the flags)."""

    def __init__(self, tokens: list[CutToken]) -> None:
        super().__init__([CutToken(t.content, True, False) for t in tokens])


def test_wrong_splitters_are_caught(bpe: Tokenizer, tricky: Tokenizer) -> None:
    prompts = make_prompts(100, seed=11)
    wrong = RegionCache(backend_encode_batch(bpe), EveryNChars(7))
    assert mismatches(wrong, bpe, prompts) > 0
    added = list(tricky.get_added_tokens_decoder().values())
    flagless = RegionCache(
        backend_encode_batch(tricky), CutAfterSpecials(cut_tokens_from_added(added))
    )
    assert mismatches(flagless, tricky, prompts) > 0


def test_stale_entry_is_caught(bpe: Tokenizer) -> None:
    """A cache that returned another region's ids would be caught by the same check."""
    cache = make_region_cache(bpe)
    p = f"{IM_START}user\nhello{IM_END}"
    cache.encode(p)
    key = f"{IM_START}user\nhello"
    with cache._lock:
        cache._lru[key] = cache._lru[key][:-1]
    assert cache.encode(p) != ref_ids(bpe, p)


# --- LRU bounds and counters ----------------------------------------------------------------


def _regions(n: int, size: int = 200) -> list[str]:
    return [f"{IM_START}r{i}\n" + (f"w{i} ") * size for i in range(n)]


def test_lru_entry_bound(bpe: Tokenizer) -> None:
    cache = make_region_cache(bpe, max_entries=3, max_bytes=1 << 30)
    r = _regions(5, 10)
    for x in r[:3]:
        cache.encode(x)
    cache.encode(r[0])  # r0 is now most recent; r1 is the LRU
    cache.encode(r[3])
    cache.encode(r[4])
    assert cache.regions() == [r[0], r[3], r[4]]
    s = cache.snapshot()
    assert s["entries"] == 3 and s["evictions"] == 2


def test_lru_byte_bound(bpe: Tokenizer) -> None:
    r = _regions(6, 300)
    one = entry_bytes(r[0], __import__("array").array("i", ref_ids(bpe, r[0])))
    cache = make_region_cache(bpe, max_entries=100, max_bytes=int(one * 2.5))
    for x in r:
        cache.encode(x)
        s = cache.snapshot()
        assert s["bytes_held"] <= cache.max_bytes
        with cache._lock:
            assert s["bytes_held"] == sum(entry_bytes(k, v) for k, v in cache._lru.items())
    assert cache.regions() == r[-2:]
    assert cache.snapshot()["evictions"] == 4
    # an entry larger than the whole bound is served but not stored
    big = f"{IM_START}big\n" + "z " * 5000
    assert cache.encode(big) == ref_ids(bpe, big)
    assert big not in cache.regions() and cache.snapshot()["too_large"] == 1


def test_counters(bpe: Tokenizer) -> None:
    cache = make_region_cache(bpe)
    a, b, c = f"{IM_START}a\nalpha", f"{IM_START}b\nbeta", f"{IM_START}c\ngamma"
    cache.encode(a + b)
    cache.encode(a + c)
    cache.encode(a + b + c)
    s = cache.snapshot()
    assert (s["requests"], s["hits"], s["misses"], s["entries"]) == (3, 4, 3, 3)
    assert s["hit_tokens"] == 2 * len(ref_ids(bpe, a)) + len(ref_ids(bpe, b)) + len(ref_ids(bpe, c))
    assert s["miss_tokens"] == sum(len(ref_ids(bpe, x)) for x in (a, b, c))


def test_bounds_validated(bpe: Tokenizer) -> None:
    with pytest.raises(ValueError):
        make_region_cache(bpe, max_entries=-1)


# --- the hook, against fake renderers shaped like vLLM's ----------------------------------


class HFLike:
    """The slice of a transformers fast tokenizer the hook uses."""

    def __init__(self, tok: Tokenizer) -> None:
        self.backend_tokenizer = tok
        self.calls = 0

    def __call__(self, text: str, add_special_tokens: bool = True, **kw: Any) -> dict[str, Any]:
        self.calls += 1
        enc = self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens)
        ids = enc.ids
        if kw.get("truncation") and kw.get("max_length") is not None:
            ids = ids[: kw["max_length"]]
        return {"input_ids": ids}

    def encode(self, text: str, **kw: Any) -> list[int]:
        return list(self(text, **kw)["input_ids"])


class Params:
    def __init__(self, add_special_tokens: bool = False, max_length: int | None = None) -> None:
        self.add_special_tokens = add_special_tokens
        self.max_length = max_length

    def get_encode_kwargs(self) -> dict[str, Any]:
        return {
            "truncation": self.max_length is not None,
            "max_length": self.max_length,
            "add_special_tokens": self.add_special_tokens,
        }


def _renderer_classes() -> tuple[type, type, type]:
    """Fresh classes each call, so wrapping one does not leak into other tests."""

    class Renderer032:  # vllm 0.32/0.33 shape
        def __init__(self, tok: HFLike) -> None:
            self.tok = tok

        def get_tokenizer(self) -> HFLike:
            return self.tok

        def _wants_offsets(self, prompt: Any, params: Any) -> bool:
            return bool(prompt.get("offsets"))

        @staticmethod
        def _build_tokens_prompt(ids: Any, prompt: Any, offset_mapping: Any = None) -> Any:
            return {"prompt_token_ids": list(ids), **prompt}

        def _tokenize_prompt(self, prompt: Any, params: Any) -> Any:
            enc = self.get_tokenizer()(prompt["prompt"], **params.get_encode_kwargs())
            return self._build_tokens_prompt(enc["input_ids"], prompt)

    class Renderer024:  # vllm 0.24 shape
        def __init__(self, tok: HFLike) -> None:
            self.tok = tok

        def get_tokenizer(self) -> HFLike:
            return self.tok

        def _encode(self, *args: Any, **kwargs: Any) -> list[int]:
            return self.get_tokenizer().encode(*args, **kwargs)

        def _tokenize_prompt(self, prompt: Any, params: Any) -> Any:
            ids = self.get_tokenizer().encode(prompt["prompt"], **params.get_encode_kwargs())
            return {"prompt_token_ids": ids, **prompt}

        async def _tokenize_prompt_async(self, prompt: Any, params: Any) -> Any:
            return self._tokenize_prompt(prompt, params)

    class RendererUnknown:
        def render(self) -> None:
            pass

    return Renderer032, Renderer024, RendererUnknown


def _settings(tmp_path: Path, verify: bool = False) -> hook_mod.Settings:
    return hook_mod.Settings(
        max_entries=100, max_bytes=1 << 24, stats_path=str(tmp_path / "s.json"), verify=verify
    )


@pytest.mark.parametrize("shape", ["0.32", "0.24"])
def test_hook_wraps_renderer(shape: str, bpe: Tokenizer, tmp_path: Path) -> None:
    r032, r024, _ = _renderer_classes()
    cls = r032 if shape == "0.32" else r024
    uncached = cls(HFLike(bpe))
    h = hook_mod.install_on(cls, _settings(tmp_path))
    assert h is not None and h.mode == ("call" if shape == "0.32" else "encode")
    assert hook_mod.install_on(cls, _settings(tmp_path)) is None  # idempotent: no re-wrap
    stats = json.loads((tmp_path / "s.json").read_text())
    assert stats["installed"] and stats["requests"] == 0
    tok = HFLike(bpe)
    r = cls(tok)
    prompts = make_prompts(40, seed=13)
    for p in prompts * 2:
        for sp in (False, True):
            got = r._tokenize_prompt({"prompt": p}, Params(sp, max_length=100_000))
            assert got["prompt_token_ids"] == ref_ids(bpe, p, sp)
            assert got["prompt"] == p
    if shape == "0.24":
        assert r._encode(prompts[0], add_special_tokens=True) == ref_ids(bpe, prompts[0], True)
    stats = json.loads((tmp_path / "s.json").read_text())
    assert stats["hits"] > 0 and stats["misses"] > 0 and stats["mode"] == h.mode
    assert stats["bytes_held"] <= stats["max_bytes"]
    # truncation that would cut: the tokenizer's own path runs, ids still equal
    calls = tok.calls
    got = r._tokenize_prompt({"prompt": prompts[0]}, Params(True, max_length=5))
    assert got["prompt_token_ids"] == ref_ids(bpe, prompts[0], True)[:5]
    assert tok.calls > calls
    del uncached


def test_hook_verify_mode_serves_vllm_ids_on_mismatch(bpe: Tokenizer, tmp_path: Path) -> None:
    r032, _, _ = _renderer_classes()
    h = hook_mod.install_on(r032, _settings(tmp_path, verify=True))
    assert h is not None
    r = r032(HFLike(bpe))
    p = f"{IM_START}user\nhello{IM_END}"
    r._tokenize_prompt({"prompt": p}, Params())
    tc = h.cache_for(r.tok)
    assert tc is not None
    with tc.cache._lock:  # corrupt an entry: verify mode must catch it and serve the truth
        k = f"{IM_START}user\nhello"
        tc.cache._lru[k] = tc.cache._lru[k][:-1]
    got = r._tokenize_prompt({"prompt": p}, Params())
    assert got["prompt_token_ids"] == ref_ids(bpe, p)
    assert h.snapshot()["verify_mismatches"] == 1


def test_hook_unknown_shape_is_logged_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _, _, unknown = _renderer_classes()
    with caplog.at_level("ERROR", logger="vllm.frank_region_cache"):
        assert hook_mod.install_on(unknown, _settings(tmp_path)) is None
    assert "hook NOT active" in caplog.text
    assert not (tmp_path / "s.json").exists()


def test_hook_bypasses_tokenizer_failing_self_check(bpe: Tokenizer, tmp_path: Path) -> None:
    """A tokenizer whose whole-text ids differ from the joined region ids is served uncached."""

    class Merging(HFLike):
        def __call__(self, text: str, add_special_tokens: bool = True, **kw: Any) -> Any:
            out = super().__call__(text, add_special_tokens, **kw)
            return {"input_ids": out["input_ids"][::-1]}  # not region-decomposable

    r032, _, _ = _renderer_classes()
    h = hook_mod.install_on(r032, _settings(tmp_path))
    assert h is not None
    tok = Merging(bpe)
    r = r032(tok)
    p = f"{IM_START}user\nhello{IM_END}{IM_START}x"
    assert (
        r._tokenize_prompt({"prompt": p}, Params())["prompt_token_ids"]
        == tok(p, False)["input_ids"]
    )
    assert h.cache_for(tok) is None and h.snapshot()["requests"] == 0


def test_settings_from_env() -> None:
    s = hook_mod.Settings.from_env(
        {
            hook_mod.ENV_MAX_ENTRIES: "7",
            hook_mod.ENV_MAX_BYTES: "1000",
            hook_mod.ENV_STATS: "/x/y.json",
            hook_mod.ENV_VERIFY: "1",
        }
    )
    assert s == hook_mod.Settings(7, 1000, "/x/y.json", True)
    d = hook_mod.Settings.from_env({})
    assert (d.max_entries, d.max_bytes, d.stats_path, d.verify) == (
        hook_mod.DEFAULT_MAX_ENTRIES,
        hook_mod.DEFAULT_MAX_BYTES,
        None,
        False,
    )


def test_plugin_entry_point_declared() -> None:
    import tomllib

    meta = tomllib.loads((PLUGIN_SRC / "pyproject.toml").read_text())
    eps = meta["project"]["entry-points"]["vllm.general_plugins"]
    assert eps == {"region_cache": "frank_region_cache:register"}
    assert meta["project"]["name"] == "frank_region_cache"
