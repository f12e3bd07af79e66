"""The exception hierarchy, and panics that become exceptions instead of aborting."""

from __future__ import annotations

import subprocess
import sys

import pytest

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
