"""What a kind is, asked of the core's registry (``kind_info``, ``needs_token_texts``): the one
list of kinds, which the adapters ask instead of keeping names."""

import json
import re
from pathlib import Path

import pytest

import logits_processing as lp
from logits_processing.cli import _example, kinds_table

QUESTIONS = ("reads_history", "masks", "truncates", "needs_token_texts", "edits_on_host")


def examples():
    """Each kind's example spec, the one its description opens with."""
    table = {k["kind"]: k for k in kinds_table(json.loads(lp._lib.spec_schema()))}
    return {name: _example(table[name]["description"]) for name in lp.kinds()}


def test_every_kind_answers_each_question():
    for kind in lp.kinds():
        info = lp.kind_info(kind)
        assert list(info) == list(QUESTIONS), kind
        assert all(isinstance(v, bool) for v in info.values()), kind
    with pytest.raises(lp.SpecError, match="unknown kind 'nope'"):
        lp.kind_info("nope")


def test_the_spec_questions_are_the_kinds_answers():
    """``reads_history`` and ``needs_token_texts`` of a kind's example spec are what its registry
    entry says."""
    for kind, spec in examples().items():
        assert spec is not None, f"{kind}'s description opens with no example spec"
        info = lp.kind_info(kind)
        assert lp.reads_history(spec) == info["reads_history"], kind
        assert lp.needs_token_texts(spec) == info["needs_token_texts"], kind


def test_the_registry_says_which_kinds_mask_truncate_and_need_token_texts():
    # Not a list kept here: a few kinds each answer, the rest is the core's test over every kind.
    assert lp.kind_info("allowed_token_ids")["masks"] and not lp.kind_info("ban_tokens")["masks"]
    assert lp.kind_info("top_k")["truncates"] and not lp.kind_info("temperature")["truncates"]
    assert lp.kind_info("ban_strings")["needs_token_texts"]
    assert not lp.kind_info("ban_tokens")["needs_token_texts"]
    assert lp.needs_token_texts([{"kind": "temperature", "temperature": 0.5}, {"kind": "dry", "multiplier": 0.8}])
    assert not lp.needs_token_texts([])
    assert lp.kind_info("tail_free")["edits_on_host"] and not lp.kind_info("top_p")["edits_on_host"]


def test_the_device_docs_name_the_kinds_edited_on_host():
    """docs/cuda.md's paragraph on the kinds the kernels do not carry names exactly the kinds
    whose registry entry says some of their steps are edited on the host."""
    text = (Path(__file__).parents[2] / "docs" / "cuda.md").read_text()
    paragraph = text.split("**Kinds the kernel does not have.**")[1].split("\n\n")[0]
    named = set(re.findall(r"`([a-z_]+)`", paragraph)) & set(lp.kinds())
    assert named == {k for k in lp.kinds() if lp.kind_info(k)["edits_on_host"]}


def test_a_mask_after_any_truncating_kind_is_refused():
    """``masks`` and ``truncates`` are what the order check asks: a masking kind listed after
    any truncating kind is refused, naming both."""
    mask = {"kind": "allowed_token_ids", "token_ids": [1, 2]}
    specs = examples()
    truncating = [k for k in lp.kinds() if lp.kind_info(k)["truncates"]]
    assert len(truncating) > 5
    for kind in truncating:
        with pytest.raises(lp.SpecError, match=f"after the truncation step .*'{kind}'"):
            lp.Batch(64).add(0, [specs[kind], mask], prompt_len=0)
