"""Our kinds beside llama.cpp's own samplers (libllama through its public sampler API), one run.

    python python/benchmarks/bench_llamacpp.py [--quick] [--cpu auto|avx2|portable] [--json out.json]

One thread each (RAYON_NUM_THREADS=1), vocab 151,936, f32, on three rows: flat N(0, 1), peaked
N(0, 16), and a realistic one (Zipf-shaped logits with noise). Per kind, the median time of one
call: ours (`Processor(spec)(ids, row)`, the row restored between calls, untimed) and llama.cpp's
`llama_sampler_apply` on a token array of every id (refilled between calls, untimed; the fill,
which `llama_sampler_sample` does each token, is reported on its own line), each as a ratio to a
memcpy of the row (`numpy.copyto`, the row in cache, as ours finds it) timed in the same rounds.
Every row rule llama.cpp has, ours alone for those it has not (epsilon, eta, top-a, p-less,
top-H, tail-free, smoothing), and llama.cpp's default chain (of its samplers, the four on at
their defaults: top-k 40, top-p 0.95, min-p 0.05, temperature 0.8) in four orders, each as one
spec list and as llama.cpp's chain sampler of the same samplers in the same order. `--cpu` caps
our SIMD paths (`LOGITS_PROCESSING_CPU`); llama.cpp's are its build's.

The library is the one scripts/llamacpp.sh builds (or LLAMACPP_LIB).
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

# The untimed row restore (`Tensor.copy_`) would otherwise leave torch's OpenMP workers spinning
# on the cores the timed calls run on (up to 2x on a 2-core machine).
torch.set_num_threads(1)

VOCAB = 151_936
TOKEN = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


class TokenDataArray(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("size", ctypes.c_size_t),
        ("selected", ctypes.c_int64),
        ("sorted", ctypes.c_bool),
    ]


def library():
    named = os.environ.get("LLAMACPP_LIB")
    built = sorted(glob.glob(os.path.expanduser("~/.cache/logits-processing/llamacpp/build-*/bin/libllama.so")))
    path = named or (built[-1] if built else None)
    if not path or not os.path.exists(path):
        raise SystemExit("bench_llamacpp: libllama.so not found: run scripts/llamacpp.sh (or set LLAMACPP_LIB)")
    lib = ctypes.CDLL(path)
    sampler, f, i32, u32, size = ctypes.c_void_p, ctypes.c_float, ctypes.c_int32, ctypes.c_uint32, ctypes.c_size_t
    for name, args, result in [
        ("llama_sampler_init_top_k", [i32], sampler),
        ("llama_sampler_init_top_p", [f, size], sampler),
        ("llama_sampler_init_min_p", [f, size], sampler),
        ("llama_sampler_init_typical", [f, size], sampler),
        ("llama_sampler_init_temp", [f], sampler),
        ("llama_sampler_init_temp_ext", [f, f, f], sampler),
        ("llama_sampler_init_xtc", [f, f, size, u32], sampler),
        ("llama_sampler_init_top_n_sigma", [f], sampler),
        ("llama_sampler_init_mirostat", [i32, u32, f, f, i32], sampler),
        ("llama_sampler_init_mirostat_v2", [u32, f, f], sampler),
        ("llama_sampler_init_adaptive_p", [f, f, u32], sampler),
        ("llama_sampler_init_penalties", [i32, i32, f, f, f], sampler),
        ("llama_sampler_chain_add", [sampler, sampler], None),
        ("llama_sampler_apply", [sampler, ctypes.POINTER(TokenDataArray)], None),
        ("llama_sampler_accept", [sampler, i32], None),
        ("llama_sampler_free", [sampler], None),
    ]:
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, result
    # llama_sampler_chain_init takes a struct of one bool (no_perf) by value.
    lib.llama_sampler_chain_init.argtypes = [ctypes.c_bool]
    lib.llama_sampler_chain_init.restype = sampler
    return lib


def rows(seed=0):
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, VOCAB + 1, dtype=np.float64)
    zipf = (-1.1 * np.log(ranks) + rng.normal(0, 0.5, VOCAB)).astype(np.float32)
    rng.shuffle(zipf)
    return {
        "flat": rng.normal(0, 1, VOCAB).astype(np.float32),
        "peaked": rng.normal(0, 16, VOCAB).astype(np.float32),
        "realistic": zipf * 3,
    }


def kinds(lib, history):
    """(name, our specs, a function making llama.cpp's sampler, or None where it has none)."""
    seed = 7
    samplers = {
        "top_k": ({"kind": "top_k", "k": 40}, lambda: lib.llama_sampler_init_top_k(40)),
        "top_p": ({"kind": "top_p", "p": 0.95}, lambda: lib.llama_sampler_init_top_p(0.95, 1)),
        "min_p": ({"kind": "min_p", "p": 0.05}, lambda: lib.llama_sampler_init_min_p(0.05, 1)),
        "temperature": ({"kind": "temperature", "temperature": 0.8}, lambda: lib.llama_sampler_init_temp(0.8)),
    }
    alone = [
        ("top_k 40", "top_k"),
        ("top_p 0.95", "top_p"),
        ("min_p 0.05", "min_p"),
        ("temperature 0.8", "temperature"),
    ]
    chains = [
        ("default chain", ["top_k", "top_p", "min_p", "temperature"]),
        ("chain: temperature first", ["temperature", "top_k", "top_p", "min_p"]),
        ("chain: min_p first", ["min_p", "top_p", "top_k", "temperature"]),
        ("chain: top_p first", ["top_p", "top_k", "min_p", "temperature"]),
    ]
    return (
        [(name, [samplers[key][0]], samplers[key][1]) for name, key in alone]
        + [
            ("typical 0.9", [{"kind": "typical_p", "mass": 0.9}], lambda: lib.llama_sampler_init_typical(0.9, 1)),
            (
                "dynamic temperature",
                [{"kind": "dynamic_temperature", "temperature": 0.8, "range": 0.5}],
                lambda: lib.llama_sampler_init_temp_ext(0.8, 0.5, 1.0),
            ),
            (
                "xtc p=1 0.1",
                [{"kind": "xtc", "probability": 1.0, "threshold": 0.1, "seed": seed}],
                lambda: lib.llama_sampler_init_xtc(1.0, 0.1, 1, seed),
            ),
            ("top_n_sigma 1", [{"kind": "top_n_sigma", "n": 1.0}], lambda: lib.llama_sampler_init_top_n_sigma(1.0)),
            (
                "mirostat v1",
                [{"kind": "mirostat", "version": 1, "tau": 5.0, "eta": 0.1, "m": 100, "n_vocab": VOCAB}],
                lambda: lib.llama_sampler_init_mirostat(VOCAB, seed, 5.0, 0.1, 100),
            ),
            (
                "mirostat v2",
                [{"kind": "mirostat", "version": 2, "tau": 5.0, "eta": 0.1}],
                lambda: lib.llama_sampler_init_mirostat_v2(seed, 5.0, 0.1),
            ),
            (
                "adaptive_p 0.3",
                [{"kind": "adaptive_p", "target": 0.3}],
                lambda: lib.llama_sampler_init_adaptive_p(0.3, 0.9, seed),
            ),
            (
                "penalties 64",
                [{"kind": "repetition_penalty", "penalty": 1.1, "window": 64}],
                lambda: penalties(lib, history),
            ),
            ("epsilon 3e-4", [{"kind": "epsilon_cutoff", "epsilon": 3e-4}], None),
            ("eta 3e-4", [{"kind": "eta_cutoff", "epsilon": 3e-4}], None),
            ("top_a 0.2", [{"kind": "top_a", "a": 0.2}], None),
            ("p_less", [{"kind": "p_less"}], None),
            ("top_h 0.4", [{"kind": "top_h", "top_h": 0.4}], None),
            ("tail_free 0.95", [{"kind": "tail_free", "z": 0.95}], None),
            ("smoothing 0.3", [{"kind": "smoothing", "factor": 0.3}], None),
        ]
        + [
            (name, [samplers[key][0] for key in keys], lambda keys=keys: chain(lib, [samplers[key][1]() for key in keys]))
            for name, keys in chains
        ]
    )


def penalties(lib, history):
    sampler = lib.llama_sampler_init_penalties(VOCAB, 64, 1.1, 0.0, 0.0)
    for token in history[-64:]:
        lib.llama_sampler_accept(sampler, int(token))
    return sampler


def chain(lib, samplers):
    made = lib.llama_sampler_chain_init(True)
    for sampler in samplers:
        lib.llama_sampler_chain_add(made, sampler)
    return made


def median_us(samples):
    return statistics.median(samples) / 1e3


def bench_row(lib, row, calls, history):
    """{name: (ours us, llama.cpp us or None)} and (memcpy us, fill us), from interleaved rounds."""
    from logits_processing import Processor

    master = torch.from_numpy(row.copy())
    logits = master.clone()
    scratch = np.empty_like(row)
    template = np.empty(VOCAB, dtype=TOKEN)
    template["id"] = np.arange(VOCAB, dtype=np.int32)
    template["logit"] = row
    template["p"] = 0.0
    tokens = template.copy()
    array = TokenDataArray(tokens.ctypes.data, VOCAB, -1, False)
    copies, fills = [], []
    results = {}
    for name, specs, make in kinds(lib, history):
        processor = Processor(specs, prompt_len=0)
        ids = list(history)
        sampler = make() if make else None
        ours, theirs = [], []
        for _ in range(calls):
            # The copy the way ours finds its row: in cache (a first copy brings both in).
            np.copyto(scratch, row)
            t0 = time.perf_counter_ns()
            np.copyto(scratch, row)
            copies.append(time.perf_counter_ns() - t0)
            logits.copy_(master)
            t0 = time.perf_counter_ns()
            processor(ids, logits)
            ours.append(time.perf_counter_ns() - t0)
            if sampler is None:
                continue
            t0 = time.perf_counter_ns()
            np.copyto(tokens, template)
            fills.append(time.perf_counter_ns() - t0)
            # A sampler may move the array's start (XTC drops the head by advancing `data`).
            array.data, array.size, array.selected, array.sorted = tokens.ctypes.data, VOCAB, -1, False
            t0 = time.perf_counter_ns()
            lib.llama_sampler_apply(sampler, ctypes.byref(array))
            theirs.append(time.perf_counter_ns() - t0)
        if sampler is not None:
            lib.llama_sampler_free(sampler)
        results[name] = (median_us(ours), median_us(theirs) if theirs else None)
    return results, median_us(copies), median_us(fills)


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read().splitlines()
    except OSError:
        return platform.processor() or "unknown CPU"
    name = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), "unknown CPU")
    flags = next((line for line in info if line.startswith("flags")), "")
    simd = "AVX-512" if " avx512f" in flags else ("AVX2" if " avx2" in flags else "no AVX2")
    return f"{name} ({simd})"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls (a smoke run)")
    parser.add_argument("--cpu", choices=["auto", "avx2", "portable"], help="LOGITS_PROCESSING_CPU for ours")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if args.cpu:
        # Read once, at the extension's first use: set before it.
        os.environ["LOGITS_PROCESSING_CPU"] = args.cpu
    lib = library()
    calls = 15 if args.quick else 201
    history = list(np.random.default_rng(1).integers(0, VOCAB, 256))
    table = {}
    level = os.environ.get("LOGITS_PROCESSING_CPU", "auto")
    print(f"bench_llamacpp: vocab {VOCAB}, f32, one thread, {calls} calls each, {cpu_model()}, ours at {level}")
    for shape, row in rows().items():
        results, memcpy, fill = bench_row(lib, row, calls, history)
        table[shape] = {"memcpy_us": memcpy, "llama_fill_us": fill, "kinds": results}
        print(f"\n{shape} row: memcpy {memcpy:.1f} us; llama.cpp's token-array fill {fill:.1f} us ({fill / memcpy:.1f}x)")
        print(f"  {'kind':<26} {'ours us':>9} {'x memcpy':>9} {'llama.cpp us':>13} {'x memcpy':>9} {'ours/theirs':>12}")
        for name, (ours, theirs) in results.items():
            line = f"  {name:<26} {ours:9.1f} {ours / memcpy:9.1f}"
            if theirs is not None:
                line += f" {theirs:13.1f} {theirs / memcpy:9.1f} {ours / theirs:12.2f}"
            print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu_model(), "level": level, "vocab": VOCAB, "calls": calls, "rows": table}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
