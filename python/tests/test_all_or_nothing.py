"""A failed step changes nothing: Batch.apply and every single-row call, for each way a step can
fail. After the failure the logits are bit for bit what they were, the error names the row, and
the next steps give what a twin that never saw the failure gives."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import bits
from hypothesis import given, settings
from hypothesis import strategies as st

import logits_processing as lp
from logits_processing import (
    Batch,
    DTypeError,
    InvalidArgumentError,
    LogitsProcessingError,
    Processor,
    ProcessorError,
    ThinkingBudgetLogitsProcessor,
    ThinkingTokenConfig,
    TokenOutOfVocabError,
)
from logits_processing.examples import ForcedSequenceLogitsProcessor

VOCAB = 40
TOKENS = ThinkingTokenConfig(1, 2, 3)
OUT_OF_VOCAB_ON = 37  # the id on which the test processor plans a token outside the vocab


def bump(input_ids, row):
    """A user step that reads its ids and edits its row."""
    row[len(input_ids) % VOCAB] += 1.0


class Trap:
    """A user step that behaves like `bump` until armed, then fails as `mode` says."""

    def __init__(self):
        self.mode = None
        self.parent = None  # the batch's logits, for modes that move them
        self.raised = None

    def __call__(self, input_ids, row):
        bump(input_ids, row)
        mode = self.mode
        if mode is None:
            return
        if mode == "raise":
            self.raised = KeyError("boom")
        elif mode == "keyboard":
            self.raised = KeyboardInterrupt()
        elif mode == "exit":
            self.raised = SystemExit(3)
        elif mode == "bad repr":
            self.raised = BadRepr("hidden")
        elif mode == "row set_":
            row.set_(torch.zeros_like(row))
        elif mode == "row resize_":
            row.resize_(1 << 16)  # more than the storage holds: torch reallocates it
        elif mode == "parent set_":
            self.parent.set_(torch.zeros_like(self.parent))
        elif mode == "parent resize":
            self.parent.resize((1 << 16,), refcheck=False)  # numpy reallocates its data
        if self.raised is not None:
            raise self.raised


class BadRepr(Exception):
    def __repr__(self):
        raise RuntimeError("repr is broken")


def budget(seed):
    return {"kind": "thinking_budget", "max_thinking_tokens": seed % 4, "overflow_percentage": 0.5}


def pipeline(kind, seed, trap=None):
    """One of a few pipelines; every one reads its ids (the thinking budget reads the new ones)."""
    budget_ = budget(seed)
    steps = [
        [budget_, {"kind": "temperature", "temperature": 0.7}],
        [
            {"kind": "forced_sequence", "token_ids": [seed % VOCAB, 5], "eos_token_id": 0},
            budget_,
        ],
        [{"kind": "ban_tokens", "token_ids": [seed % VOCAB]}, bump, budget_],
        [{"kind": "logit_bias", "bias": {str(seed % VOCAB): 1.5}}, budget_, bump],
        [bump, ForcedSequenceLogitsProcessor([seed % VOCAB, 4], 0), budget_],
    ][kind]
    if trap is not None:
        steps.insert(1, trap)
    return steps


def twins(kinds, failing_row, failure):
    """Two batches with the same rows; the failing row has a trap (or the out-of-vocab step)."""
    made = []
    for _ in range(2):
        trap = Trap()
        batch = Batch(VOCAB, context=lp.EngineContext(thinking_tokens=TOKENS))
        for row, entry in enumerate(kinds):
            kind, seed = entry or (None, 0)
            extra = None
            if row == failing_row:
                extra = lp._lib._testing._OutOfVocabForTests(OUT_OF_VOCAB_ON) if failure == "plan" else trap
            if kind is not None:
                batch.add(row, pipeline(kind, seed, extra))
            elif extra is not None:
                batch.add(row, [extra, budget(row)])
        made.append((batch, trap))
    return made


def start_logits(rows, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, VOCAB, generator=g) * 5).to(dtype)


FAILURES = [
    "id str", "id -1", "id 2**40", "id float", "plan", "raise", "bad repr", "keyboard", "exit",
    "row set_", "row resize_", "parent set_",
]
BAD_IDS = {"id str": "x", "id -1": -1, "id 2**40": 2**40, "id float": 1.5}


@settings(max_examples=60, deadline=None)
@given(
    kinds=st.lists(st.one_of(st.none(), st.tuples(st.integers(0, 4), st.integers(0, 1000))), min_size=1, max_size=6),
    failing=st.integers(0, 5),
    failure=st.sampled_from(FAILURES),
    steps_before=st.integers(0, 2),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=st.integers(0, 1000),
)
def test_a_failed_batch_step_changes_nothing(kinds, failing, failure, steps_before, dtype, seed):
    rows = len(kinds)
    failing %= rows
    (batch, trap), (twin, _) = twins(kinds, failing, failure)
    start = start_logits(rows, dtype, seed)
    history = [[1, 5 + row % 3] for row in range(rows)]

    def step(b, ids):
        logits = start.clone()
        b.apply(logits, ids)
        return logits

    for s in range(steps_before):
        for h in history:
            h.append(4 + s % 3)
        assert torch.equal(bits(step(batch, history)), bits(step(twin, history)))

    # The failing step, on `batch` only.
    ids = [h + [6] for h in history]
    if failure in BAD_IDS:
        ids[failing] = ids[failing] + [BAD_IDS[failure]]
    elif failure == "plan":
        ids[failing] = ids[failing] + [OUT_OF_VOCAB_ON]
    else:
        trap.mode = failure
    logits = start.clone()
    alias = logits.view(rows, VOCAB)  # keeps the memory the logits have now, whatever set_ does
    trap.parent = logits
    expected = {
        "plan": TokenOutOfVocabError,
        "keyboard": KeyboardInterrupt,
        "exit": SystemExit,
    }.get(failure, InvalidArgumentError if failure in BAD_IDS else ProcessorError)
    if failure in ("id str", "id float"):
        expected = DTypeError  # not an int, as ids of a float tensor
    with pytest.raises(expected) as info:
        batch.apply(logits, ids)
    trap.mode = None
    error = info.value
    if failure in ("keyboard", "exit"):
        assert error is trap.raised  # unchanged, not wrapped
    else:
        assert error.row == failing and str(error).startswith(f"row {failing}:"), error
    if failure in BAD_IDS:
        assert error.field == f"input_ids[{failing}][{len(ids[failing]) - 1}]", error
    if failure in ("raise", "bad repr"):
        assert error.__cause__ is trap.raised
    if failure == "bad repr":
        assert "BadRepr (whose repr() raised)" in str(error)
    if failure == "row resize_":
        # The memory the logits had was freed: nothing was written to it, and the error says so.
        assert "not restored" in str(error)
    else:
        assert torch.equal(bits(alias), bits(start)), failure

    # Both go on from the same history: the same answers, as if the failure never happened.
    for s in range(3):
        for h in history:
            h.append(4 + (s + 1) % 3)
        assert torch.equal(bits(step(batch, history)), bits(step(twin, history))), (failure, s)


def test_a_numpy_parent_resized_by_a_user_step_is_not_written_to():
    (batch, trap), (twin, _) = twins([(0, 3), (2, 5), (1, 9)], 1, "parent resize")
    history = [[1, 4], [1, 5], [1, 6]]
    start = np.random.default_rng(0).normal(size=(3, VOCAB)).astype(np.float32)
    logits = start.copy()
    trap.mode, trap.parent = "parent resize", logits
    with pytest.raises(ProcessorError, match="not restored") as info:
        batch.apply(logits, history)
    assert info.value.row == 1
    trap.mode = None
    for s in range(3):
        for h in history:
            h.append(4 + s)
        a, b = start.copy(), start.copy()
        batch.apply(a, history)
        twin.apply(b, history)
        assert np.array_equal(a.view(np.int32), b.view(np.int32))


def test_out_of_place_failures_leave_out_and_logits_alone():
    (batch, trap), (twin, _) = twins([(0, 3), (2, 5), None, (3, 1)], 1, "raise")
    history = [[1, 4], [1, 5], [], [1, 6]]
    logits = start_logits(4, torch.float32, 1)
    before = logits.clone()
    out = torch.full_like(logits, 7.0)
    trap.mode = "raise"
    with pytest.raises(ProcessorError):
        batch.apply(logits, history, out=out)
    trap.mode = None
    assert torch.all(out == 7.0) and torch.equal(logits, before)
    a, b = torch.empty_like(logits), torch.empty_like(logits)
    batch.apply(logits, history, out=a)
    twin.apply(logits, history, out=b)
    assert torch.equal(bits(a), bits(b))


def test_a_bad_row_of_input_ids_names_the_row_and_keeps_the_cause():
    batch = Batch(VOCAB, context=lp.EngineContext(thinking_tokens=TOKENS))
    batch.add(0, {"kind": "thinking_budget", "max_thinking_tokens": 2})
    batch.add(2, {"kind": "thinking_budget", "max_thinking_tokens": 2})

    def broken():
        yield 1
        raise OSError("the ids stream broke")

    logits = torch.zeros(3, VOCAB)
    with pytest.raises(InvalidArgumentError) as info:
        batch.apply(logits, [[1], None, broken()])
    assert info.value.row == 2 and isinstance(info.value.__cause__, OSError)
    with pytest.raises(lp.DTypeError) as info:
        batch.apply(logits, [[1], None, 5])  # not iterable
    assert info.value.row == 2 and isinstance(info.value, TypeError)

    class Stop:
        def __iter__(self):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        batch.apply(logits, [[1], None, Stop()])
    assert torch.all(logits == 0)


def test_an_error_of_one_row_is_its_inner_class_with_the_row():
    batch = Batch(VOCAB)
    batch.add(3, [lp._lib._testing._OutOfVocabForTests(9)])
    with pytest.raises(TokenOutOfVocabError) as info:
        batch.apply(torch.zeros(4, VOCAB), [None, None, None, [9]])
    error = info.value
    assert error.row == 3 and error.token_id == 2**32 - 2 and error.vocab_size == VOCAB
    assert str(error).startswith("row 3: ")
    assert LogitsProcessingError("x").row is None  # errors of no row


@pytest.mark.parametrize(
    "make",
    [
        lambda: ThinkingBudgetLogitsProcessor(1, 2, 3, max_thinking_tokens=1),
        lambda: Processor([{"kind": "thinking_budget", "max_thinking_tokens": 1,
                            "start_token_id": 1, "end_token_id": 2, "newline_token_id": 3},
                           {"kind": "forced_sequence", "token_ids": [7, 8, 9], "eos_token_id": 0,
                            "position": "tokens"}], prompt_len=0),
        lambda: ForcedSequenceLogitsProcessor([7, 8, 9], 0, position="tokens"),
    ],
)
@pytest.mark.parametrize("bad", [[1, 4, -1], [1, 4, "x"], [1, 4, 2**40], np.array([1.0, 4.0, 4.0])])
def test_a_single_row_call_with_bad_ids_changes_nothing(make, bad):
    p, twin = make(), make()
    start = torch.randn(VOCAB)
    for ids in ([1], [1, 4]):
        a, b = start.clone(), start.clone()
        p(ids, a)
        twin(ids, b)
    logits = start.clone()

    def ids_of(values):  # a generator: read (and refused) whole, whatever the processor needs
        return (v for v in values)

    state = getattr(p, "state", None)
    with pytest.raises(LogitsProcessingError):
        p(ids_of(bad), logits)
    assert torch.equal(bits(logits), bits(start))
    assert getattr(p, "state", None) == state
    for ids in ([1, 4, 4], [1, 4, 4, 4]):
        a, b = start.clone(), start.clone()
        p(ids, a)
        twin(ids, b)
        assert torch.equal(bits(a), bits(b)), ids


def test_logits_moved_while_input_ids_are_read_are_not_written():
    start = torch.randn(2, VOCAB)

    def moving(values, target):
        """Ids from a generator that points `target` at other memory first."""
        target.set_(torch.zeros_like(target))
        yield from values

    # One row: the thinking budget reads the ids, running the generator.
    p, twin = ThinkingBudgetLogitsProcessor(1, 2, 3, max_thinking_tokens=0), ThinkingBudgetLogitsProcessor(1, 2, 3, 0)
    logits = start[0].clone()
    alias = logits.view(VOCAB)
    with pytest.raises(lp.ShapeError, match="while input_ids were read"):
        p(moving([1, 4], logits), logits)
    assert torch.equal(bits(alias), bits(start[0]))
    a, b = start[0].clone(), start[0].clone()
    p([1, 4], a)
    twin([1, 4], b)
    assert torch.equal(bits(a), bits(b)) and torch.isinf(a[0])

    # A batch: the same, through one row's ids.
    (batch, _), (twin_batch, _) = twins([(0, 1), (3, 2)], 0, "raise")
    logits = start.clone()
    alias = logits.view(2, VOCAB)
    with pytest.raises(lp.ShapeError, match="while input_ids were read"):
        batch.apply(logits, [[1, 4], moving([1, 5], logits)])
    assert torch.equal(bits(alias), bits(start))
    a, b = start.clone(), start.clone()
    batch.apply(a, [[1, 4], [1, 5]])
    twin_batch.apply(b, [[1, 4], [1, 5]])
    assert torch.equal(bits(a), bits(b))
