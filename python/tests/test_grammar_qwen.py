"""Grammars over a Qwen3 tokenizer at the model's padded logits width (151,936), against llguidance's
own Python package. The tokenizer is built from the BPE ranks in the dashscope wheel
(python/benchmarks/qwen_tokenizer.py); without the package index the tests are skipped."""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

import logits_processing as lp

llguidance = pytest.importorskip("llguidance", reason="llguidance (the differential reference) not installed")
tokenizers = pytest.importorskip("tokenizers")

_spec = importlib.util.spec_from_file_location(
    "qwen_tokenizer", Path(__file__).resolve().parents[1] / "benchmarks" / "qwen_tokenizer.py"
)
qwen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(qwen)

LOGITS = qwen.QWEN_LOGITS
TOKENS = qwen.BPE_TOKENS + len(qwen.ADDED)  # 151,669
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 4},
        "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
    },
    "required": ["name", "age", "tags", "zip"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tokenizer_path() -> str:
    try:
        return str(qwen.qwen_tokenizer_json())
    except qwen.TokenizerUnavailable as e:
        pytest.skip(f"no Qwen tokenizer: {e}")


@pytest.fixture(scope="module")
def hf_tokenizers(tokenizer_path):
    return tokenizers.Tokenizer.from_file(tokenizer_path)


@pytest.fixture(scope="module")
def batch(tokenizer_path):
    return lp.Batch(LOGITS, context=lp.EngineContext(vocab=lp.Vocab(tokenizer_path)))


def test_the_built_tokenizer_is_qwen_s(hf_tokenizers):
    assert hf_tokenizers.get_vocab_size(with_added_tokens=True) == TOKENS
    # Ids a real Qwen2/Qwen3 tokenizer gives.
    assert hf_tokenizers.encode("Hello world!").ids == [9707, 1879, 0]
    assert hf_tokenizers.encode("<|im_start|>hello<|im_end|>").ids == [151644, 14990, 151645]
    for token, id_ in [
        ("<|endoftext|>", 151643),
        ("<|im_end|>", 151645),
        ("<think>", 151667),
        ("</think>", 151668),
    ]:
        assert hf_tokenizers.token_to_id(token) == id_
    for text in [
        '{"name": "Zoë", "age": 12345}',
        "你好，世界 <think>x</think>",
        "  spaces\n\n\ttabs  ",
        "naïve café 🍹",
    ]:
        ids = hf_tokenizers.encode(text).ids
        assert hf_tokenizers.decode(ids, skip_special_tokens=False) == text


def our_mask(batch: lp.Batch, row_ids: list[int]) -> np.ndarray:
    logits = torch.zeros(1, LOGITS)
    batch.apply(logits, [row_ids])
    assert torch.isneginf(logits[0, TOKENS:]).all(), "the padding past the tokenizer is masked out"
    return np.packbits((logits[0] == 0).numpy(), bitorder="little").view(np.uint32)


def test_a_json_schema_mask_at_the_padded_width_equals_llguidance_s(batch, tokenizer_path):
    with open(tokenizer_path) as f:
        ll_tokenizer = llguidance.LLTokenizer(f.read(), n_vocab=LOGITS)
    grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA)
    rng = random.Random(0)
    for walk in range(2):
        batch.add(0, {"kind": "grammar", "json_schema": SCHEMA}, prompt_len=1)
        matcher = llguidance.LLMatcher(ll_tokenizer, grammar, log_level=0)
        ids = [151644]
        for step in range(40):
            theirs = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint32)[: (LOGITS + 31) // 32]
            assert np.array_equal(our_mask(batch, ids), theirs), f"walk {walk} step {step}: ids {ids[1:]}"
            allowed = np.flatnonzero(np.unpackbits(theirs.view(np.uint8), bitorder="little"))
            assert allowed.max() < TOKENS
            token = int(rng.choice(allowed))
            if token == ll_tokenizer.eos_token:
                break
            assert matcher.consume_token(token)
            ids.append(token)
        batch.remove(0)


def test_eos_is_endoftext_unless_im_end_is_given(tokenizer_path, hf_tokenizers):
    """llguidance takes <|endoftext|> as EOS (it reads <|im_end|> as end of turn, not EOS); Qwen3's
    chat models end on <|im_end|> (or either, as their generation config lists both), so that is
    given as eos_token_id or by a transformers tokenizer whose config names it."""
    transformers = pytest.importorskip("transformers")
    with open(tokenizer_path) as f:
        assert llguidance.LLTokenizer(f.read()).eos_tokens == [qwen.ENDOFTEXT]
    chat = transformers.PreTrainedTokenizerFast(tokenizer_file=tokenizer_path, eos_token="<|im_end|>")
    text = json.dumps({"name": "a", "age": 3, "tags": [], "zip": "12345"}, separators=(",", ":"))
    ids = hf_tokenizers.encode(text).ids
    for tokenizer, eos in [
        (tokenizer_path, [qwen.ENDOFTEXT]),
        (lp.Vocab(tokenizer_path, eos_token_id=qwen.IM_END), [qwen.IM_END]),
        (chat, [qwen.IM_END]),
        (lp.Vocab(tokenizer_path, eos_token_id=[qwen.IM_END, qwen.ENDOFTEXT]), [qwen.ENDOFTEXT, qwen.IM_END]),
    ]:
        batch = lp.Batch(LOGITS, context=lp.EngineContext(vocab=lp.Vocab(tokenizer)))
        batch.add(0, {"kind": "grammar", "json_schema": SCHEMA}, prompt_len=0)
        bits = np.unpackbits(our_mask(batch, ids).view(np.uint8), bitorder="little")
        assert np.flatnonzero(bits).tolist() == eos, tokenizer
