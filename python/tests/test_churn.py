"""Churn: a million requests pass through a ``Batch`` and through the engine adapters' shared
``KeyedBatch`` (vLLM's, SGLang's and TRT-LLM's batched path), and per-request processor objects
(HF, TRT-LLM, ``Processor``) are made and dropped by the fifty thousand; resident memory after
is what it was after a warm-up. Marked slow; the test command runs it (deselect with
``-m "not slow"``)."""

from __future__ import annotations

import os

import pytest
import torch

import logits_processing as lp
from logits_processing.adapters._common import EngineContext, KeyedBatch

pytestmark = pytest.mark.slow

VOCAB = 256
ROWS = 64
# Memory a million requests may leave behind: allocator noise, never a per-request leak (a leak
# of even 16 bytes per request would be 16 MB).
GROWTH_LIMIT = 8 << 20

SPECS = [
    [{"kind": "temperature", "temperature": 0.7}],
    [{"kind": "forced_sequence", "token_ids": [5, 6, 7], "eos_token_id": 1}],
    [{"kind": "repetition_penalty", "penalty": 1.2}, {"kind": "top_k", "k": 8}],
    [{"kind": "thinking_budget", "max_thinking_tokens": 4}],
    [{"kind": "ban_tokens", "token_ids": [3, 4]}, {"kind": "min_p", "p": 0.1}],
]


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def flat_memory(run, total, warmup_share=0.1):
    """Runs `run(n)` for a warm-up, then for the rest; returns the RSS growth over the rest."""
    warm = int(total * warmup_share)
    run(warm)
    before = rss()
    run(total - warm)
    return rss() - before


def test_a_million_requests_through_a_batch():
    batch = lp.Batch(VOCAB, context=lp.EngineContext(thinking_tokens=lp.ThinkingTokenConfig(1, 2, 3)))
    logits = torch.zeros(ROWS, VOCAB)
    ids = [[1, 9, 9, 9]] * ROWS
    counter = iter(range(10**9))

    def run(requests):
        for _ in range(requests):
            n = next(counter)
            row = n % ROWS
            batch.add(row, SPECS[n % len(SPECS)])
            if row == ROWS - 1:  # a step per full batch, then the batch turns over
                batch.apply(logits, ids)
                if n % (ROWS * 3) == ROWS - 1:
                    batch.move(0, ROWS - 1)
                    batch.swap(1, 2)
        for row in batch.rows():
            batch.remove(row)

    growth = flat_memory(run, 1_000_000)
    assert batch.occupied == 0
    print(f"RSS growth after the warm-up: {growth} bytes")
    assert growth < GROWTH_LIMIT, growth


def test_a_million_requests_through_the_keyed_batch_of_the_adapters():
    keyed = KeyedBatch(EngineContext(vocab_size=VOCAB, thinking_tokens=lp.ThinkingTokenConfig(1, 2, 3)))
    logits = torch.zeros(ROWS, VOCAB)
    counter = iter(range(10**9))

    def run(requests):
        for _ in range(requests // ROWS):
            base = next(counter) * ROWS
            # Each call half the rows are new requests and half carry on from the last call.
            requests_now = [
                (base + i if i % 2 else base - ROWS + i + 1, SPECS[i % len(SPECS)], 0, [1, 9, 9])
                for i in range(ROWS)
            ]
            keyed.apply(logits, requests_now)

    growth = flat_memory(run, 1_000_000)
    assert len(keyed) <= ROWS
    print(f"RSS growth after the warm-up: {growth} bytes")
    assert growth < GROWTH_LIMIT, growth


@pytest.mark.parametrize("which", ["processor", "hf", "trtllm"])
def test_per_request_objects_are_freed(which):
    from logits_processing.adapters.hf import HFLogitsProcessor
    from logits_processing.adapters.trtllm import TRTLLMLogitsProcessor

    context = EngineContext(vocab_size=VOCAB, thinking_tokens=lp.ThinkingTokenConfig(1, 2, 3))
    row = torch.zeros(VOCAB)
    scores = torch.zeros(1, VOCAB)
    input_ids = torch.tensor([[1, 9, 9]])
    counter = iter(range(10**9))

    def run(requests):
        for _ in range(requests):
            specs = SPECS[next(counter) % len(SPECS)]
            if which == "processor":
                lp.Processor(specs, context=context)([1, 9, 9], row)
            elif which == "hf":
                HFLogitsProcessor(specs, vocab_size=VOCAB, thinking_tokens=lp.ThinkingTokenConfig(1, 2, 3))(
                    input_ids, scores
                )
            else:
                TRTLLMLogitsProcessor(specs, context=context, disable_overlap_scheduler=True)(0, scores.view(1, 1, VOCAB), [[1, 9, 9]], None, None)

    growth = flat_memory(run, 50_000)
    print(f"RSS growth after the warm-up: {growth} bytes")
    assert growth < GROWTH_LIMIT, growth
