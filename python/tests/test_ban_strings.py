"""ban_strings on the DeepSeek tokenizer: the tokens banned after a generated text are exactly those
whose text completes a banned string, checked against the decoded text of every token."""

from __future__ import annotations

import pytest
import torch

from logits_processing import EngineContext, Processor, SpecError

STRINGS = ["delve", "As an AI", "tapestry"]


@pytest.fixture(scope="module")
def tok(deepseek_hf_tokenizer):
    return deepseek_hf_tokenizer


@pytest.fixture(scope="module")
def context(tok):
    return EngineContext(tok, vocab_size=len(tok))


def completing(tok, generated, strings, case_sensitive=True):
    """The tokens after which the decoded text holds a string it did not hold before."""
    # The kind folds ASCII letters only (str.lower would also fold, e.g., "İ" to "i" + a dot).
    ascii_lower = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
    fold = (lambda s: s) if case_sensitive else (lambda s: s.translate(ascii_lower))
    texts = tok.backend_tokenizer.decode_batch(
        [generated + [t] for t in range(len(tok))], skip_special_tokens=True
    )
    special = set(tok.all_special_ids)
    return {
        t for t, text in enumerate(texts) if t not in special and any(fold(s) in fold(text) for s in strings)
    }


@pytest.mark.parametrize(
    ("generated", "case_sensitive"),
    [
        ("We will de", True),
        ("Let us del", True),
        ("Frankly, as an A", False),
        ("Nothing here", True),
        ("a rich tap", True),
    ],
)
def test_bans_exactly_the_tokens_that_complete_a_string(tok, context, generated, case_sensitive):
    prompt = tok.encode("Write about delve and tapestry.", add_special_tokens=False)
    gen = tok.encode(generated, add_special_tokens=False)
    spec = {"kind": "ban_strings", "strings": STRINGS, "case_sensitive": case_sensitive}
    p = Processor(spec, prompt_len=len(prompt), context=context)
    row = torch.zeros(len(tok))
    p(prompt + gen, row)
    banned = set(torch.isinf(row).nonzero().flatten().tolist())
    assert banned == completing(tok, gen, STRINGS, case_sensitive)
    assert banned, "some token completes a string"


def test_the_state_follows_the_ids_step_by_step(tok, context):
    prompt = tok.encode("Hi.", add_special_tokens=False)
    gen = tok.encode("We will delve into it", add_special_tokens=False)
    running = Processor({"kind": "ban_strings", "strings": STRINGS}, prompt_len=len(prompt), context=context)
    for k in range(len(gen) + 1):
        ids = prompt + gen[:k]
        got, want = torch.zeros(len(tok)), torch.zeros(len(tok))
        running(ids, got)
        Processor({"kind": "ban_strings", "strings": STRINGS}, prompt_len=len(prompt), context=context)(
            ids, want
        )
        assert torch.equal(got, want)


def test_without_token_texts_it_is_refused_naming_the_field():
    with pytest.raises(SpecError) as e:
        Processor({"kind": "ban_strings", "strings": ["x"]}, context=EngineContext(vocab_size=10))
    assert e.value.field == "strings"


# The bytes of derived values (ban_strings' automata among them) an engine context keeps
# (`DERIVED_CACHE_BYTES`, docs/hardening.md).
DERIVED_CACHE_BYTES = 128 << 20


def _rss() -> int:
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.slow
def test_distinct_large_lists_leave_memory_within_the_cache_budget(tok, context):
    """Forty requests, each with its own 1,024 strings of 250 bytes, each run a step and
    dropped: what stays is the cache's budget at most, not each list's automaton."""
    import random

    rand = random.Random(29)
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,;:!?"
    prompt = tok.encode("Say something.", add_special_tokens=False)
    row = torch.zeros(len(tok))

    def request(seed):
        rand.seed(seed)
        strings = ["".join(rand.choices(alphabet, k=250)) for _ in range(1024)]
        p = Processor({"kind": "ban_strings", "strings": strings}, prompt_len=len(prompt), context=context)
        p(prompt + tok.encode(" ab", add_special_tokens=False), row.clone())

    request(-1)  # the environment and the allocator's first arenas
    before = _rss()
    for seed in range(40):
        request(seed)
        grown = _rss() - before
        assert grown <= DERIVED_CACHE_BYTES + (64 << 20), f"after {seed + 1} lists: {grown >> 20} MiB"
