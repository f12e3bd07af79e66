"""The bad-input matrix: every argument of every public entry point, given a value of the wrong
type or out of range, raises one of our exceptions that is also the matching builtin and names the
argument, and leaves the logits and the object's state exactly as they were.

State is compared by behaviour: a twin built the same way never sees the bad call, then both run
the same steps, and their outputs must be identical bit for bit."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch

import logits_processing as lp
from logits_processing import Batch, Processor, ThinkingBudgetLogitsProcessor
from logits_processing.examples import (
    ForcedSequenceLogitsProcessor,
    HelloWorldLogitsProcessor,
    TemperatureProcessor,
)

VOCAB = 16
TEMPERATURE = {"kind": "temperature", "temperature": 0.5}
FORCED = {"kind": "forced_sequence", "token_ids": [3, 4, 5], "eos_token_id": 1}

# Integers that are not a count, index or token id, and what they must raise.
HUGE = [2**64, 2**200, 2**100000]
NEGATIVE = [-1, -(2**63), -(2**200)]
NOT_INTS = ["1", 1.5, None, object(), b"1", [1]]


def new_batch():
    batch = Batch(VOCAB)
    batch.add(0, TEMPERATURE)
    batch.add(2, [FORCED, ThinkingBudgetLogitsProcessor(1, 2, 3, 1)])
    return batch


def batch_step(batch, logits):
    batch.apply(logits, [[7], None, [7, 3]])


def row_step(processor, logits):
    processor([1, 7, 7], logits[0])


def logits_block():
    return torch.arange(3 * VOCAB, dtype=torch.float32).reshape(3, VOCAB) / 7


def processors():
    return {
        "temperature": (lambda: TemperatureProcessor(0.5), row_step),
        "forced": (lambda: ForcedSequenceLogitsProcessor([3, 4], 1), row_step),
        "budget": (lambda: ThinkingBudgetLogitsProcessor(1, 2, 3, 1), row_step),
        "processor": (lambda: Processor([FORCED, TEMPERATURE]), row_step),
        "batch": (new_batch, batch_step),
    }


def int_cases(owner, call, field, *, huge_ok=False, none_ok=False):
    """Cases for an integer argument: wrong types, negatives and (unless they saturate) huge."""
    wrong = [v for v in NOT_INTS if not (none_ok and v is None)]
    cases = [(owner, call, value, lp.ArgumentTypeError, TypeError, field) for value in wrong]
    cases += [(owner, call, value, lp.InvalidArgumentError, ValueError, field) for value in NEGATIVE]
    if not huge_ok:
        cases += [(owner, call, value, lp.InvalidArgumentError, ValueError, field) for value in HUGE]
    return cases


CASES = (
    int_cases("batch", lambda b, v: b.add(v, TEMPERATURE), "row")
    + int_cases("batch", lambda b, v: b.add(0, TEMPERATURE, prompt_len=v), "prompt_len", none_ok=True)
    + int_cases("batch", lambda b, v: b.remove(v), "row")
    + int_cases("batch", lambda b, v: b.move(0, v), "dst")
    + int_cases("batch", lambda b, v: b.move(v, 0), "src")
    + int_cases("batch", lambda b, v: b.swap(v, 2), "a")
    + int_cases("batch", lambda b, v: v in b, "row")
    + int_cases("forced", lambda p, v: setattr(p, "eos_id", v), "eos_id")
    + int_cases("forced", lambda p, v: setattr(p, "token_ids", [1, v]), "token_ids[1]")
    + int_cases("forced", lambda p, v: setattr(p, "state", v), "state", huge_ok=True)
    + [
        ("batch", lambda b, v: b.apply(logits_block(), v), v, lp.ArgumentTypeError, TypeError, "input_ids")
        for v in [None, 5, object()]
    ]
    + [
        ("batch", lambda b, v: b.apply(v, [[1]] * 3), v, lp.LogitsProcessingError, TypeError, "")
        for v in [None, 5, "logits", object()]
    ]
    + [
        ("batch", lambda b, v: b.add(1, v), v, lp.SpecError, ValueError, "spec")
        for v in [5, b"{}", '{"kind": "\ud800"}', {"kind": object()}, "[" * 100000, "{}"]
    ]
    + [
        ("batch", lambda b, v: b.add(1, v), v, lp.TokenOutOfVocabError, IndexError, "token_ids")
        for v in [{"kind": "ban_tokens", "token_ids": [VOCAB]}]
    ]
    + [
        ("temperature", lambda p, v: setattr(p, "temperature", v), v, lp.ArgumentTypeError, TypeError, "temperature")
        for v in ["hot", None, object(), [1.0]]
    ]
    + [
        ("temperature", lambda p, v: setattr(p, "temperature", v), v, lp.InvalidArgumentError, ValueError, "emperature")
        for v in [0, -1.0, float("nan"), float("inf"), 2**2000]
    ]
    + [
        ("forced", lambda p, v: setattr(p, "token_ids", v), v, lp.ArgumentTypeError, TypeError, "token_ids")
        for v in [5, None, "abc"]
    ]
    + [
        (owner, lambda p, v: p([1], v), v, lp.LogitsProcessingError, TypeError, "")
        for owner in ["temperature", "forced", "budget", "processor"]
        for v in [None, 5, object(), np.zeros(VOCAB, dtype=np.int64)]
    ]
    + [
        ("budget", lambda p, v: p(v, torch.zeros(VOCAB)), v, lp.LogitsProcessingError, Exception, "input_ids")
        for v in [[-1], [2**64], ["a"], [1.5], 5]
    ]
    + [
        ("batch", lambda b, v: b.apply(logits_block(), [[7], None, v]), v, lp.LogitsProcessingError, Exception, "input_ids")
        for v in [[-1], [2**64], ["a"], [1.5], 5]
    ]
)


def case_id(case):
    owner, _, value, cls, _, field = case
    text = f"int{value.bit_length()}" if isinstance(value, int) and abs(value) > 2**70 else repr(value)[:20]
    return f"{owner}-{field}-{cls.__name__}-{text}"


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_bad_argument_is_ours_and_changes_nothing(case):
    owner, call, value, cls, builtin, field = case
    make, step = processors()[owner]
    subject, twin = make(), make()
    step(subject, logits_block())  # some state first
    step(twin, logits_block())
    given = logits_block()
    before = given.clone()
    with pytest.raises(cls) as raised:
        call(subject, value)
    assert isinstance(raised.value, lp.LogitsProcessingError)
    assert isinstance(raised.value, builtin)
    assert field in str(raised.value), (field, str(raised.value))
    assert torch.equal(given, before)
    for _ in range(4):  # the same answers as the twin that never saw the bad call
        mine, theirs = logits_block(), logits_block()
        step(subject, mine)
        step(twin, theirs)
        assert torch.equal(mine.view(torch.int32), theirs.view(torch.int32))


@pytest.mark.parametrize(
    "make, cls, field",
    [
        (lambda: TemperatureProcessor("hot"), lp.ArgumentTypeError, "temperature"),
        (lambda: TemperatureProcessor(2**2000), lp.InvalidArgumentError, "temperature"),
        (lambda: ForcedSequenceLogitsProcessor([1], 2**63), lp.InvalidArgumentError, "eos_token_id"),
        (lambda: ForcedSequenceLogitsProcessor([1], "x"), lp.ArgumentTypeError, "eos_token_id"),
        (lambda: ForcedSequenceLogitsProcessor([1], None), lp.InvalidArgumentError, "eos_token_id"),
        (lambda: ForcedSequenceLogitsProcessor(5, 1), lp.ArgumentTypeError, "token_ids"),
        (lambda: ForcedSequenceLogitsProcessor([1], 1, position=5), lp.ArgumentTypeError, "position"),
        (lambda: ForcedSequenceLogitsProcessor([1], 1, position="\ud800"), lp.InvalidArgumentError, "position"),
        (lambda: ForcedSequenceLogitsProcessor([1], 1, position="x"), lp.InvalidArgumentError, "position"),
        (lambda: ForcedSequenceLogitsProcessor([1], 1, prompt_len=-1), lp.InvalidArgumentError, "prompt_len"),
        (lambda: ThinkingBudgetLogitsProcessor("a", 2, 3, 4), lp.ArgumentTypeError, "thinking_start_token_id"),
        (lambda: ThinkingBudgetLogitsProcessor(1, 2**63, 3, 4), lp.InvalidArgumentError, "thinking_end_token_id"),
        (lambda: ThinkingBudgetLogitsProcessor(1, 2, -3, 4), lp.InvalidArgumentError, "newline_token_id"),
        (lambda: ThinkingBudgetLogitsProcessor(1, 2, 3, -1), lp.InvalidArgumentError, "max_thinking_tokens"),
        (lambda: ThinkingBudgetLogitsProcessor(1, 2, 3, 4.5), lp.ArgumentTypeError, "max_thinking_tokens"),
        (lambda: ThinkingBudgetLogitsProcessor(1, 2, 3, 4, "x"), lp.ArgumentTypeError, "overflow_percentage"),
        (lambda: ThinkingBudgetLogitsProcessor(1, 2, 3, 4, -1.0), lp.InvalidArgumentError, "overflow_percentage"),
        (lambda: Batch(-1), lp.InvalidArgumentError, "vocab_size"),
        (lambda: Batch(2**64), lp.InvalidArgumentError, "vocab_size"),
        (lambda: Batch("x"), lp.ArgumentTypeError, "vocab_size"),
        (lambda: lp.EngineContext(vocab_size=4, hello_world=5), lp.ArgumentTypeError, "hello_world"),
        (lambda: lp.EngineContext(hello_world=([1, -1], 2)), lp.InvalidArgumentError, "hello_world[0][1]"),
        (lambda: lp.EngineContext(thinking_tokens=(1, 2, 2**40)), lp.InvalidArgumentError, "newline_token_id"),
        (lambda: lp.EngineContext(thinking_tokens="abc"), lp.ArgumentTypeError, "thinking_tokens"),
        (lambda: Processor(TEMPERATURE, prompt_len="x"), lp.ArgumentTypeError, "prompt_len"),
        (lambda: Processor("\ud800"), lp.SpecError, "surrogate"),
        (lambda: lp.EngineContext(vocab_size=-1), lp.InvalidArgumentError, "vocab_size"),
        (lambda: lp.validate_specs("\ud800"), lp.SpecError, "surrogate"),
        (lambda: lp.EngineContext(vocab_size="x"), lp.ArgumentTypeError, "vocab_size"),
        (lambda: lp.get_thinking_token_config(5), lp.ArgumentTypeError, "model_name"),
        (lambda: lp.get_thinking_token_config("\ud800"), lp.InvalidArgumentError, "model_name"),
        (lambda: HelloWorldLogitsProcessor(5), lp.ArgumentTypeError, "tokenizer"),
        (lambda: HelloWorldLogitsProcessor("/nonexistent/\ud800.json"), lp.InvalidArgumentError, "tokenizer"),
        (lambda: HelloWorldLogitsProcessor("/nonexistent/tokenizer.json"), lp.TokenizerError, "nonexistent"),
    ],
)
def test_bad_constructor_argument_is_ours(make, cls, field):
    with pytest.raises(cls) as raised:
        make()
    assert isinstance(raised.value, lp.LogitsProcessingError)
    assert field in str(raised.value)


class RaisingTokenizer:
    eos_token_id = 0

    def encode(self, text, add_special_tokens=False):
        raise RuntimeError("the tokenizer's own failure")


class JunkTokenizer:
    eos_token_id = 0

    def encode(self, text, add_special_tokens=False):
        return 5


def test_a_tokenizer_that_fails_is_a_tokenizer_error_with_its_cause():
    with pytest.raises(lp.TokenizerError) as raised:
        HelloWorldLogitsProcessor(RaisingTokenizer())
    assert isinstance(raised.value.__cause__, RuntimeError)
    with pytest.raises(lp.TokenizerError):
        HelloWorldLogitsProcessor(JunkTokenizer())


@pytest.mark.parametrize("kind", ["none", "int", "raises"])
def test_junk_dlpack_is_ours(kind):
    class Junk:
        def __dlpack__(self, *args, **kwargs):
            if kind == "raises":
                raise RuntimeError("junk")
            return None if kind == "none" else 5

    with pytest.raises(lp.DTypeError):
        TemperatureProcessor(0.5)([1], Junk())


def test_an_error_whose_repr_raises_survives_as_the_cause():
    class Unprintable(Exception):
        def __repr__(self):
            raise RuntimeError("repr")

        def __str__(self):
            raise RuntimeError("str")

    def user_step(ids, row):
        raise Unprintable()

    batch = Batch(VOCAB)
    batch.add(0, [TEMPERATURE, user_step])
    logits = logits_block()[:1].clone()
    before = logits.clone()
    with pytest.raises(lp.ProcessorError) as raised:
        batch.apply(logits, [[1]])
    assert isinstance(raised.value.__cause__, Unprintable)
    assert torch.equal(logits, before)


def test_huge_numbers_saturate_as_the_reference_does():
    # The reference's hard limit is an unbounded int: a huge percentage never ends a line early.
    budget = ThinkingBudgetLogitsProcessor(1, 2, 3, 10, 1e300)
    assert budget.overflow_budget == 2**64 - 1
    logits = torch.zeros(VOCAB)
    budget([1] + [4] * 10, logits)
    assert torch.equal(logits, torch.zeros(VOCAB))
    budget([1] + [4] * 10 + [3], logits)  # a line end past the budget: forced
    assert logits[2] == 0 and torch.isinf(logits[0])
    assert ThinkingBudgetLogitsProcessor(1, 2, 3, 2**63).max_thinking_tokens == 2**63
    assert ThinkingBudgetLogitsProcessor(1, 2, 3, 2**200).max_thinking_tokens == 2**64 - 1
    # A state past the sequence's end is EOS, however large; it does not wrap to the start.
    forced = ForcedSequenceLogitsProcessor([3, 4], 1)
    for state in [2**64 - 1, 2**64, 2**300]:
        forced.state = state
        logits = torch.zeros(VOCAB)
        forced([], logits)
        assert int(logits.argmax()) == 1
        assert forced.state == 2**64 - 1


def test_thinking_budget_end_id_outside_the_row_fails_only_when_forcing():
    # The reference indexes the end id only when it forces.
    budget = ThinkingBudgetLogitsProcessor(1, 99, 3, 2, 0.0)
    logits = torch.zeros(VOCAB)
    budget([1, 4], logits)
    assert torch.equal(logits, torch.zeros(VOCAB))
    with pytest.raises(lp.TokenOutOfVocabError):
        budget([1, 4, 4], logits)
    assert torch.equal(logits, torch.zeros(VOCAB))


@pytest.mark.parametrize(
    "make",
    [
        lambda: TemperatureProcessor(0.5),
        lambda: ForcedSequenceLogitsProcessor([3, 4, 5], 1, position="tokens", prompt_len=1),
        lambda: ForcedSequenceLogitsProcessor([3, 4, 5], 1),
        lambda: ThinkingBudgetLogitsProcessor(1, 2, 3, 2, 0.5),
        lambda: HelloWorldLogitsProcessor(Letters()),
    ],
)
@pytest.mark.parametrize("how", ["copy", "deepcopy", "pickle"])
def test_processors_copy_and_pickle_with_their_state(make, how):
    original = make()
    original([1, 7], torch.zeros(VOCAB))  # advance the state
    duplicate = {"copy": copy.copy, "deepcopy": copy.deepcopy, "pickle": lambda p: pickle.loads(pickle.dumps(p))}[
        how
    ](original)
    assert type(duplicate) is type(original)
    for ids in ([1, 7, 7], [1, 7, 7, 3], [1, 7, 7, 3, 9]):
        mine, theirs = torch.arange(VOCAB, dtype=torch.float32), torch.arange(VOCAB, dtype=torch.float32)
        original(ids, mine)
        duplicate(ids, theirs)
        assert torch.equal(mine, theirs)


class Letters:
    """A toy tokenizer: one id per character, modulo the test vocab."""

    eos_token_id = 0

    def encode(self, text, add_special_tokens=False):
        return [ord(c) % VOCAB for c in text]


def test_subclasses_keep_the_builtin_behaviour():
    class Warmer(TemperatureProcessor):
        pass

    class Budget(ThinkingBudgetLogitsProcessor):
        pass

    logits = torch.ones(VOCAB)
    Warmer(0.5)([], logits)
    assert torch.equal(logits, torch.full((VOCAB,), 2.0))
    assert Budget(1, 2, 3, 0).max_thinking_tokens == 0
    batch = Batch(VOCAB)
    batch.add(0, [Warmer(0.5), Budget(1, 2, 3, 0)])
    block = torch.ones(1, VOCAB)
    batch.apply(block, [[1]])
    assert block[0, 2] == 0 and torch.isinf(block[0, 0])


def test_scores_keyword_as_the_reference():
    forced = ForcedSequenceLogitsProcessor([3], 1)
    scores = torch.zeros(VOCAB)
    forced(input_ids=[], scores=scores)
    assert int(scores.argmax()) == 3
    with pytest.raises(lp.InvalidArgumentError, match="logits"):
        forced([], torch.zeros(VOCAB), scores=torch.zeros(VOCAB))
    block = torch.ones(1, VOCAB)
    batch = Batch(VOCAB)
    batch.add(0, TEMPERATURE)
    batch.apply(scores=block, input_ids=[[1]])
    assert block[0, 0] == 2


@pytest.mark.parametrize(
    "edit",
    [
        lambda t: TemperatureProcessor(0.5)([], t),
        lambda t: ForcedSequenceLogitsProcessor([1], 0)([], t),
        lambda t: Processor(TEMPERATURE)([], t),
    ],
)
def test_an_edit_in_place_bumps_autograd_version(edit):
    # As torch's own in-place ops: a backward that saved the tensor raises rather than silently
    # using the edited values.
    weight = torch.ones(VOCAB, requires_grad=True)
    scaled = weight * 2
    loss = (scaled * scaled).sum()  # saves `scaled` for backward
    edit(scaled.detach())
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_batch_edit_bumps_autograd_version():
    weight = torch.ones(1, VOCAB, requires_grad=True)
    scaled = weight * 2
    loss = (scaled * scaled).sum()
    batch = Batch(VOCAB)
    batch.add(0, TEMPERATURE)
    batch.apply(scaled.detach(), [[1]])
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def adapter_entry_points():
    from logits_processing.adapters import _common
    from logits_processing.adapters.hf import HFLogitsProcessor
    from logits_processing.adapters.trtllm import TRTLLMLogitsProcessor

    return {
        "decode_specs": _common.decode_specs,
        "validate_structure": _common.validate_structure,
        "hf": lambda specs: HFLogitsProcessor(specs, vocab_size=VOCAB),
        "trtllm": lambda specs: TRTLLMLogitsProcessor(specs, vocab_size=VOCAB),
    }


@pytest.mark.parametrize("entry", ["decode_specs", "validate_structure", "hf", "trtllm"])
@pytest.mark.parametrize(
    "payload, cls",
    [
        (b'{"kind": "temperature", "temperature": 0.5, "x": "\xff"}', lp.SpecError),
        (bytearray(b"\xc3\x28"), lp.SpecError),
        ("[" * 100000, lp.SpecError),
        (b"[" * 100000, lp.SpecError),
        ('{"kind": "temperature", "temperature": "\ud800"}', lp.SpecError),
        ("not json", lp.SpecError),
        (5, lp.LogitsProcessingError),
    ],
    ids=["bytes-not-utf8", "bytearray-not-utf8", "deep-text", "deep-bytes", "surrogate", "not-json", "int"],
)
def test_adapters_answer_bad_payloads_with_ours(entry, payload, cls):
    if entry == "decode_specs" and isinstance(payload, str) and "\ud800" in payload:
        pytest.skip("decode_specs only parses; the surrogate is refused when the spec is validated")
    with pytest.raises(cls):
        adapter_entry_points()[entry](payload)
