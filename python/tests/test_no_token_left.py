"""A step never hands back a row with no finite logit without ``Batch.failure(row)`` saying why:
such a row allows only the engine's EOS ids (or, where none is known, is left as the steps left
it)."""

from __future__ import annotations

import pytest
import torch

import logits_processing as lp

NEG = float("-inf")


def eos_only(vocab: int, eos: list[int]) -> torch.Tensor:
    row = torch.full((vocab,), NEG)
    row[eos] = 0.0
    return row


def test_allowed_ids_all_banned_give_eos_only_and_the_reason_names_the_specs():
    batch = lp.Batch(context=lp.EngineContext(vocab_size=8, eos_token_id=[2, 6]))
    batch.add(0, [{"kind": "ban_tokens", "token_ids": [3]}, {"kind": "allowed_token_ids", "token_ids": [3]}])
    batch.add(1, {"kind": "temperature", "temperature": 0.5})
    logits = torch.arange(16, dtype=torch.float32).reshape(2, 8)
    batch.apply(logits, [[1], [1]])
    assert torch.equal(logits[0], eos_only(8, [2, 6]))
    failure = batch.failure(0)
    assert failure is not None and "[0] ban_tokens, [1] allowed_token_ids" in failure, failure
    assert batch.failure(1) is None


def test_logits_given_with_no_finite_value():
    batch = lp.Batch(context=lp.EngineContext(vocab_size=4, eos_token_id=1))
    batch.add(0, {"kind": "temperature", "temperature": 0.7})
    logits = torch.tensor([[NEG, float("nan"), NEG, NEG]])
    batch.apply(logits, [[0]])
    assert torch.equal(logits[0], eos_only(4, [1]))
    assert "no finite value" in batch.failure(0)


def test_without_eos_the_row_is_left_and_the_failure_says_so():
    batch = lp.Batch(4)
    batch.add(0, [{"kind": "allowed_token_ids", "token_ids": [3]}, {"kind": "ban_tokens", "token_ids": [3]}])
    logits = torch.ones(1, 4)
    batch.apply(logits, [[0]])
    assert torch.isneginf(logits).all()
    assert "no EOS id is known" in batch.failure(0)


def test_a_python_processor_that_empties_the_row_is_named():
    def wipe(ids, row):
        row.fill_(NEG)

    batch = lp.Batch(context=lp.EngineContext(vocab_size=4, eos_token_id=0))
    batch.add(0, [{"kind": "temperature", "temperature": 2.0}, wipe])
    logits = torch.ones(1, 4)
    batch.apply(logits, [[1]])
    assert torch.equal(logits[0], eos_only(4, [0]))
    assert "wipe (a Python processor)" in batch.failure(0)


def test_an_eos_id_outside_the_vocab_is_refused():
    with pytest.raises(lp.TokenOutOfVocabError) as info:
        lp.Batch(4, context=lp.EngineContext(eos_token_id=9))
    assert info.value.field == "eos_token_id"


def test_processor_takes_the_contexts_eos():
    processor = lp.Processor(
        [{"kind": "ban_tokens", "token_ids": [1]}, {"kind": "allowed_token_ids", "token_ids": [1]}],
        context=lp.EngineContext(eos_token_id=3),
    )
    row = torch.ones(5)
    processor([0], row)
    assert torch.equal(row, eos_only(5, [3]))


def test_a_grammar_mask_meeting_a_ban_gives_eos_only(deepseek_tokenizer_json):
    context = lp.EngineContext(str(deepseek_tokenizer_json))
    vocab = context.vocab_size or 129_280
    # Every token the grammar allows first (the digits), banned before it.
    batch = lp.Batch(vocab, context=context)
    grammar = {"kind": "grammar", "regex": "[0-9]"}
    batch.add(0, grammar, prompt_len=0)
    probe = torch.zeros(1, vocab)
    batch.apply(probe, [[]])
    allowed = torch.isfinite(probe[0]).nonzero().flatten().tolist()
    assert allowed and set(allowed).isdisjoint(context.eos_token_ids)

    batch.add(0, [{"kind": "ban_tokens", "token_ids": allowed}, grammar], prompt_len=0)
    logits = torch.zeros(1, vocab)
    batch.apply(logits, [[]])
    assert torch.equal(logits[0], eos_only(vocab, context.eos_token_ids))
    assert "[0] ban_tokens, [1] grammar" in batch.failure(0), batch.failure(0)


def test_a_grammar_row_without_prompt_len_is_refused_naming_it(deepseek_tokenizer_json):
    """Read from 0, the prompt would be taken for output: the grammar would reject it and allow
    only EOS. Refused at admission instead, naming prompt_len and the spec."""
    batch = lp.Batch(129_280, context=lp.EngineContext(str(deepseek_tokenizer_json)))
    specs = [{"kind": "temperature", "temperature": 0.7}, {"kind": "grammar", "regex": "(yes|no)"}]
    assert lp.needs_prompt_len(specs) and not lp.needs_prompt_len(specs[:1])
    with pytest.raises(lp.InvalidArgumentError) as info:
        batch.add(0, specs)
    assert info.value.field == "prompt_len" and "[1] 'grammar'" in str(info.value)
    assert 0 not in batch
    batch.add(0, specs, prompt_len=3)
    with pytest.raises(lp.InvalidArgumentError):
        lp.Processor({"kind": "min_new_tokens", "min_new_tokens": 2, "eos_token_ids": [1]})
