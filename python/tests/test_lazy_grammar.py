"""Lazy grammars over a Qwen3 tokenizer at the model's padded logits width (151,936), step by step
against llguidance's own Python matcher fed the text after each trigger: free text untouched, a
trigger (whole, as Qwen's `<tool_call>` token, split over several tokens, or ending inside one),
the grammar's masks while it runs, its end, then free text again. The tokenizer is built from the
BPE ranks in the dashscope wheel (python/benchmarks/qwen_tokenizer.py); without the package index
the tests are skipped."""

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
TOOL_CALL, END_TOOL_CALL = 151657, 151658
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"enum": ["get_weather", "search"]},
        "arguments": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 10}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "arguments"],
    "additionalProperties": False,
}
TRIGGERS = [
    {"begin": "<tool_call>", "grammar": {"json_schema": SCHEMA}, "end": "</tool_call>"},
    {"begin": "<answer>", "grammar": {"regex": "[0-9]{1,4}"}, "end": "</answer>"},
]
SPEC = {"kind": "lazy_grammar", "triggers": TRIGGERS}


@pytest.fixture(scope="module")
def tokenizer_path() -> str:
    try:
        return str(qwen.qwen_tokenizer_json())
    except qwen.TokenizerUnavailable as e:
        pytest.skip(f"no Qwen tokenizer: {e}")


@pytest.fixture(scope="module")
def hf(tokenizer_path):
    return tokenizers.Tokenizer.from_file(tokenizer_path)


@pytest.fixture(scope="module")
def ll_tokenizer(tokenizer_path):
    with open(tokenizer_path) as f:
        return llguidance.LLTokenizer(f.read(), n_vocab=LOGITS)


@pytest.fixture(scope="module")
def batch(tokenizer_path):
    return lp.Batch(LOGITS, context=lp.EngineContext(vocab=lp.Vocab(tokenizer_path)))


def reference_grammar(trigger: dict, ll_tokenizer) -> str:
    """The trigger's grammar followed by its end, as llguidance's own grammar list (the end's
    text also as the special token of that name, which a literal does not match)."""
    body = dict(trigger["grammar"])
    if "regex" in body:
        body = {"lark_grammar": f"start: /{body['regex']}/"}
    end = json.dumps(trigger["end"])
    special = {"</tool_call>": END_TOOL_CALL}.get(trigger["end"])
    if special is not None and ll_tokenizer.is_special_token(special):
        end = f"({end} | <[{special}]>)"
    return json.dumps({"grammars": [{"lark_grammar": f"start: @body {end}"}, {"name": "body", **body}]})


class Reference:
    """What the spec means, written from its definition: watch the output's text for a begin
    (a special token's text its name); then llguidance's matcher of that trigger's grammar, fed
    the rest of the token the begin ended in, then each token, until it is stopped."""

    def __init__(self, ll_tokenizer):
        self.tok = ll_tokenizer
        self.grammars = [reference_grammar(t, ll_tokenizer) for t in TRIGGERS]
        self.text = b""
        self.matcher = None

    def push(self, token: int) -> None:
        piece = self.tok.decode_bytes([token])
        if self.matcher is None:
            self.text += piece
            hits = [
                (self.text.find(t["begin"].encode()) + len(t["begin"]), i)
                for i, t in enumerate(TRIGGERS)
                if t["begin"].encode() in self.text
            ]
            if hits:
                end, i = min(hits)
                self.matcher = llguidance.LLMatcher(self.tok, self.grammars[i], log_level=0)
                lead = self.text[end:]
                if lead:
                    assert self.matcher.consume_tokens(self.tok.tokenize_bytes(lead)), lead
                self.text = b""
        else:
            assert self.matcher.consume_token(token), self.matcher.get_error()
        if self.matcher is not None and self.matcher.is_stopped():
            self.matcher = None

    def mask(self) -> np.ndarray | None:
        if self.matcher is None:
            return None
        return np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint32)[: (LOGITS + 31) // 32]


def our_mask(batch: lp.Batch, ids: list[int]) -> np.ndarray | None:
    """The row's allowed tokens as a bitmask, or None when the row is left as it was."""
    logits = torch.zeros(1, LOGITS)
    batch.apply(logits, [ids])
    if (logits == 0).all():
        return None
    assert torch.isneginf(logits[0, TOKENS:]).all(), "the padding past the tokenizer is masked out"
    return np.packbits((logits[0] == 0).numpy(), bitorder="little").view(np.uint32)


def allowed(mask: np.ndarray) -> np.ndarray:
    return np.flatnonzero(np.unpackbits(mask.view(np.uint8), bitorder="little"))


def walk(batch, hf, ll_tokenizer, parts: list, seed: int) -> list[int]:
    """Feeds `parts` (text to encode, a token id, or None: a grammar run sampled from
    llguidance's masks until it is complete), comparing the masks at every step."""
    rng = random.Random(seed)
    reference = Reference(ll_tokenizer)
    ids = [151644]
    batch.add(0, SPEC, prompt_len=1)
    steps = 0

    def step(token: int) -> None:
        nonlocal steps
        ids.append(token)
        reference.push(token)
        theirs, ours = reference.mask(), our_mask(batch, ids)
        steps += 1
        if theirs is None:
            assert ours is None, f"step {steps}: the row is constrained in free text, ids {ids[1:]}"
        else:
            assert ours is not None and np.array_equal(ours, theirs), f"step {steps}: ids {ids[1:]}"

    try:
        assert our_mask(batch, ids) is None
        for part in parts:
            if part is None:
                assert reference.matcher is not None, "a grammar run where no trigger fired"
                while reference.matcher is not None:
                    choices = allowed(reference.mask())
                    assert choices.max() < TOKENS and len(choices) > 0
                    step(int(rng.choice(choices)))
            else:
                for token in [part] if isinstance(part, int) else hf.encode(part).ids:
                    step(token)
    finally:
        batch.remove(0)
    return ids


def test_tool_calls_in_free_text_have_llguidance_s_masks(batch, hf, ll_tokenizer):
    for seed in range(3):
        ids = walk(
            batch,
            hf,
            ll_tokenizer,
            [
                "Let me check the weather for you. ",
                TOOL_CALL,  # the model's own <tool_call> token
                None,
                "\nThe answer is ",
                "<answer>",  # spelled out: '<', 'answer', '>'
                None,
                " degrees. Another <tool",  # split over tokens, ending in '>{"' (its rest fed)
                "_call",
                88863,
                None,
                " done.",
            ],
            seed,
        )
        text = hf.decode(ids[1:], skip_special_tokens=False)
        call = text.split("<tool_call>")[1].split("</tool_call>")[0]
        assert json.loads(call)["name"] in ("get_weather", "search"), text
        assert text.split("<answer>")[1].split("</answer>")[0].isdigit(), text


def test_a_trigger_in_the_middle_of_a_token_feeds_its_rest_to_the_grammar(batch, hf, ll_tokenizer):
    assert ll_tokenizer.decode_bytes([88863]) == b'>{"'
    ids = [151644] + hf.encode("x <tool_call").ids + [88863]
    batch.add(0, SPEC, prompt_len=1)
    try:
        mask = our_mask(batch, ids)
    finally:
        batch.remove(0)
    matcher = llguidance.LLMatcher(ll_tokenizer, reference_grammar(TRIGGERS[0], ll_tokenizer), log_level=0)
    assert matcher.consume_tokens(ll_tokenizer.tokenize_bytes(b'{"'))
    theirs = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint32)[: (LOGITS + 31) // 32]
    assert np.array_equal(mask, theirs)
    # Only a property name can come: the '{"' is already written.
    texts = {ll_tokenizer.decode_bytes([int(t)]) for t in allowed(mask)}
    assert b'{"' not in texts and any(t.startswith(b"name") or b"name".startswith(t) for t in texts)


def test_id_triggers_and_a_rejected_token(batch, hf, ll_tokenizer):
    spec = {"kind": "lazy_grammar", "triggers": [{"begin": [TOOL_CALL], "grammar": {"regex": "[0-9]+"}}]}
    batch.add(0, spec, prompt_len=1)
    try:
        assert our_mask(batch, [151644] + hf.encode("a <tool_call> b").ids[:1]) is None
        mask = our_mask(batch, [151644, 64, TOOL_CALL])
        matcher = llguidance.LLMatcher(ll_tokenizer, llguidance.LLMatcher.grammar_from_regex("[0-9]+"), log_level=0)
        theirs = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint32)[: (LOGITS + 31) // 32]
        assert np.array_equal(mask, theirs)
        # A letter where digits must come: only EOS from then on, and the row says why.
        mask = our_mask(batch, [151644, 64, TOOL_CALL, 64])
        assert list(allowed(mask)) == [ll_tokenizer.eos_token]
        assert "not allowed" in batch.failure(0)
    finally:
        batch.remove(0)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"kind": "lazy_grammar", "triggers": []}, "triggers"),
        ({"kind": "lazy_grammar", "triggers": [{"begin": "", "grammar": {"regex": "a"}}]}, "triggers[0].begin"),
        ({"kind": "lazy_grammar", "triggers": [{"begin": "a", "grammar": {}}]}, "triggers[0].grammar"),
        (
            {"kind": "lazy_grammar", "triggers": [{"begin": "a", "grammar": {"regex": "a"}, "end": [10**9]}]},
            "triggers[0].end",
        ),
    ],
)
def test_bad_specs_name_the_field(batch, spec, field):
    with pytest.raises(lp.SpecError) as e:
        batch.add(0, spec, prompt_len=1)
    assert e.value.field.startswith(field), e.value.field


def test_the_kind_masks_and_needs_token_texts_so_adapters_give_it_the_tokenizer():
    info = lp.kind_info("lazy_grammar")
    assert info["masks"] and info["needs_token_texts"] and info["reads_history"]
    assert lp.needs_token_texts([SPEC]) and lp.needs_prompt_len([SPEC])
    # A mask: refused after a truncation, as the grammar kind is.
    with pytest.raises(lp.SpecError) as e:
        lp.validate_specs([{"kind": "top_p", "p": 0.9}, SPEC])
    assert e.value.field == "[1].kind"
    assert [s["kind"] for s in lp.canonical_order([{"kind": "top_p", "p": 0.9}, SPEC])] == ["lazy_grammar", "top_p"]
