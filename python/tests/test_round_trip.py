"""The device path's host round trip (a step's rows copied to the host, edited there by the CPU
path, copied back), which carries every step the kernels cannot: the kinds whose plans they do not
carry, every step on a device whose kernels failed to load or their self-check, and every step with
``LOGITS_PROCESSING_DEVICE=host``. Without a GPU it runs here through a test hook that sends host
tensors through the same code, their memory reached by copies as a device's is: every step equals
the host path bit for bit, takes one wait, and a failed step leaves the logits and every row's
state as they were."""

from __future__ import annotations

import contextlib

import pytest
import torch

import logits_processing as lp
from logits_processing import Batch, Processor

testing = lp._lib._testing
if not hasattr(testing, "_round_trip_host_tensors"):
    pytest.skip("this build has no CUDA path (feature cuda)", allow_module_level=True)

VOCAB = 64
EOS = 0

# The kinds whose plans the kernels do not carry (some only on some steps), as in issue 27, and
# rows the kernels carry beside them.
PIPELINES = [
    [{"kind": "smoothing", "factor": 0.5}],
    [{"kind": "dynamic_temperature", "temperature": 0.8, "range": 0.3}],
    [{"kind": "top_n_sigma", "n": 1.0}],
    [{"kind": "top_a", "a": 0.2}],
    [{"kind": "p_less"}],
    [{"kind": "watermark", "seeding_scheme": "selfhash", "context_width": 2, "bias": 3.0, "vocab_size": VOCAB}],
    [{"kind": "tail_free", "z": 0.9}],
    [{"kind": "xtc", "probability": 0.5, "threshold": 0.05, "seed": 7}],
    [{"kind": "mirostat", "version": 2, "tau": 3.0}],
    [{"kind": "mirostat", "version": 1, "tau": 3.0, "n_vocab": VOCAB}],
    [{"kind": "min_p", "p": 0.02}, {"kind": "adaptive_p", "target": 0.5}],
    [{"kind": "force_last_phrase", "phrase": [40, 41, 42], "eos_token_id": EOS}],
    [{"kind": "trigger_phrase", "phrase": [43, 44], "trigger_token_phrase": 7, "trigger_count": 2}],
    [{"kind": "prevent_hallucination", "minp": 0.3, "tolerate": 1, "phrase": [45, 46]}],
    [{"kind": "repetition_penalty", "penalty": 1.3}, {"kind": "top_k", "k": 5}],
    [{"kind": "temperature", "temperature": 0.7}],
]


@contextlib.contextmanager
def round_trip():
    before = testing._round_trip_host_tensors(True)
    try:
        yield
    finally:
        testing._round_trip_host_tensors(before)


def padded(rows, dtype, generator):
    """Logits with a row stride above the vocab, as an engine's padded block."""
    wide = torch.randn(rows, VOCAB + 5, generator=generator) * 3
    return wide.to(dtype)[:, :VOCAB]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_every_step_equals_the_host_path_with_one_wait(dtype):
    generator = torch.Generator().manual_seed(1)
    tripped, host = Batch(VOCAB), Batch(VOCAB)
    for row, specs in enumerate(PIPELINES):
        tripped.add(row, specs, prompt_len=3)
        host.add(row, specs, prompt_len=3)
    ids = [[1, 7, 2 + row] for row in range(len(PIPELINES))]
    for step in range(20):
        logits = padded(len(PIPELINES), dtype, generator)
        want = logits.clone()
        host.apply(want, ids)
        waits = testing._round_trip_waits()
        with round_trip():
            tripped.apply(logits, ids)
        assert testing._round_trip_waits() == waits + 1, "one wait a step"
        assert torch.equal(logits.view(torch.int16 if dtype != torch.float32 else torch.int32),
                           want.view(torch.int16 if dtype != torch.float32 else torch.int32)), step
        for row in range(len(PIPELINES)):
            ids[row].append(int(torch.argmax(want[row].float())))


def test_a_processor_row_equals_the_host_path():
    generator = torch.Generator().manual_seed(2)
    for specs in PIPELINES:
        tripped, host = Processor(specs, prompt_len=2), Processor(specs, prompt_len=2)
        ids = [3, 9]
        for step in range(6):
            logits = torch.randn(VOCAB, generator=generator) * 3
            want = logits.clone()
            host(ids, want)
            with round_trip():
                tripped(ids, logits)
            assert torch.equal(logits, want), (specs, step)
            ids.append(int(torch.argmax(want)))


def test_a_failed_step_leaves_the_logits_and_every_row_as_they_were():
    generator = torch.Generator().manual_seed(3)
    calls = []

    def raising(ids, row):
        calls.append(len(ids))
        row.fill_(1e9)  # edited where it lives, then it fails
        raise ValueError("the user's step raised")

    failing, untouched = Batch(VOCAB), Batch(VOCAB)
    for batch in (failing, untouched):
        for row, specs in enumerate(PIPELINES[:4]):
            batch.add(row, specs, prompt_len=2)
    failing.add(4, raising)
    untouched.add(4, lambda ids, row: None)
    ids = [[5, row] for row in range(5)]
    logits = padded(5, torch.float32, generator)
    before = logits.clone()
    with round_trip(), pytest.raises(lp.ProcessorError, match="raised"):
        failing.apply(logits, ids)
    assert calls and torch.equal(logits, before)
    # Every row's state was taken back: the next step equals a batch's that never took it.
    failing.remove(4)
    untouched.remove(4)
    logits = padded(4, torch.float32, generator)
    want = logits.clone()
    untouched.apply(want, ids[:4])
    with round_trip():
        failing.apply(logits, ids[:4])
    assert torch.equal(logits, want)


def test_multiple_choice_boosting_first_words_by_the_round_trip(deepseek_tokenizer_json):
    """multiple_choice with boost_first_words (a plan the kernels do not carry) needs the
    tokenizer's token texts: a real tokenizer's vocab, one row."""
    context = lp.EngineContext(str(deepseek_tokenizer_json))
    tokenizer = lp.Vocab(str(deepseek_tokenizer_json))
    vocab = tokenizer.vocab_size
    spec = {"kind": "multiple_choice", "choices": ["1", "2"], "boost_first_words": 2.0}
    from tokenizers import Tokenizer

    encode = Tokenizer.from_file(str(deepseek_tokenizer_json)).encode
    prompt = encode("Pick one:\n1. apples\n2. pears\nAnswer:").ids
    tripped = Processor(spec, context=context, prompt_len=len(prompt))
    host = Processor(spec, context=context, prompt_len=len(prompt))
    logits = torch.randn(vocab, generator=torch.Generator().manual_seed(4))
    want = logits.clone()
    host(prompt, want)
    with round_trip():
        tripped(prompt, logits)
    assert torch.equal(logits, want)
    assert torch.isfinite(logits).sum() == 2


@pytest.mark.slow
def test_the_gpu_checks_kind_script_passes_through_the_hook():
    """scripts/gpu-check.sh runs python/benchmarks/check_device_kinds.py on a GPU; here the same
    script on host tensors through the hook (every kind's documented example, vocab 151,936)."""
    import pathlib
    import runpy

    script = pathlib.Path(__file__).parents[1] / "benchmarks" / "check_device_kinds.py"
    main = runpy.run_path(str(script))["main"]
    assert main(["--device", "cpu", "--rows", "1", "--steps", "2"]) == 0
    assert testing._round_trip_host_tensors(False) is False  # the script turned the hook off again


def test_threads_sharing_the_round_trip_do_not_deadlock():
    """A batch whose user processor runs inside the round trip (taking the GIL back from a step
    that released it), beside a thread calling a processor through the round trip: both finish.
    (Host memory has no staging lock; on a GPU every lock is taken without the GIL, as here.)"""
    import threading
    import time

    def slow(ids, row):
        time.sleep(0.01)
        row.add_(1.0)

    batch = Batch(VOCAB)
    batch.add(0, slow)
    batch.add(1, PIPELINES[6], prompt_len=1)
    processor = Processor(PIPELINES[2], prompt_len=1)
    errors = []

    def run_batch():
        try:
            for _ in range(20):
                batch.apply(torch.randn(2, VOCAB), [[1], [1]])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def run_processor():
        try:
            for _ in range(200):
                processor([1], torch.randn(VOCAB))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    with round_trip():
        threads = [threading.Thread(target=run_batch), threading.Thread(target=run_processor)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not any(thread.is_alive() for thread in threads), "deadlocked"
    assert not errors, errors
