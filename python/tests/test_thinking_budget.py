"""The thinking budget: the shared notes' examples, and incremental state equal to a fresh scan."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from logits_processing import InvalidArgumentError, ThinkingBudgetLogitsProcessor

START, END, NEWLINE, WORD = 1, 2, 3, 4
VOCAB = 8


def reference_rule(ids, max_tokens, pct, start=START, end=END, newline=NEWLINE):
    """The reference's rule, straight from its description: a full rescan every call."""
    if start == 0 or end == 0:
        return False
    if start not in ids:
        return False
    last = len(ids) - 1 - ids[::-1].index(start)
    if end in ids[last + 1 :]:
        return False
    n = len(ids) - last - 1
    if n < max_tokens:
        return False
    return ids[-1] == newline or n >= max_tokens + int(max_tokens * pct)


def forced(processor, ids, dtype=torch.float32) -> bool:
    logits = torch.full((VOCAB,), 0.5, dtype=dtype)
    processor(ids, logits)
    if torch.all(logits == 0.5):
        return False
    expected = torch.full((VOCAB,), float("-inf"), dtype=dtype)
    expected[processor.thinking_end_token_id] = 0.0
    assert torch.equal(logits, expected)
    return True


def thinking(n):
    return [9, 9, START] + [WORD] * n


def budget(max_tokens=10, pct=0.1):
    return ThinkingBudgetLogitsProcessor(START, END, NEWLINE, max_tokens, pct)


def test_budget_10_at_10_percent_forces_at_11_ids_not_at_10_unless_at_a_newline():
    assert budget().overflow_budget == 1
    assert not forced(budget(), thinking(10))
    assert forced(budget(), thinking(11))
    assert forced(budget(), thinking(9) + [NEWLINE])
    assert not forced(budget(), thinking(8) + [NEWLINE])


def test_a_closed_block_is_left_alone():
    assert not forced(budget(), thinking(50) + [END] + [WORD] * 30)


def test_a_second_open_block_counts_from_its_own_start():
    ids = thinking(50) + [END, WORD, START] + [WORD] * 5
    assert not forced(budget(), ids)
    assert forced(budget(), ids + [WORD] * 6)


def test_zero_ids_change_nothing():
    for start, end in [(0, END), (START, 0), (0, 0)]:
        p = ThinkingBudgetLogitsProcessor(start, end, NEWLINE, 0)
        logits = torch.full((VOCAB,), 0.5)
        p(thinking(100), logits)
        assert torch.all(logits == 0.5)


def test_budget_zero_ends_right_after_the_start_and_no_start_does_nothing():
    assert forced(budget(0), [WORD, START])
    assert not forced(budget(0), [WORD, WORD])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_forcing_sets_minus_inf_and_the_end_to_exactly_zero(dtype):
    assert forced(budget(0), [START], dtype)


@pytest.mark.parametrize(
    "kind", ["list", "tuple", "numpy64", "numpy32", "torch64", "torch32", "range", "strided", "readonly"]
)
def test_input_ids_types(kind):
    ids = thinking(11)
    as_kind = {
        "list": list,
        "tuple": tuple,
        "numpy64": lambda v: np.array(v, dtype=np.int64),
        "numpy32": lambda v: np.array(v, dtype=np.int32),
        "torch64": lambda v: torch.tensor(v, dtype=torch.int64),
        "torch32": lambda v: torch.tensor(v, dtype=torch.int32),
        "range": lambda v: iter(v),
        "strided": lambda v: np.repeat(np.array(v), 2)[::2],
        "readonly": read_only_array,
    }[kind]
    assert forced(budget(), as_kind(ids))
    assert not forced(budget(), as_kind(thinking(10)))


def read_only_array(values):
    array = np.array(values, dtype=np.int64)
    array.flags.writeable = False  # ids are only read: a read-only array is fine
    return array


def test_bad_ids_raise_and_the_next_call_recovers():
    p = budget()
    with pytest.raises(ValueError):
        forced(p, [START, -1, WORD])
    with pytest.raises(ValueError):
        forced(p, np.array([START, -5], dtype=np.int64))
    with pytest.raises(TypeError):
        forced(p, np.array([1.0, 2.0]))
    assert forced(p, thinking(11))


def test_bad_arguments():
    with pytest.raises(InvalidArgumentError):
        ThinkingBudgetLogitsProcessor(START, END, NEWLINE, -1)
    with pytest.raises(ValueError):
        ThinkingBudgetLogitsProcessor(START, END, NEWLINE, 10, -0.5)
    with pytest.raises(ValueError):
        ThinkingBudgetLogitsProcessor(-1, END, NEWLINE, 10)


TOKEN = st.sampled_from([START, END, NEWLINE, WORD, 5, 6])


@settings(max_examples=150, deadline=None)
@given(
    max_tokens=st.integers(0, 12),
    pct=st.floats(0, 1),
    steps=st.lists(st.tuples(st.integers(0, 3), st.lists(TOKEN, max_size=6)), min_size=1, max_size=40),
)
def test_incremental_equals_a_fresh_instance(max_tokens, pct, steps):
    """One instance fed growing (sometimes rewound or replaced) lists answers as a fresh one."""
    kept = ThinkingBudgetLogitsProcessor(START, END, NEWLINE, max_tokens, pct)
    ids: list = []
    for action, chunk in steps:
        if action <= 1:
            ids = ids + chunk  # decode steps
        elif action == 2:
            ids = ids[: max(0, len(ids) - len(chunk))]  # rewound
        else:
            ids = list(chunk)  # another request's ids
        fresh = ThinkingBudgetLogitsProcessor(START, END, NEWLINE, max_tokens, pct)
        expected = reference_rule(ids, max_tokens, pct)
        assert forced(kept, ids) == expected
        assert forced(fresh, ids) == expected


def test_the_same_list_grown_in_place():
    """Engines append to one list each step; the processor reads only the new ids."""
    p = budget(100)
    ids = [START]
    for n in range(1, 200):
        ids.append(WORD)
        assert forced(p, ids) == (n >= 110)
