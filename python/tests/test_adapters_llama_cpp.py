"""The llama-cpp-python adapter without the engine: a stand-in ``Llama`` (its tokenizer, vocab and
EOS) and llama-cpp-python's call shape, ``f(input_ids, scores)`` on numpy arrays. The real engine
runs in test_engine_llama_cpp.py (its own venv)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from logits_processing import ArgumentTypeError, SpecError
from logits_processing.adapters.llama_cpp import LlamaCppLogitsProcessor, context_from_llama

VOCAB, EOS = 64, 2


class StandInLlama:
    """What the adapter reads of a ``llama_cpp.Llama``: one id per byte, shifted."""

    metadata = {"general.name": "stand-in"}

    def token_eos(self):
        return EOS

    def n_vocab(self):
        return VOCAB

    def tokenize(self, text, add_bos=True, special=False):
        return ([1] if add_bos else []) + [3 + b % 60 for b in text]

    def detokenize(self, ids):
        return bytes(i - 3 for i in ids if i >= 3)


def step(proc, ids):
    row = np.zeros(VOCAB, dtype=np.float32)
    out = proc(np.array(ids, dtype=np.intc), row)
    assert out is row  # edited in place: llama-cpp-python samples from the returned row
    return out


def test_forced_sequence_and_a_new_prompt_starts_over():
    proc = LlamaCppLogitsProcessor(
        {"kind": "forced_sequence", "token_ids": [7, 8], "eos_token_id": EOS}, llama=StandInLlama()
    )
    ids = [1, 5, 6]
    for want in (7, 8, EOS):
        row = step(proc, ids)
        assert int(row.argmax()) == want and np.isneginf(row).sum() == VOCAB - 1
        ids.append(want)
    assert proc.prompt_len == 3
    # A different prompt (even a longer one) is a new generation.
    assert int(step(proc, [1, 9, 9, 9, 9, 9]).argmax()) == 7
    assert proc.prompt_len == 6
    # The same prompt again, after the generation ended, also starts over.
    assert int(step(proc, [1, 9, 9, 9, 9, 9]).argmax()) == 7


@pytest.mark.parametrize(
    "pipeline",
    [
        [{"kind": "temperature", "temperature": 0.5}, {"kind": "top_k", "k": 3}],
        [{"kind": "repetition_penalty", "penalty": 1.5}, {"kind": "no_repeat_ngram", "n": 2}],
    ],
)
def test_no_step_reads_a_device(pipeline):
    """llama-cpp-python hands host arrays: ``device_reads`` stays 0 at every step, for
    history-free specs and history readers alike."""
    proc = LlamaCppLogitsProcessor(pipeline, llama=StandInLlama())
    ids = [1, 5, 6]
    for _ in range(3):
        ids.append(int(step(proc, ids).argmax()))
        assert proc.device_reads == 0


def test_a_prompt_that_extends_the_last_output_starts_over():
    proc = LlamaCppLogitsProcessor(
        {"kind": "forced_sequence", "token_ids": [7, 8], "eos_token_id": EOS}, llama=StandInLlama()
    )
    assert int(step(proc, [1, 5]).argmax()) == 7
    # The same generation's next call has one id more; a follow-up prompt (the output and more)
    # has several, and is forced from the start.
    assert int(step(proc, [1, 5, 7, 20, 21]).argmax()) == 7 and proc.prompt_len == 5
    assert int(step(proc, [1, 5, 7, 20, 21, 7]).argmax()) == 8 and proc.prompt_len == 5


def test_context_from_the_llama_object():
    context = context_from_llama(StandInLlama())
    assert context.vocab_size == VOCAB and context.eos_token_ids == [EOS]
    # The Llama's own tokenizer, without BOS.
    assert context.hello_world == (StandInLlama().tokenize(b"Hello world!", add_bos=False), EOS)
    proc = LlamaCppLogitsProcessor({"kind": "hello_world"}, context=context)
    assert int(step(proc, [1]).argmax()) == context.hello_world[0][0]


def test_refusals_name_what_is_wrong():
    llama = StandInLlama()
    with pytest.raises(SpecError):
        LlamaCppLogitsProcessor({"kind": "ban_tokens", "token_ids": [VOCAB]}, llama=llama)
    with pytest.raises(SpecError):  # no mask comes from llama-cpp-python
        LlamaCppLogitsProcessor({"kind": "bitmask"}, llama=llama)
    with pytest.raises(SpecError, match="tokenizer"):  # token texts need a tokenizer llguidance reads
        LlamaCppLogitsProcessor({"kind": "ban_strings", "strings": ["no"]}, llama=llama)
    with pytest.raises(ArgumentTypeError):
        LlamaCppLogitsProcessor({"kind": "temperature", "temperature": 0.5})
    context = context_from_llama(llama)
    with pytest.raises(ArgumentTypeError):
        LlamaCppLogitsProcessor({"kind": "temperature", "temperature": 0.5}, llama=llama, context=context)


def test_python_callables_run_in_the_pipeline():
    seen = []
    proc = LlamaCppLogitsProcessor(
        [lambda ids, row: seen.append(len(ids)), {"kind": "temperature", "temperature": 0.5}],
        llama=StandInLlama(),
    )
    row = np.ones(VOCAB, dtype=np.float32)
    proc(np.array([1, 4], dtype=np.intc), row)
    assert seen == [2] and np.all(row == 2.0)


def test_an_error_ends_the_generation_and_is_kept():
    """llama-cpp-python's callback would print and drop the exception and sample from the row
    unprocessed: the processor keeps it and allows only EOS for the rest of that generation."""
    calls = []

    def fails_second(ids, row):
        calls.append(len(ids))
        if len(calls) == 2:
            raise RuntimeError("boom")

    proc = LlamaCppLogitsProcessor(
        [fails_second, {"kind": "ban_tokens", "token_ids": [9]}], llama=StandInLlama()
    )
    row = step(proc, [1, 5])
    assert proc.error is None and np.isneginf(row[9]) and np.isneginf(row).sum() == 1
    for ids in ([1, 5, 7], [1, 5, 7, EOS]):
        row = step(proc, ids)
        assert int(row.argmax()) == EOS and np.isneginf(row).sum() == VOCAB - 1
        assert "RuntimeError('boom')" in str(proc.error)  # the library's ProcessorError, naming it
    assert calls == [2, 3]  # not called again once the generation has failed
    step(proc, [1, 6])  # a new generation clears it
    assert proc.error is None and calls == [2, 3, 2]


def test_importing_the_adapter_imports_no_engine():
    code = (
        "import sys, logits_processing.adapters.llama_cpp\n"
        "assert 'llama_cpp' not in sys.modules and 'torch' not in sys.modules, sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_strided_row_is_copied_once_and_the_copy_returned():
    # llama-cpp-python 0.3's candidate array: (id, logit, p) records, every id in id order.
    records = np.zeros(
        VOCAB, dtype=np.dtype([("id", np.intc), ("logit", np.single), ("p", np.single)], align=True)
    )
    records["id"] = np.arange(VOCAB)
    proc = LlamaCppLogitsProcessor({"kind": "ban_tokens", "token_ids": [4, 9]}, llama=StandInLlama())
    view = records["logit"]
    out = proc(np.array([1, 5], dtype=np.intc), view)
    assert out is not view and out.flags.c_contiguous
    assert np.isneginf(out[[4, 9]]).all() and np.isfinite(np.delete(out, [4, 9])).all()
    assert np.all(records["logit"] == 0)  # the caller's array is the caller's to overwrite
    records["logit"][:] = out
    again = proc(np.array([1, 5, 7], dtype=np.intc), records["logit"])
    assert again is out  # the buffer is kept across steps
