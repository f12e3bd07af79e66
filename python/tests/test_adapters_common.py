"""What the engine adapters share: roles, request payloads, the engine context and KeyedBatch."""

import enum
import json
import random
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import logits_processing as lp  # noqa: E402
from logits_processing.adapters import _common as common  # noqa: E402


def test_importing_the_adapters_package_imports_no_engine():
    code = (
        "import sys, logits_processing.adapters; "
        "print([m for m in ('vllm', 'sglang', 'tensorrt_llm', 'transformers', 'torch') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


class DisaggregationMode(enum.Enum):  # Dynamo's shape
    AGGREGATED = "agg"
    PREFILL = "prefill"
    DECODE = "decode"


@pytest.mark.parametrize(
    "role, runs",
    [
        (None, True),
        ("aggregated", True),
        ("decode", True),
        ("DECODE", True),
        ("prefill", False),
        (DisaggregationMode.AGGREGATED, True),
        (DisaggregationMode.PREFILL, False),
        (DisaggregationMode.DECODE, True),
    ],
)
def test_processors_run_on_generation_roles_only(role, runs):
    assert common.runs_processors(role) is runs


def test_an_unknown_role_is_an_error():
    with pytest.raises(ValueError, match="encode"):
        common.normalize_role("encode")


def test_payloads_are_json_data():
    text = common.encode_specs([{"kind": "temperature", "temperature": 0.5}])
    assert json.loads(text) == [{"kind": "temperature", "temperature": 0.5}]
    assert common.decode_specs(text) == json.loads(text)
    with pytest.raises(TypeError, match="JSON specs"):
        common.encode_specs([print])
    with pytest.raises(lp.SpecError, match="kind"):
        common.encode_specs({"kind": "nope"})
    with pytest.raises(lp.SpecError):
        common.decode_specs("{not json")


def test_resolve_specs_makes_engine_knowledge_explicit():
    context = common.EngineContext(
        hello_world=([7, 8], 1), thinking_tokens=lp.ThinkingTokenConfig(10, 11, 12)
    )
    resolved = context.resolve_specs(
        [{"kind": "hello_world", "position": "tokens"}, {"kind": "thinking_budget", "max_thinking_tokens": 4}]
    )
    assert resolved == [
        {"kind": "forced_sequence", "token_ids": [7, 8], "eos_token_id": 1, "position": "tokens"},
        {
            "kind": "thinking_budget",
            "max_thinking_tokens": 4,
            "overflow_percentage": 0.1,
            "start_token_id": 10,
            "end_token_id": 11,
            "newline_token_id": 12,
        },
    ]
    lp.validate_specs(resolved)  # needs no tokenizer any more


def test_with_position_only_touches_forced_sequences():
    specs = [
        {"kind": "forced_sequence", "token_ids": [1], "eos_token_id": 0},
        {"kind": "temperature", "temperature": 2.0},
    ]
    assert common.with_position(specs, "tokens") == [
        {"kind": "forced_sequence", "token_ids": [1], "eos_token_id": 0, "position": "tokens"},
        {"kind": "temperature", "temperature": 2.0},
    ]


def test_keyed_batch_refuses_a_bitmask_request_and_serves_the_others():
    """No engine gives our adapters a mask: a bitmask spec is refused when its request is added
    (naming the field), its row left as it was, and the step goes on for the other rows (it
    failed the whole step, and took SGLang's scheduler down with it)."""
    V = 11
    keyed = common.KeyedBatch(common.EngineContext(), position="tokens")
    rows = [
        ("bad", json.dumps([{"kind": "temperature", "temperature": 2.0}, {"kind": "bitmask"}]), 2, [1, 2]),
        ("good", [{"kind": "temperature", "temperature": 2.0}], 2, [1, 2]),
    ]
    logits = torch.randn(2, V)
    before = logits.clone()
    assert keyed.apply(logits, rows) == ["bad"]
    assert "[1].kind" in keyed.failed["bad"] and "'bitmask'" in keyed.failed["bad"]
    assert torch.equal(logits[0], before[0])
    assert torch.allclose(logits[1], before[1] / 2.0)
    with pytest.raises(lp.SpecError, match=r"\[0\]\.kind.*'bitmask'.*SGLang gives none"):
        common.no_caller_mask([{"kind": "bitmask"}], "SGLang")


def test_keyed_batch_follows_any_order_of_requests():
    """Random calls: requests join, leave, come back, change rows. Each row gets what its own
    pipeline, fed the same ids, gives it; memory holds only the latest call's requests."""
    V = 23
    rng = random.Random(5)
    keyed = common.KeyedBatch(common.EngineContext(), position="tokens")
    specs = {
        k: [
            {"kind": "forced_sequence", "token_ids": [rng.randrange(V) for _ in range(4)], "eos_token_id": 0},
            {"kind": "temperature", "temperature": 0.5 + k % 3},
        ]
        for k in range(12)
    }
    outputs = {k: [] for k in specs}
    for _ in range(200):
        keys = rng.sample(sorted(specs), rng.randrange(0, 7))
        rows = [None] * rng.randrange(0, 2) + [(k, specs[k], 2, [1, 2] + outputs[k]) for k in keys]
        rng.shuffle(rows)
        logits = torch.randn(len(rows), V)
        expected = logits.clone()
        for i, r in enumerate(rows):
            if r is not None:
                alone = lp.Batch(V)
                alone.add(0, common.with_position(r[1], "tokens"), prompt_len=2)
                alone.apply(expected[i : i + 1], [r[3]])
        keyed.apply(logits, rows)
        assert torch.equal(logits, expected)
        assert len(keyed) == sum(r is not None for r in rows)
        for i, r in enumerate(rows):
            if r is not None:
                outputs[r[0]].append(int(logits[i].argmax()))


def test_keyed_batch_parks_a_request_that_still_runs_and_drops_one_that_stopped():
    """A request absent from a call is parked when ``running`` says it still runs: its state is
    kept (a forced sequence counting calls goes on where it was), and it is dropped once it stops
    or its handle is gone."""
    V = 11
    running = {"a": True, "b": True}
    keyed = common.KeyedBatch(common.EngineContext(), running=lambda handle: running[handle])
    forced = [{"kind": "forced_sequence", "token_ids": [4, 5, 6], "eos_token_id": 0}]  # counts calls

    def call(*keys):
        logits = torch.zeros(len(keys), V)
        keyed.apply(logits, [(k, forced, 1, [1], k) for k in keys])
        return [int(row.argmax()) for row in logits]

    assert call("a", "b") == [4, 4]
    assert call("b") == [5]  # "a" left out while it runs
    assert "a" in keyed and keyed.parked.keys() == {"a"} and keyed.batch.parked == 1
    assert call("b", "a") == [6, 5]  # "a" goes on where it was, at its new row
    running["a"] = False
    assert call("b") == [0]
    assert "a" not in keyed and keyed.batch.parked == 0
    del running["b"]  # a handle the engine no longer knows: stopped
    assert call("a") == [4]  # rebuilt: counting calls, it starts again
    assert "b" not in keyed and len(keyed) == 1


@pytest.mark.parametrize(
    "make",
    [
        lambda specs: __import__("logits_processing.adapters.hf", fromlist=["x"]).HFLogitsProcessor(specs),
        lambda specs: __import__("logits_processing.adapters.trtllm", fromlist=["x"]).TRTLLMLogitsProcessor(specs),
        lambda specs: __import__("logits_processing.adapters.trtllm", fromlist=["x"])
        .TRTLLMBatchedLogitsProcessor()
        .register(7, specs),
        lambda specs: lp.Processor(specs),
    ],
    ids=["hf", "trtllm", "trtllm-batched", "Processor"],
)
def test_a_bitmask_spec_is_refused_where_no_mask_is_given(make):
    """Every step would fail (no caller gives a mask there): refused when given, naming the
    spec, as text and as data."""
    for specs, field in (
        ([{"kind": "temperature", "temperature": 0.5}, {"kind": "bitmask"}], "[1].kind"),
        ('{"kind": "bitmask"}', "kind"),
    ):
        with pytest.raises(lp.SpecError, match="gives none") as info:
            make(specs)
        assert info.value.field == field
