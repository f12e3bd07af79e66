"""A batch step under CPU contention: its median time with the machine as it is, then with as many
busy processes as there are cores (2x oversubscription once the step's own threads run), beside a
memcpy of the same bytes (torch, one thread) measured in the same conditions; each call is timed
alone, the block restored between calls outside the timing, and medians are reported.

    python python/benchmarks/bench_contention.py [--rounds N]

The target: a busy machine costs a step at most 3x its time on the same machine without the busy
processes. Rows: 4 and 64 over a vocab of 129,280 (DeepSeek's), f32, a mixed pipeline per row
(a temperature or a forced token, alternately), edited in place.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time

import torch

from logits_processing import Batch

VOCAB = 129_280
# Memory-bound rows, as most steps are: a temperature, a forced token.
SPECS = [
    {"kind": "temperature", "temperature": 0.7},
    {"kind": "forced_sequence", "token_ids": [5], "eos_token_id": 2},
]


def spin(stop):
    x = 0
    while not stop.is_set():
        for _ in range(10_000):
            x = (x * 1103515245 + 12345) & 0xFFFFFFFF


def medians(rows, rounds, calls):
    """Median us per call of the batch step and of a memcpy of the same bytes."""
    batch = Batch(VOCAB)
    for row in range(rows):
        batch.add(row, SPECS[row % 2])
    generator = torch.Generator().manual_seed(0)
    master = torch.randn(rows, VOCAB, generator=generator)
    ids = [[int(t) for t in torch.randint(0, VOCAB, (1000,), generator=generator)] for _ in range(rows)]
    logits, dst = master.clone(), torch.empty_like(master)
    steps, copies = [], []
    for _ in range(rounds):
        for _ in range(calls):
            logits.copy_(master)  # restored outside the timed call
            t0 = time.perf_counter()
            batch.apply(logits, ids)
            steps.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            dst.copy_(logits)
            copies.append(time.perf_counter() - t0)
    return statistics.median(steps) * 1e6, statistics.median(copies) * 1e6


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    # torch's copies (the restore and the memcpy baseline) on this thread only: its OpenMP threads
    # would be contended too and blur what is measured.
    torch.set_num_threads(1)
    cores = os.cpu_count() or 1
    print(f"{cores} cores; busy processes under contention: {cores}")
    results = {}
    for rows in (4, 64):
        calls = 50 if rows == 4 else 5
        quiet = medians(rows, args.rounds, calls)
        stop = multiprocessing.Event()
        workers = [multiprocessing.Process(target=spin, args=(stop,)) for _ in range(cores)]
        for w in workers:
            w.start()
        time.sleep(0.5)
        try:
            busy = medians(rows, args.rounds, calls)
        finally:
            stop.set()
            for w in workers:
                w.join()
        results[rows] = (quiet, busy)
        print(
            f"rows {rows:3d}: step quiet {quiet[0]:8.1f} us, busy {busy[0]:8.1f} us "
            f"({busy[0] / quiet[0]:.2f}x); memcpy quiet {quiet[1]:8.1f} us, busy {busy[1]:8.1f} us "
            f"({busy[1] / quiet[1]:.2f}x)"
        )


if __name__ == "__main__":
    main()
