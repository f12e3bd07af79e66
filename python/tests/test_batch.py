"""Batch: equals each row's pipeline alone; lifecycle; user processors; layouts and bad input."""

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
    ProcessorError,
    ReadOnlyError,
    ShapeError,
    SpecError,
    ThinkingBudgetLogitsProcessor,
    ThinkingTokenConfig,
    TokenOutOfVocabError,
)
from logits_processing.examples import ForcedSequenceLogitsProcessor, TemperatureProcessor

VOCAB = 50
TOKENS = ThinkingTokenConfig(1, 2, 3)


def spec(kind, seed):
    """A pipeline (list of spec dicts) of one of a few shapes."""
    return [
        [{"kind": "temperature", "temperature": 0.3 + seed % 7}],
        [{"kind": "forced_sequence", "token_ids": [seed % VOCAB, 5], "eos_token_id": 0}],
        [{"kind": "thinking_budget", "max_thinking_tokens": seed % 5, "overflow_percentage": 0.5}],
        [{"kind": "ban_tokens", "token_ids": [seed % VOCAB, 7]}, {"kind": "temperature", "temperature": 0.7}],
        [
            {"kind": "logit_bias", "bias": {str(seed % VOCAB): 1.5}},
            {"kind": "temperature", "temperature": 2.0},
        ],
    ][kind]


def alone(kind, seed):
    """The same pipeline as single-row objects, applied one after the other."""
    if kind == 0:
        return [TemperatureProcessor(0.3 + seed % 7)]
    if kind == 1:
        return [ForcedSequenceLogitsProcessor([seed % VOCAB, 5], 0)]
    if kind == 2:
        return [ThinkingBudgetLogitsProcessor(1, 2, 3, seed % 5, 0.5)]
    return None


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(
        st.one_of(st.none(), st.tuples(st.integers(0, 2), st.integers(0, 1000))), min_size=1, max_size=8
    ),
    history=st.lists(st.sampled_from([1, 2, 3, 4, 5]), max_size=20),
    steps=st.integers(1, 4),
    pad=st.integers(0, 3),
    dtype=st.sampled_from(TORCH_DTYPES),
)
def test_batch_equals_each_row_alone(rows, history, steps, pad, dtype):
    batch = Batch(VOCAB, context=EngineContext(thinking_tokens=TOKENS))
    singles = {}
    for row, entry in enumerate(rows):
        if entry is not None:
            batch.add(row, spec(*entry))
            singles[row] = alone(*entry)
    storage = random_logits((len(rows), VOCAB + pad), dtype, seed=len(history))
    for step in range(steps):
        logits = storage[:, :VOCAB]  # rows further apart than the vocab when pad > 0
        expected = logits.clone()
        ids = [history + [row % 5] * step for row in range(len(rows))]
        batch.apply(logits, ids)
        for row, processors in singles.items():
            for p in processors:
                p(ids[row], expected[row])
        assert torch.equal(bits(logits), bits(expected))
        storage[:, VOCAB:].fill_(7.0)  # the padding is never touched
        assert torch.all(storage[:, VOCAB:] == 7.0)


def test_input_ids_as_list_numpy_and_torch():
    outputs = []
    for make in [list, np.array, torch.tensor, tuple]:
        batch = Batch(VOCAB, context=EngineContext(thinking_tokens=TOKENS))
        batch.add(0, {"kind": "thinking_budget", "max_thinking_tokens": 2})
        batch.add(
            1,
            {"kind": "forced_sequence", "token_ids": [9], "eos_token_id": 0, "position": "tokens"},
            prompt_len=3,
        )
        logits = torch.zeros(2, VOCAB)
        batch.apply(logits, [make([1, 4, 4]), make([7, 7, 7, 9])])
        outputs.append(logits)
        assert logits[0, 2] == 0 and torch.isinf(logits[0, 0]) and logits[1, 0] == 0  # EOS after [9]
    for other in outputs[1:]:
        assert torch.equal(outputs[0], other)


def test_numpy_logits():
    batch = Batch(VOCAB)
    batch.add(1, {"kind": "temperature", "temperature": 0.5})
    for dtype in (np.float32, np.float16):
        logits = np.ones((3, VOCAB), dtype=dtype)
        batch.apply(logits, [None, [1], None])
        assert np.all(logits[1] == 2) and np.all(logits[0] == 1) and np.all(logits[2] == 1)


def test_lifecycle_add_remove_move_swap():
    batch = Batch(VOCAB)
    batch.add(0, {"kind": "forced_sequence", "token_ids": [10], "eos_token_id": 0})
    batch.add(3, [{"kind": "forced_sequence", "token_ids": [13], "eos_token_id": 0}])
    assert batch.occupied == 2 and 0 in batch and 3 in batch and 1 not in batch
    assert batch.vocab_size == VOCAB and batch.rows() == [0, 3]

    def winners():
        logits = torch.zeros(4, VOCAB)
        batch.apply(logits, [[]] * 4)
        return [int(r.argmax()) if torch.isinf(r).any() else None for r in logits]

    batch.move(3, 1)  # vLLM's unidirectional move
    assert batch.rows() == [0, 1]
    assert winners() == [10, 13, None, None]
    batch.swap(0, 2)
    assert batch.rows() == [1, 2]
    batch.move(1, 2)  # the request at 2 is dropped
    assert batch.rows() == [2] and batch.occupied == 1
    assert batch.remove(2) and not batch.remove(2)
    assert batch.occupied == 0
    logits = torch.ones(2, VOCAB)
    batch.apply(logits, [None, None])
    assert torch.all(logits == 1)


def test_a_user_processor_runs_in_its_place_between_built_ins():
    seen = []

    def user(input_ids, row):
        seen.append((list(input_ids), type(row).__name__, row.shape, float(row[0])))
        row[0] = 100.0

    batch = Batch(4)
    batch.add(0, [{"kind": "temperature", "temperature": 2.0}, user, TemperatureProcessor(4.0)])
    logits = torch.full((2, 4), 8.0)
    batch.apply(logits, [[1, 2], None])
    # 8 / 2 = 4 seen by the user, who writes 100; then / 4.
    assert seen == [([1, 2], "Tensor", torch.Size([4]), 4.0)]
    assert logits[0].tolist() == [25.0, 1.0, 1.0, 1.0] and torch.all(logits[1] == 8)

    arr = np.full((1, 4), 8.0, dtype=np.float32)
    batch.apply(arr, [[3]])
    assert seen[-1][1] == "ndarray" and arr[0].tolist() == [25.0, 1.0, 1.0, 1.0]


def test_a_failing_user_processor_raises_processor_error_with_its_cause():
    def broken(input_ids, row):
        raise KeyError("boom")

    batch = Batch(4)
    batch.add(2, [broken])
    with pytest.raises(ProcessorError, match="row 2") as info:
        batch.apply(torch.zeros(3, 4), [None, None, []])
    assert isinstance(info.value.__cause__, KeyError)
    assert isinstance(info.value, RuntimeError)


def test_processor_objects_are_copied_with_their_state():
    forced = ForcedSequenceLogitsProcessor([5, 6], 0)
    forced([], torch.zeros(VOCAB))  # state 1
    batch = Batch(VOCAB)
    batch.add(0, forced)
    batch.add(1, [ThinkingBudgetLogitsProcessor(1, 2, 3, 0), TemperatureProcessor(0.5)])
    logits = torch.ones(2, VOCAB)
    batch.apply(logits, [[], [1]])
    assert int(logits[0].argmax()) == 6 and forced.state == 1
    assert logits[1, 2] == 0 and torch.isinf(logits[1, 0])


def test_spec_errors_name_the_field():
    batch = Batch(VOCAB)
    cases = [
        ({"kind": "nope"}, "kind"),
        ({"kind": "forced_sequence", "token_ids": [1]}, "eos_token_id"),
        ([{"kind": "temperature", "temperature": 1}, {"kind": "ban_tokens"}], "[1].token_ids"),
        ('[{"kind": "temperature", "temperature": 0}]', "[0].temperature"),
        ({"kind": "temperature", "temperature": 0}, "temperature"),
        ([TemperatureProcessor(), 42], "[1]"),
        ({"kind": "hello_world"}, "kind"),
        ({"kind": "thinking_budget", "max_thinking_tokens": 5}, "start_token_id"),
    ]
    for pipeline, field in cases:
        with pytest.raises(SpecError) as info:
            batch.add(0, pipeline)
        assert info.value.field == field, (pipeline, info.value)
        assert isinstance(info.value, ValueError)
    with pytest.raises(TokenOutOfVocabError) as info:
        batch.add(0, {"kind": "forced_sequence", "token_ids": [VOCAB], "eos_token_id": 0})
    assert (info.value.token_id, info.value.vocab_size) == (VOCAB, VOCAB)
    with pytest.raises(TokenOutOfVocabError):
        batch.add(0, ForcedSequenceLogitsProcessor([1], VOCAB + 3))
    assert batch.occupied == 0


def test_hello_world_and_thinking_specs_use_the_context():
    batch = Batch(VOCAB, context=EngineContext(hello_world=([7, 8], 0), thinking_tokens=TOKENS))
    batch.add(0, json.dumps({"kind": "hello_world"}))
    batch.add(1, {"kind": "thinking_budget", "max_thinking_tokens": 0})
    logits = torch.zeros(2, VOCAB)
    batch.apply(logits, [[], [1]])
    assert int(logits[0].argmax()) == 7 and logits[1, 2] == 0


def test_bad_logits_raise_and_leave_everything_untouched():
    batch = Batch(VOCAB)
    batch.add(0, {"kind": "forced_sequence", "token_ids": [3], "eos_token_id": 0})
    batch.add(2, {"kind": "temperature", "temperature": 0.5})
    good = torch.ones(3, VOCAB)
    read_only = np.ones((3, VOCAB), dtype=np.float32)
    read_only.flags.writeable = False
    cases = [
        (torch.ones(VOCAB), ShapeError),  # 1-D
        (torch.ones(2, VOCAB), ShapeError),  # row 2 outside
        (torch.ones(3, VOCAB + 1), ShapeError),  # wrong vocab
        (torch.ones(VOCAB, 3).t(), ShapeError),  # not contiguous in the last dimension
        (torch.ones(3, VOCAB, dtype=torch.float64), DTypeError),
        (torch.ones(3, VOCAB, dtype=torch.int32), DTypeError),
        (read_only, ReadOnlyError),
        ([[1.0] * VOCAB] * 3, DTypeError),
    ]
    for logits, error in cases:
        before = logits.clone() if isinstance(logits, torch.Tensor) else np.array(logits, copy=True)
        with pytest.raises(error):
            batch.apply(logits, [[], [], []])
        assert np.array_equal(np.asarray(before), np.asarray(logits))
    with pytest.raises(ShapeError, match="input_ids"):
        batch.apply(good, [[], []])
    assert torch.all(good == 1)
    # Nothing above advanced a forced sequence: the first real step forces its first id.
    batch.apply(good, [[], [], []])
    assert int(good[0].argmax()) == 3


def test_rows_with_a_stride_and_a_transposed_batch_dimension():
    batch = Batch(4)
    batch.add(0, {"kind": "temperature", "temperature": 0.5})
    batch.add(1, {"kind": "temperature", "temperature": 0.25})
    big = torch.ones(6, 4)
    batch.apply(big[::3], [[], []])  # rows 3 * 4 elements apart
    assert big[0].tolist() == [2.0] * 4 and big[3].tolist() == [4.0] * 4
    assert torch.all(big[[1, 2, 4, 5]] == 1)


def test_an_empty_batch_and_zero_rows():
    batch = Batch(VOCAB)
    batch.apply(torch.zeros(0, VOCAB), [])
    batch.apply(torch.zeros(2, VOCAB), [None, None])


def test_hello_world_objects_are_built_ins_and_overriding_subclasses_run_as_python():
    from logits_processing.examples import HelloWorldLogitsProcessor

    class Letters:
        eos_token_id = 0

        def encode(self, text, add_special_tokens=False):
            return [ord(c) % VOCAB for c in text]

    class Louder(ForcedSequenceLogitsProcessor):
        def __call__(self, input_ids, logits):
            logits[1] = 99.0

    batch = Batch(VOCAB)
    batch.add(0, HelloWorldLogitsProcessor(Letters()))
    batch.add(1, Louder([4], 0))
    logits = torch.zeros(2, VOCAB)
    batch.apply(logits, [[], []])
    assert int(logits[0].argmax()) == ord("H") % VOCAB
    assert logits[1, 1] == 99 and not torch.isinf(logits[1]).any()


@pytest.mark.parametrize("dtype", TORCH_DTYPES)
def test_out_equals_a_copy_edited_in_place_and_leaves_logits_alone(dtype):
    def make():
        batch = Batch(VOCAB, context=EngineContext(thinking_tokens=TOKENS))
        for row, kind in enumerate([0, 1, 2, 3, 4]):
            batch.add(row, spec(kind, 11 * row + 3))
        return batch  # row 5 holds no request

    logits = random_logits((6, VOCAB), dtype)
    ids = [[1, 4, 4, 4]] * 6
    before = logits.clone()
    expected = logits.clone()
    make().apply(expected, ids)
    out = torch.full_like(logits, 9.0)
    make().apply(logits, ids, out=out)
    assert torch.equal(bits(out), bits(expected))
    assert torch.equal(bits(logits), bits(before))


def test_out_with_numpy_reads_a_read_only_source_and_runs_user_processors_on_out():
    def user(input_ids, row):
        row[0] = 100.0

    batch = Batch(4)
    batch.add(0, [{"kind": "temperature", "temperature": 2.0}, user])
    source = np.full((2, 4), 8.0, dtype=np.float32)
    source.flags.writeable = False
    out = np.zeros((2, 4), dtype=np.float32)
    batch.apply(source, [[1], None], out=out)
    assert out.tolist() == [[100.0, 4.0, 4.0, 4.0], [8.0, 8.0, 8.0, 8.0]]
    assert np.all(source == 8.0)


def test_bad_out_raises_before_anything_is_written():
    batch = Batch(VOCAB)
    batch.add(0, [{"kind": "forced_sequence", "token_ids": [3], "eos_token_id": 0}])
    logits = torch.ones(2, VOCAB)
    cases = [
        (torch.zeros(3, VOCAB), ShapeError),  # rows differ
        (torch.zeros(2, VOCAB, dtype=torch.float16), ShapeError),  # dtype differs
        (torch.zeros(2, VOCAB + 2)[:, :VOCAB], ShapeError),  # row stride differs
        (logits, ShapeError),  # the same memory
    ]
    for out, error in cases:
        snapshot = out.clone()
        with pytest.raises(error):
            batch.apply(logits, [[1], None], out=out)
        assert torch.equal(out, snapshot)
    assert torch.all(logits == 1)
    # The forced sequence has not taken a step: its first token is still next.
    out = torch.zeros(2, VOCAB)
    batch.apply(logits, [[1], None], out=out)
    assert int(torch.argmax(out[0])) == 3


def test_none_ids_for_a_row_that_holds_a_request_are_refused():
    """None is for a row without a request; for one with a request it would read as an empty
    history (its prompt gone) and restart it. Refused, naming the row, nothing edited."""
    import torch

    from logits_processing import Batch, InvalidArgumentError

    batch = Batch(4)
    batch.add(0, {"kind": "forced_sequence", "token_ids": [2, 3], "eos_token_id": 0, "position": "tokens"}, prompt_len=1)
    batch.add(1, {"kind": "temperature", "temperature": 0.5})
    logits = torch.ones(2, 4)
    with pytest.raises(InvalidArgumentError, match=r"input_ids\[0\] is None") as e:
        batch.apply(logits, [None, [5]])
    assert e.value.row == 0 and torch.equal(logits, torch.ones(2, 4))
    batch.apply(logits, [[5], [5]])
    assert logits[0].argmax() == 2  # the forced sequence did not move: the refused step never happened
