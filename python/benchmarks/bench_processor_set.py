"""The processor set beside transformers' processors on the same tensors, one run.

    python python/benchmarks/bench_processor_set.py [--rounds 15] [--torch-threads 1]

At vocab 151,936, f32, rows shaped like a model's (a normal tail, a few dozen likely tokens):
- top-k 50, top-p 0.9, min-p 0.05 on one row: ``Batch.apply(..., out=)`` (one pass, the input
  left alone, as transformers' warpers leave it) against the transformers warper, each beside a
  ``torch`` copy of the row measured in the same rounds;
- a [64, V] block with repetition penalty 1.1, temperature 0.7 and top-p 0.9 per row over 4,000
  ids of history: one ``Batch.apply(..., out=)`` against transformers' processor list, beside the
  block's copy.

Rounds interleave the candidates so that all see the same (shared, noisy) machine; figures are the
minimum and the median over rounds, in microseconds per call.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers.generation import logits_process as hf

from logits_processing import Batch

VOCAB = 151_936


def model_like(rows: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, VOCAB, generator=g) * 2.5 - 2.0
    for r in range(rows):
        idx = torch.randint(0, VOCAB, (32,), generator=g)
        x[r, idx] = 8.0 + torch.rand(32, generator=g) * 8.0
    return x


def measure(fns, rounds, calls):
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter() - t0) / calls * 1e6)
    return {name: (min(t), statistics.median(t)) for name, t in times.items()}


def report(title, results, baseline="memcpy"):
    print(f"== {title}: us per call, min / median; ratios of medians")
    base = results[baseline][1]
    for name, (low, median) in results.items():
        print(f"  {name:28s} {low:10.1f} {median:10.1f}   x memcpy {median / base:7.2f}")


def one_row(rounds):
    scores = model_like(1)
    ids = torch.zeros(1, 8, dtype=torch.long)
    out = torch.empty_like(scores)
    rules = {
        "top_k 50": ({"kind": "top_k", "k": 50}, hf.TopKLogitsWarper(50)),
        "top_p 0.9": ({"kind": "top_p", "p": 0.9}, hf.TopPLogitsWarper(0.9)),
        "min_p 0.05": ({"kind": "min_p", "p": 0.05}, hf.MinPLogitsWarper(0.05)),
    }
    for name, (spec, warper) in rules.items():
        batch = Batch(VOCAB)
        batch.add(0, spec)
        history = [ids[0].tolist()]
        results = measure(
            {
                "memcpy": lambda: out.copy_(scores),
                "ours": lambda batch=batch, history=history: batch.apply(scores, history, out=out),
                "transformers": lambda warper=warper: warper(ids, scores),
            },
            rounds,
            calls=3,
        )
        report(f"one row, {name}", results)
        print(
            f"  speed-up over transformers (medians): {results['transformers'][1] / results['ours'][1]:.1f}x"
        )


def sampling_batch(rounds, rows=64):
    scores = model_like(rows, seed=1)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(1000, 6000, (rows, 4000), generator=g)
    histories = [row.tolist() for row in ids]
    out = torch.empty_like(scores)
    batch = Batch(VOCAB)
    specs = [
        {"kind": "repetition_penalty", "penalty": 1.1},
        {"kind": "temperature", "temperature": 0.7},
        {"kind": "top_p", "p": 0.9},
    ]
    for row in range(rows):
        batch.add(row, specs, prompt_len=100)
    theirs = hf.LogitsProcessorList(
        [hf.RepetitionPenaltyLogitsProcessor(1.1), hf.TemperatureLogitsWarper(0.7), hf.TopPLogitsWarper(0.9)]
    )
    results = measure(
        {
            "memcpy": lambda: out.copy_(scores),
            "ours": lambda: batch.apply(scores, histories, out=out),
            "transformers": lambda: theirs(ids, scores),
        },
        rounds,
        calls=1,
    )
    report(f"[{rows}, {VOCAB}] repetition penalty + temperature + top-p", results)
    print(f"  speed-up over transformers (medians): {results['transformers'][1] / results['ours'][1]:.1f}x")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    # One torch thread by default: on a loaded machine torch's second thread is often descheduled,
    # and a copy that waits for it measures the scheduler (single-row calls here use one thread).
    parser.add_argument("--torch-threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.torch_threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} torch threads")
    one_row(args.rounds)
    sampling_batch(max(3, args.rounds // 3))


if __name__ == "__main__":
    main()
