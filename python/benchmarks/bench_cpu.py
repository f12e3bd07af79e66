"""CPU benchmark: logits_processing beside the reference (dynamo.logits_processing), one run.

    python python/benchmarks/bench_cpu.py [--quick]

Per call at vocab 151,936 (f32 and bf16), medians: temperature, forced sequence, the thinking
budget at 1k / 8k / 32k ids of history, and a mixed Batch (a third each forced / temperature /
thinking budget over its budget, 4,000-id histories) against the reference's per-request loop at
B = 1, 64, 256; each beside a memcpy of the same bytes measured in the same run. With
``--samplers``: the mass-based truncation kinds on one f32 row (``Batch.apply(..., out=)``, one
pass into another tensor) beside torch's ``copy_`` of the row, on N(0, 1) logits, the same times
3, and a peaked row. The reference
wheel (ai-dynamo-runtime 1.6.1) has no thinking budget, so its rule is written out below in plain
Python + torch, as its later source has it (a full rescan of the ids per call).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch
from reference_rules import RefThinkingBudget  # beside this script

from logits_processing import Batch, EngineContext, ThinkingBudgetLogitsProcessor, ThinkingTokenConfig
from logits_processing.examples import ForcedSequenceLogitsProcessor, TemperatureProcessor

try:
    from dynamo.logits_processing.examples import ForcedSequenceLogitsProcessor as RefForced
    from dynamo.logits_processing.examples import TemperatureProcessor as RefTemperature
except ImportError:  # pragma: no cover
    raise SystemExit("the reference is needed: pip install --no-deps ai-dynamo-runtime==1.6.1") from None

VOCAB = 151_936
START, END, NEWLINE, WORD = 151_667, 151_668, 198, 1000


def measure(fns, data, master, calls, rounds):
    """Median time per call (us) of each of `fns`, measured in interleaved rounds so that all see
    the same machine (it is shared): each round restores `data` from `master` and times `calls`
    calls of each function in turn. `calls` may be a dict giving some functions fewer calls."""
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            n = calls[name] if isinstance(calls, dict) else calls
            data.copy_(master)
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            times[name].append((time.perf_counter() - t0) / n * 1e6)
    return {name: statistics.median(t) for name, t in times.items()}


def row_benchmarks(dtype, calls, rounds):
    """One row: {name: (ours, reference, memcpy)} in us per call."""
    master = (torch.randn(VOCAB) * 8).to(dtype)
    data = master.clone()
    dst = torch.empty_like(master)
    ids = list(range(8))
    cases = {
        "temperature(0.7)": (TemperatureProcessor(0.7), RefTemperature(0.7), ids, calls),
        "forced sequence": (
            ForcedSequenceLogitsProcessor(list(range(100, 10_100)), 2),
            RefForced(list(range(100, 10_100)), 2),
            ids,
            calls,
        ),
    }
    for n in (1_000, 8_000, 32_000):
        history = [START] + [WORD] * (n - 1)  # an open block, under its budget
        cases[f"thinking budget, {n:,} ids"] = (
            ThinkingBudgetLogitsProcessor(START, END, NEWLINE, 100_000),
            RefThinkingBudget(START, END, NEWLINE, 100_000),
            history,
            max(3, calls * 1000 // n),
        )

    def side_by_side(ours, ref, history):
        return {
            "ours": lambda: ours(history, data),
            "reference": lambda: ref(history, data),
            "memcpy": lambda: dst.copy_(data),
        }

    results = {}
    for name, (ours, ref, history, ref_calls) in cases.items():
        counts = {"ours": calls, "reference": ref_calls, "memcpy": calls}
        got = measure(side_by_side(ours, ref, history), data, master, counts, rounds)
        results[name] = (got["ours"], got["reference"], got["memcpy"])
    if dtype == torch.float32:
        a, b = master.numpy().copy(), np.empty(VOCAB, dtype=np.float32)
        nt = TemperatureProcessor(0.7)
        got = measure(
            {"ours": lambda: nt(ids, a), "memcpy": lambda: np.copyto(b, a)},
            torch.from_numpy(a),
            master,
            calls,
            rounds,
        )
        results["temperature(0.7), numpy"] = (got["ours"], None, got["memcpy"])
    return results


def batch_benchmarks(dtype, sizes, rounds):
    """The mixed batch: {rows: (ours, reference loop, memcpy of the block)} in us per step."""
    return {rows: mixed_batch(dtype, rows, rounds) for rows in sizes}


def mixed_batch(dtype, rows, rounds):
    """(ours, reference loop, memcpy of the block) in us per step, for `rows` rows."""
    history = [START] + [WORD] * 3_999  # 4,000 ids, thinking past a budget of 100
    master = (torch.randn(rows, VOCAB) * 8).to(dtype)
    data = master.clone()
    dst = torch.empty_like(master)
    batch = Batch(VOCAB, context=EngineContext(thinking_tokens=ThinkingTokenConfig(START, END, NEWLINE)))
    refs = []
    for row in range(rows):
        kind = row % 3
        if kind == 0:
            batch.add(row, {"kind": "forced_sequence", "token_ids": list(range(100, 200)), "eos_token_id": 2})
            refs.append(RefForced(list(range(100, 200)), 2))
        elif kind == 1:
            batch.add(row, {"kind": "temperature", "temperature": 0.7})
            refs.append(RefTemperature(0.7))
        else:
            batch.add(row, {"kind": "thinking_budget", "max_thinking_tokens": 100})
            refs.append(RefThinkingBudget(START, END, NEWLINE, 100))
    ids = [history] * rows

    def reference_loop():
        for row in range(rows):
            refs[row](ids[row], data[row])

    got = measure(
        {
            "ours": lambda: batch.apply(data, ids),
            "reference": reference_loop,
            "memcpy": lambda: dst.copy_(data),
        },
        data,
        master,
        max(2, 64 // rows),
        rounds,
    )
    return got["ours"], got["reference"], got["memcpy"]


SAMPLER_SPECS = {
    "top_p 0.9": {"kind": "top_p", "p": 0.9},
    "top_p 0.99": {"kind": "top_p", "p": 0.99},
    "typical_p 0.9": {"kind": "typical_p", "mass": 0.9},
    "epsilon_cutoff 3e-4": {"kind": "epsilon_cutoff", "epsilon": 3e-4},
    "eta_cutoff 3e-4": {"kind": "eta_cutoff", "epsilon": 3e-4},
    "top_n_sigma 1": {"kind": "top_n_sigma", "n": 1.0},
    "top_a 0.2": {"kind": "top_a", "a": 0.2},
    "tail_free 0.95": {"kind": "tail_free", "z": 0.95},
    "xtc 0.1 (probability 1)": {"kind": "xtc", "probability": 1.0, "threshold": 0.1},
    "mirostat v2 (mu 10)": {"kind": "mirostat", "version": 2, "tau": 5.0},
    "mirostat v1 (mu 10)": {"kind": "mirostat", "version": 1, "tau": 5.0},
    "min_p 0.05": {"kind": "min_p", "p": 0.05},
}


def sampler_rows():
    """One N(0, 1) row (sampling at temperature 1 from a flat model), the same times 3 (a few
    large values hold much of its mass, though not within 4 of the maximum) and one peaked row (a
    normal tail around -2, 32 likely tokens between 8 and 16), as [1, VOCAB] f32."""
    g = torch.Generator().manual_seed(7)
    flat = torch.randn(1, VOCAB, generator=g)
    peaked = torch.randn(1, VOCAB, generator=g) * 2.5 - 2.0
    likely = torch.randint(0, VOCAB, (32,), generator=g)
    peaked[0, likely] = 8.0 + torch.rand(32, generator=g) * 8.0
    return {"normal": flat, "normal x3": flat * 3.0, "peaked": peaked}


def sampler_benchmarks(calls, rounds):
    """{(kind, shape): (ours, memcpy)} in us per call: a one-row Batch applied out of place."""
    results = {}
    ids = [list(range(100))]
    for shape, master in sampler_rows().items():
        dst = torch.empty_like(master)
        for name, spec in SAMPLER_SPECS.items():
            batch = Batch(VOCAB)
            batch.add(0, spec)
            fns = {
                "ours": lambda batch=batch, master=master, dst=dst: batch.apply(master, ids, out=dst),
                "memcpy": lambda master=master, dst=dst: dst.copy_(master),
            }
            counts = {"ours": max(3, calls // 5) if "tail_free" in name else calls, "memcpy": calls}
            got = measure(fns, dst, master, counts, rounds)
            results[(name, shape)] = (got["ours"], got["memcpy"])
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument(
        "--torch-threads",
        type=int,
        help="torch's intra-op threads (the reference and the memcpy); on a busy machine 1 is steadier",
    )
    parser.add_argument(
        "--samplers", action="store_true", help="only the truncation kinds on one row (no reference)"
    )
    args = parser.parse_args()
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    calls, rounds = (20, 9) if args.quick else (50, 31)
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} torch threads, vocab {VOCAB:,}, "
        f"{os.cpu_count()} CPUs, load average {load}"
    )
    if args.samplers:
        print("one f32 row, Batch.apply(row, ids, out=) beside torch copy_ of the row: median us per call")
        for (name, shape), (ours, memcpy) in sampler_benchmarks(calls, rounds).items():
            print(
                f"  {shape:<9} {name:<24} ours {ours:9.1f}   memcpy {memcpy:6.2f}   ours/memcpy {ours / memcpy:6.1f}"
            )
        return
    print("reference: dynamo.logits_processing (ai-dynamo-runtime 1.6.1); its thinking budget is the")
    print("rule of its later source written out in plain Python + torch (the 1.6.1 wheel lacks it).")
    print("memcpy: torch copy_ of the same bytes (numpy copyto for the numpy row), same rounds.\n")
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).replace("torch.", "")
        print(f"== one row, {name}: median us per call")
        for key, (ours, ref, memcpy) in row_benchmarks(dtype, calls, rounds).items():
            versus = f"reference {ref:9.2f}   speed-up {ref / ours:7.1f}x" if ref else " " * 38
            print(
                f"  {key:<28} ours {ours:8.2f}   {versus}   memcpy {memcpy:6.2f}   ours/memcpy {ours / memcpy:5.2f}"
            )
        print(f"== mixed batch, {name}: median us per decode step")
        for rows, (ours, ref, memcpy) in batch_benchmarks(dtype, (1, 64, 256), max(5, rounds // 3)).items():
            print(
                f"  B={rows:<4} ours {ours:10.1f}   reference loop {ref:10.1f}   speed-up {ref / ours:6.1f}x"
                f"   memcpy {memcpy:10.1f}   ours/memcpy {ours / memcpy:5.2f}"
            )
        print()


if __name__ == "__main__":
    main()
