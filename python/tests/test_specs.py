"""validate_specs: the specs an engine receives, checked as a Batch would admit them."""

from __future__ import annotations

import json

import pytest

from logits_processing import (
    EngineContext,
    SpecError,
    ThinkingTokenConfig,
    TokenOutOfVocabError,
    validate_specs,
)

REFERENCE_FORM = {"kind": "forced_sequence", "token_ids": [1, 2, 3], "eos_token_id": 2}


def test_accepts_the_reference_form_and_every_kind():
    validate_specs(REFERENCE_FORM)
    validate_specs(json.dumps(REFERENCE_FORM))
    validate_specs(
        [
            {"kind": "temperature", "temperature": 0.7},
            {"kind": "hello_world", "position": "tokens"},
            {"kind": "thinking_budget", "max_thinking_tokens": 100},
            {"kind": "ban_tokens", "token_ids": [5, 6]},
            {"kind": "logit_bias", "bias": {"7": -1.5}},
        ],
        context=EngineContext(vocab_size=100, hello_world=([4, 5], 1), thinking_tokens=ThinkingTokenConfig(1, 2, 3)),
    )


# Specs admission refuses, and the field each error names (test_cli.py checks the command line
# gives the same verdicts).
BAD_SPECS = [
    ({"kind": "nope"}, "kind"),
    ({"token_ids": []}, "kind"),
    ({"kind": "forced_sequence", "token_ids": [1]}, "eos_token_id"),
    ({"kind": "forced_sequence", "token_ids": "1", "eos_token_id": 2}, "token_ids"),
    ({"kind": "forced_sequence", "token_ids": [1, -4], "eos_token_id": 2}, "token_ids[1]"),
    ({"kind": "forced_sequence", "token_ids": [1], "eos_token_id": 2, "eos": 3}, "eos"),
    ({"kind": "temperature", "temperature": "hot"}, "temperature"),
    ([{"kind": "temperature", "temperature": 1}, {"kind": "ban_tokens"}], "[1].token_ids"),
    ('[{"kind": "temperature", "temperature": 1}, {"kind": "ban_tokens"}]', "[1].token_ids"),
    ("not json", "spec"),
    ([{"kind": "hello_world"}], "[0].kind"),
    ([lambda ids, logits: None], "[0]"),
]


@pytest.mark.parametrize("specs, field", BAD_SPECS)
def test_errors_name_the_field(specs, field):
    with pytest.raises(SpecError) as info:
        validate_specs(specs)
    assert info.value.field == field


def test_vocab_is_checked_when_given():
    validate_specs(REFERENCE_FORM)
    with pytest.raises(TokenOutOfVocabError) as info:
        validate_specs(REFERENCE_FORM, context=EngineContext(vocab_size=3))
    assert info.value.token_id == 3 and info.value.vocab_size == 3


def test_size_limits():
    with pytest.raises(SpecError):
        validate_specs({"kind": "ban_tokens", "token_ids": [1] * 70_000})
    with pytest.raises(SpecError):
        validate_specs([{"kind": "ban_tokens", "token_ids": []}] * 65)
