"""The exception hierarchy, and panics that become exceptions instead of aborting."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import logits_processing as lp


def test_hierarchy():
    assert issubclass(lp.LogitsProcessingError, Exception)
    for cls, builtin in [
        (lp.SpecError, ValueError),
        (lp.TokenOutOfVocabError, lp.SpecError),
        (lp.TokenOutOfVocabError, IndexError),
        (lp.ShapeError, ValueError),
        (lp.ReadOnlyError, ValueError),
        (lp.DTypeError, TypeError),
        (lp.DeviceError, ValueError),
        (lp.TokenizerError, ValueError),
        (lp.ProcessorError, RuntimeError),
        (lp.InvalidArgumentError, ValueError),
    ]:
        assert issubclass(cls, lp.LogitsProcessingError), cls
        assert issubclass(cls, builtin), (cls, builtin)
        assert cls.__module__ == "logits_processing" and cls.__doc__


@pytest.mark.parametrize("in_pool", [False, True])
def test_a_rust_panic_is_an_exception_not_an_abort(in_pool):
    # In a child process, so that an abort would show as a signal rather than kill the test run.
    code = (
        "import logits_processing as lp\n"
        "try:\n"
        f"    lp._lib._testing._panic_for_tests({in_pool})\n"
        "except BaseException as e:\n"
        "    print(type(e).__name__)\n"
        "print('alive')\n"
    )
    env = {"RUST_BACKTRACE": "0", "LOGITS_PROCESSING_TEST_HOOKS": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["PanicException", "alive"]


def test_every_error_has_field_none_when_there_is_nothing_to_name():
    errors = [
        cls
        for cls in vars(lp).values()
        if isinstance(cls, type) and issubclass(cls, lp.LogitsProcessingError)
    ]
    assert len(errors) >= 12
    for cls in errors:
        assert cls("x").field is None, cls
    with pytest.raises(lp.ShapeError) as info:
        lp.Batch(4).apply(torch.zeros(2, 5), [[1], [1]])
    assert info.value.field is None


BUDGET = {
    "kind": "thinking_budget",
    "max_thinking_tokens": 2,
    "start_token_id": 1,
    "end_token_id": 2,
    "newline_token_id": 3,
}


@pytest.mark.parametrize(
    "bad, cls",
    [
        (1.5, lp.DTypeError),
        ("7", lp.DTypeError),
        (-1, lp.InvalidArgumentError),
        (2**32, lp.InvalidArgumentError),
    ],
)
def test_a_bad_id_names_itself(bad, cls):
    processor = lp.Processor(BUDGET)
    with pytest.raises(cls) as info:
        processor([5, 1, bad], torch.zeros(8))
    assert info.value.field == "input_ids[2]", info.value

    batch = lp.Batch(8)
    batch.add(0, {"kind": "temperature", "temperature": 0.5})
    batch.add(2, BUDGET)
    with pytest.raises(cls) as info:
        batch.apply(torch.zeros(3, 8), [[7], None, [5, bad, 1]])
    assert info.value.field == "input_ids[2][1]" and info.value.row == 2, info.value
