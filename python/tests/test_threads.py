"""Threads: an object shared between threads takes one call at a time (no lost or repeated step,
never "Already borrowed"); a call from inside its own call is a BusyError; threads with their own
objects get the answers one thread gets; two objects whose calls call each other from two threads
never deadlock. Every wait is bounded, so a deadlock fails the test."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import logits_processing as lp
from logits_processing import Batch, Processor, ThinkingBudgetLogitsProcessor
from logits_processing.examples import ForcedSequenceLogitsProcessor, TemperatureProcessor

THREADS = 8
TIMEOUT_S = 120
VOCAB = 1024


def run_threads(work, count=THREADS):
    with ThreadPoolExecutor(count) as pool:
        futures = [pool.submit(work, i) for i in range(count)]
        return [f.result(timeout=TIMEOUT_S) for f in futures]


@pytest.mark.parametrize("make", [
    lambda ids: ForcedSequenceLogitsProcessor(ids, 1),
    lambda ids: Processor({"kind": "forced_sequence", "token_ids": ids, "eos_token_id": 1}),
])
def test_a_shared_processor_loses_and_repeats_no_step(make):
    calls = 50
    forced = make(list(range(2, 2 + THREADS * calls)))

    def work(_):
        got = []
        for _ in range(calls):
            logits = torch.zeros(VOCAB)
            forced([], logits)
            got.append(int(logits.argmax()))
        return got

    seen = sorted(i for got in run_threads(work) for i in got)
    assert seen == list(range(2, 2 + THREADS * calls))


def test_a_shared_batch_loses_and_repeats_no_step():
    calls = 50
    batch = Batch(VOCAB)
    batch.add(0, {"kind": "forced_sequence", "token_ids": list(range(2, 2 + THREADS * calls)), "eos_token_id": 1})
    batch.add(1, {"kind": "temperature", "temperature": 0.5})

    def work(i):
        got = []
        for _ in range(calls):
            logits = torch.ones(2, VOCAB)
            batch.apply(logits, [[1], [2]])
            assert torch.equal(logits[1], torch.full((VOCAB,), 2.0))
            got.append(int(logits[0].argmax()))
            # Lifecycle calls from other threads meanwhile wait their turn too.
            batch.add(2 + i, {"kind": "temperature", "temperature": 2.0})
            batch.remove(2 + i)
        return got

    seen = sorted(i for got in run_threads(work) for i in got)
    assert seen == list(range(2, 2 + THREADS * calls))
    assert batch.rows() == [0, 1]


def test_a_shared_temperature_setter_and_call_never_collide():
    temperature = TemperatureProcessor(0.5)

    def work(i):
        for _ in range(200):
            if i % 2:
                temperature.temperature = 0.5
            else:
                logits = torch.ones(VOCAB)
                temperature([], logits)
                assert torch.equal(logits, torch.full((VOCAB,), 2.0))

    run_threads(work)


def test_a_call_from_inside_its_own_call_is_a_busy_error():
    batch = Batch(4)

    def calls_its_batch(ids, row):
        batch.apply(torch.zeros(1, 4), [[1]])

    batch.add(0, [{"kind": "temperature", "temperature": 0.5}, calls_its_batch])
    logits = torch.ones(1, 4)
    with pytest.raises(lp.ProcessorError) as raised:
        batch.apply(logits, [[1]])
    assert isinstance(raised.value.__cause__, lp.BusyError)
    assert torch.equal(logits, torch.ones(1, 4))
    batch.remove(0)  # the batch is usable again
    assert batch.rows() == []

    class Reentrant:
        def __iter__(self):
            budget([1], torch.zeros(4))
            return iter([1, 5])

    budget = ThinkingBudgetLogitsProcessor(1, 2, 3, 0)
    with pytest.raises(lp.BusyError):
        budget(Reentrant(), torch.zeros(4))


def test_two_batches_calling_each_other_from_two_threads_never_deadlock():
    # Thread 0 in a step of batch 0 calls batch 1 while thread 1 in a step of batch 1 calls
    # batch 0: each would wait for the other forever. The call that would close the cycle raises
    # BusyError (its step rolled back, its batch as it was); the other thread then finishes.
    batches = [Batch(4), Batch(4)]
    both_inside = threading.Barrier(2, timeout=TIMEOUT_S)

    def calls(other):
        def step(ids, row):
            both_inside.wait()
            other.rows()

        return step

    for i, batch in enumerate(batches):
        batch.add(0, [{"kind": "forced_sequence", "token_ids": [2, 3], "eos_token_id": 1}, calls(batches[1 - i])])
    outcomes = [None, None]
    blocks = [torch.ones(1, 4), torch.ones(1, 4)]

    def work(i):
        try:
            batches[i].apply(blocks[i], [[1]])
            outcomes[i] = "done"
        except lp.ProcessorError as error:
            outcomes[i] = error

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT_S)
    assert not any(thread.is_alive() for thread in threads), "deadlocked"

    failed = [i for i in range(2) if outcomes[i] != "done"]
    assert len(failed) == 1, outcomes
    (loser,) = failed
    assert isinstance(outcomes[loser].__cause__, lp.BusyError), outcomes[loser]
    assert torch.equal(blocks[loser], torch.ones(1, 4))
    assert int(blocks[1 - loser].argmax()) == 2
    # The failed step was taken back: its batch forces the first token again (alone now: the
    # steps' barrier lets one thread through).
    both_inside = threading.Barrier(1)
    block = torch.ones(1, 4)
    batches[loser].apply(block, [[1]])
    assert int(block.argmax()) == 2


def test_threads_with_their_own_objects_match_one_thread():
    specs = [
        {"kind": "repetition_penalty", "penalty": 1.3},
        {"kind": "temperature", "temperature": 0.7},
        {"kind": "top_k", "k": 50},
    ]
    generator = torch.Generator().manual_seed(0)
    steps = [torch.randn(4, VOCAB, generator=generator) for _ in range(20)]
    histories = [[[int(t) for t in torch.randint(0, VOCAB, (k + 5,), generator=generator)] for k in range(4)]]

    def run(_):
        batch = Batch(VOCAB)
        for row in range(4):
            batch.add(row, specs)
        budget = ThinkingBudgetLogitsProcessor(1, 2, 3, 3)
        out = []
        for logits in steps:
            block = logits.clone()
            batch.apply(block, histories[0])
            row = logits[0].clone()
            budget([1] + histories[0][0], row)
            out.append((block, row))
        return out

    alone = run(0)
    for together in run_threads(run):
        for (block, row), (block1, row1) in zip(together, alone):
            assert torch.equal(block.view(torch.int32), block1.view(torch.int32))
            assert torch.equal(row.view(torch.int32), row1.view(torch.int32))
