"""Two builds of the package side by side: the mass-based kinds on rows of 151,936 f32 logits.

    python python/benchmarks/compare_builds.py BEFORE AFTER [--cpu auto|avx2|portable] [--rounds 5]

BEFORE and AFTER are directories holding a ``logits_processing`` package with its built
extension (a checkout's ``python/`` after ``maturin develop`` or a copy of it, or a
``pip install --target DIR`` of a wheel). Each round runs one process per build, in turn, so a
machine's drift reaches both alike; each process times ``Processor(spec)(ids, row)`` on four row
shapes (N(0, 1), the same times 3, uniform on [0, 8), a peaked row), the median of its calls
beside numpy's copy of the row in the same process. Prints the medians over the rounds of each
as a ratio to that copy, as a Markdown table. ``--cpu`` sets ``LOGITS_PROCESSING_CPU`` in both.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

VOCAB = 151_936
SPECS = {
    "top_p 0.9": {"kind": "top_p", "p": 0.9},
    "top_p 0.95": {"kind": "top_p", "p": 0.95},
    "top_p 0.99": {"kind": "top_p", "p": 0.99},
    "typical 0.9": {"kind": "typical_p", "mass": 0.9},
    "typical 0.95": {"kind": "typical_p", "mass": 0.95},
    "tail_free 0.95": {"kind": "tail_free", "z": 0.95},
}


def rows():
    import numpy as np

    rng = np.random.default_rng(1)
    normal = rng.standard_normal(VOCAB).astype(np.float32)
    peaked = (rng.standard_normal(VOCAB) * 2.5 - 2.0).astype(np.float32)
    peaked[rng.integers(0, VOCAB, 32)] = 8.0 + rng.random(32).astype(np.float32) * 8.0
    uniform = (rng.random(VOCAB) * 8).astype(np.float32)
    return {"N(0,1)": normal, "N(0,1) x3": normal * 3, "uniform [0,8)": uniform, "peaked": peaked}


def measure(calls: int) -> dict:
    """{"row|kind": [us per call, us per copy]} in this process's build."""
    import numpy as np

    import logits_processing as lp

    def median_us(fn):
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e6

    out = {}
    for shape, source in rows().items():
        row = source.copy()
        copy = median_us(lambda row=row, source=source: np.copyto(row, source))
        for name, spec in SPECS.items():
            processor = lp.Processor(spec, prompt_len=0)

            def step(processor=processor, row=row, source=source):
                np.copyto(row, source)
                processor([], row)

            out[f"{shape}|{name}"] = [median_us(step) - copy, copy]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--cpu", default="auto", choices=["auto", "avx2", "portable"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.calls)))
        return
    builds = {"before": args.before, "after": args.after}
    runs: dict = {name: [] for name in builds}
    for _ in range(args.rounds):
        for name, path in builds.items():
            env = dict(os.environ, PYTHONPATH=os.path.abspath(path), LOGITS_PROCESSING_CPU=args.cpu)
            child = [sys.executable, __file__, path, path, "--child", "--calls", str(args.calls)]
            runs[name].append(json.loads(subprocess.check_output(child, env=env)))
    print(f"LOGITS_PROCESSING_CPU={args.cpu}; medians of {args.rounds} rounds, each of {args.calls} calls")
    print("| row | kind | before x copy | after x copy | after / before |")
    print("| --- | --- | ---: | ---: | ---: |")
    for key in runs["before"][0]:
        ratio = {name: statistics.median(r[key][0] / r[key][1] for r in runs[name]) for name in builds}
        shape, kind = key.split("|")
        print(f"| {shape} | {kind} | {ratio['before']:.1f} | {ratio['after']:.1f} | {ratio['after'] / ratio['before']:.2f} |")


if __name__ == "__main__":
    main()
