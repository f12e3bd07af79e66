"""Dynamo's module paths, names and request keys: code written against
``dynamo.logits_processing`` imports the same submodules and names from ``logits_processing``,
and the adapters accept Dynamo's request keys and entry shapes beside ours."""

from __future__ import annotations

import importlib
import random

import pytest

import logits_processing as lp
from logits_processing.adapters import DYNAMO_SPEC_KEY, SPEC_KEY, request_payload

SUBMODULES = {
    "base": ["BaseLogitsProcessor"],
    "thinking_budget": ["ThinkingBudgetLogitsProcessor"],
    "thinking_tokens": [
        "THINKING_TOKEN_CONFIGS",
        "ThinkingTokenConfig",
        "get_thinking_token_config",
        "register_thinking_token_config",
    ],
    "examples": ["ForcedSequenceLogitsProcessor", "HelloWorldLogitsProcessor", "TemperatureProcessor"],
    "examples.forced_sequence": ["ForcedSequenceLogitsProcessor"],
    "examples.hello_world": ["HelloWorldLogitsProcessor", "RESPONSE"],
    "examples.temperature": ["TemperatureProcessor"],
}


@pytest.mark.parametrize("module", sorted(SUBMODULES))
def test_the_reference_submodules_import_with_their_names(module):
    mod = importlib.import_module(f"logits_processing.{module}")
    for name in SUBMODULES[module]:
        assert hasattr(mod, name), f"logits_processing.{module}.{name}"


def test_one_object_per_name_whatever_the_path():
    from logits_processing.examples import TemperatureProcessor
    from logits_processing.examples.temperature import TemperatureProcessor as T2
    from logits_processing.thinking_budget import ThinkingBudgetLogitsProcessor
    from logits_processing.thinking_tokens import ThinkingTokenConfig

    assert TemperatureProcessor is T2
    assert ThinkingBudgetLogitsProcessor is lp.ThinkingBudgetLogitsProcessor
    assert ThinkingTokenConfig is lp.ThinkingTokenConfig


def test_the_reference_submodules_where_installed():
    """Where the reference package has a submodule, ours exports at least its public names."""
    pytest.importorskip("dynamo.logits_processing")
    checked = 0
    for module in SUBMODULES:
        try:
            ref = importlib.import_module(f"dynamo.logits_processing.{module}")
        except ImportError:
            continue  # the 1.6.1 wheel has no thinking_budget / thinking_tokens
        ours = importlib.import_module(f"logits_processing.{module}")
        public = [n for n in getattr(ref, "__all__", dir(ref)) if not n.startswith("_")]
        for name in public:
            if isinstance(getattr(ref, name), type(importlib)):
                continue  # a submodule re-exported as an attribute
            if name in ("BaseLogitsProcessor", "PreTrainedTokenizerBase", "Sequence", "torch"):
                continue  # imported helpers, not the module's own names
            assert hasattr(ours, name), f"logits_processing.{module}.{name}"
        checked += 1
    assert checked >= 4


def test_thinking_token_configs_table():
    from logits_processing.thinking_tokens import THINKING_TOKEN_CONFIGS, ThinkingTokenConfig

    assert list(THINKING_TOKEN_CONFIGS)[:4] == ["deepseek", "qwen3", "glm4", "glm-4"]
    assert THINKING_TOKEN_CONFIGS["deepseek"] == ThinkingTokenConfig(128798, 128799, 201)
    assert THINKING_TOKEN_CONFIGS["qwen3"] == ThinkingTokenConfig(151667, 151668, 198)
    assert lp.get_thinking_token_config("Qwen/Qwen3-8B") is THINKING_TOKEN_CONFIGS["qwen3"]


def test_writing_the_table_is_what_register_does():
    from logits_processing.thinking_tokens import THINKING_TOKEN_CONFIGS, ThinkingTokenConfig

    THINKING_TOKEN_CONFIGS["direct-write-model"] = ThinkingTokenConfig(21, 22, 23)
    assert lp.get_thinking_token_config("org/Direct-Write-Model-1B") == ThinkingTokenConfig(21, 22, 23)
    lp.register_thinking_token_config("Other-Key-Model", ThinkingTokenConfig(31, 32, 33))
    assert THINKING_TOKEN_CONFIGS["other-key-model"] == ThinkingTokenConfig(31, 32, 33)
    with pytest.raises(TypeError, match="THINKING_TOKEN_CONFIGS"):
        THINKING_TOKEN_CONFIGS["bad"] = (1, 2, 3)
    # A core-built batch sees the registered ids (the table is shared with the Rust side).
    assert lp._lib.thinking_token_ids("org/other-key-model-7b") == ((31, 32, 33), "other-key-model")


def _reference_thinking_state(start, end, ids):
    """The reference's ``_get_thinking_state``, written out."""
    start_idx = -1
    for i in range(len(ids) - 1, -1, -1):
        if ids[i] == start:
            start_idx = i
            break
    if start_idx == -1:
        return False, 0
    for i in range(start_idx + 1, len(ids)):
        if ids[i] == end:
            return False, 0
    return True, len(ids) - start_idx - 1


def test_get_thinking_state_matches_the_reference():
    from logits_processing.thinking_budget import ThinkingBudgetLogitsProcessor

    rng = random.Random(5)
    p = ThinkingBudgetLogitsProcessor(1, 2, 3, 10)
    assert p._get_thinking_state([7, 1, 4, 4]) == (True, 2)
    assert p._get_thinking_state([1, 4, 2, 5]) == (False, 0)
    assert p._get_thinking_state([1, 4, 2, 1, 5]) == (True, 1)
    assert p._get_thinking_state([]) == (False, 0)
    for _ in range(300):
        ids = [rng.randrange(6) for _ in range(rng.randrange(12))]
        assert p._get_thinking_state(ids) == _reference_thinking_state(1, 2, ids), ids


def test_get_thinking_state_against_the_reference_package_where_installed():
    ref = pytest.importorskip("dynamo.logits_processing.thinking_budget", reason="the 1.6.1 wheel lacks it")
    rng = random.Random(6)
    ours = lp.ThinkingBudgetLogitsProcessor(1, 2, 3, 10)
    theirs = ref.ThinkingBudgetLogitsProcessor(1, 2, 3, 10)
    for _ in range(200):
        ids = [rng.randrange(6) for _ in range(rng.randrange(12))]
        assert ours._get_thinking_state(ids) == theirs._get_thinking_state(ids)


DYNAMO_ENTRY = {"kind": "forced_sequence", "token_ids": [5, 6], "eos_token_id": 2}


def test_request_payload_reads_either_key():
    assert request_payload(None) is None
    assert request_payload({}) is None
    assert request_payload({"other": 1}) is None
    assert request_payload({SPEC_KEY: '[{"kind": "temperature", "temperature": 0.5}]'}) == (
        '[{"kind": "temperature", "temperature": 0.5}]'
    )
    assert request_payload({DYNAMO_SPEC_KEY: [DYNAMO_ENTRY]}) == [DYNAMO_ENTRY]
    # Dynamo clears its key (or leaves it empty) when a request has no entries.
    assert request_payload({DYNAMO_SPEC_KEY: []}) is None


def test_dynamo_generation_only_marking_is_accepted():
    marked = {**DYNAMO_ENTRY, "generation_only": True}
    assert request_payload({DYNAMO_SPEC_KEY: [marked]}) == [DYNAMO_ENTRY]
    spec_shape = {"entries": [DYNAMO_ENTRY], "generation_only": True}
    assert request_payload({DYNAMO_SPEC_KEY: spec_shape}) == [DYNAMO_ENTRY]
    with pytest.raises(TypeError, match="dynamo_logits"):
        request_payload({DYNAMO_SPEC_KEY: {"entries": [DYNAMO_ENTRY], "skip": 1}})
    # Ours and Dynamo's together: ours first.
    both = request_payload({SPEC_KEY: [{"kind": "temperature", "temperature": 0.5}], DYNAMO_SPEC_KEY: [marked]})
    assert both == [{"kind": "temperature", "temperature": 0.5}, DYNAMO_ENTRY]


def test_dynamo_entries_run_like_the_reference():
    """Dynamo's forced_sequence entry, realized by our batch, forces what the reference's
    ForcedSequenceLogitsProcessor forces (count by calls, then EOS)."""
    torch = pytest.importorskip("torch")
    batch = lp.Batch(8)
    batch.add(0, request_payload({DYNAMO_SPEC_KEY: [{**DYNAMO_ENTRY, "generation_only": True}]}))
    picks = []
    for _ in range(4):
        logits = torch.zeros(1, 8)
        batch.apply(logits, [[1] + picks])
        picks.append(int(logits[0].argmax()))
    assert picks == [5, 6, 2, 2]


def test_every_write_to_the_table_reaches_the_core():
    from collections.abc import MutableMapping

    from logits_processing.thinking_tokens import THINKING_TOKEN_CONFIGS as table
    from logits_processing.thinking_tokens import ThinkingTokenConfig

    core = lp._lib.thinking_token_ids
    assert isinstance(table, MutableMapping) and not isinstance(table, dict)
    table.update({"update-model": ThinkingTokenConfig(41, 42, 43)})
    assert core("org/update-model-1b") == ((41, 42, 43), "update-model")
    table.update(kwarg_update_model=ThinkingTokenConfig(44, 45, 46))
    assert core("kwarg_update_model") == ((44, 45, 46), "kwarg_update_model")
    assert table.setdefault("setdefault-model", ThinkingTokenConfig(51, 52, 53)) == ThinkingTokenConfig(51, 52, 53)
    assert core("setdefault-model") == ((51, 52, 53), "setdefault-model")
    # setdefault on a key there keeps its entry, here and in the core.
    assert table.setdefault("setdefault-model", ThinkingTokenConfig(1, 1, 1)) == ThinkingTokenConfig(51, 52, 53)
    assert core("setdefault-model") == ((51, 52, 53), "setdefault-model")
    # A key is the core's, lower-cased; what the core holds is what the table reads.
    table["Mixed-Case-Model"] = ThinkingTokenConfig(61, 62, 63)
    assert "mixed-case-model" in table and table["Mixed-Case-Model"] == ThinkingTokenConfig(61, 62, 63)
    assert list(table) == [key for key, _ in lp._lib.thinking_token_table()]
    assert len(table) == len(lp._lib.thinking_token_table())
    with pytest.raises(TypeError, match="THINKING_TOKEN_CONFIGS"):
        table.update({"bad-update": (1, 2, 3)})
    assert "bad-update" not in table and core("bad-update")[1] is None


def test_removing_from_the_table_is_refused_and_removes_nothing():
    from logits_processing.thinking_tokens import THINKING_TOKEN_CONFIGS as table
    from logits_processing.thinking_tokens import ThinkingTokenConfig

    before = list(lp._lib.thinking_token_table())
    for remove in (
        lambda: table.__delitem__("qwen3"),
        lambda: table.pop("qwen3"),
        table.popitem,
        table.clear,
    ):
        with pytest.raises(TypeError, match="THINKING_TOKEN_CONFIGS"):
            remove()
    assert list(lp._lib.thinking_token_table()) == before
    assert table["qwen3"] == ThinkingTokenConfig(151667, 151668, 198)
    # A key that is not there: pop's default, as a dict's; nothing to remove.
    assert table.pop("no-such-model-key", None) is None
    with pytest.raises(KeyError):
        table.pop("no-such-model-key")
