"""ban_strings with 100 strings: a decode step against the same step without it, beside a row memcpy.

    python python/benchmarks/bench_ban_strings.py [--steps 200] [--rounds 5]

One Batch row of the Qwen3 tokenizer's width (151,936 logits, float32), pipeline
``temperature`` alone and ``temperature`` + ``ban_strings`` (100 strings), fed the ids of a real
text one token a step (so the automaton moves through its states as generation would). The first
step of each state pays one pass over the vocab (its bans, cached); the medians are over the
steps of the rounds after the first (the same row, its ids read again from the start: a
rewind), when the states the text reaches are cached. Prints medians.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from qwen_tokenizer import QWEN_LOGITS, qwen_tokenizer_json  # noqa: E402

from logits_processing import Batch, EngineContext  # noqa: E402

WORDS = [
    "delve", "tapestry", "testament", "realm", "vibrant", "intricate", "journey", "landscape",
    "crucial", "pivotal",
]  # fmt: skip
STRINGS = [f"{a} {b}" for a in WORDS for b in WORDS]  # 100 two-word strings

TEXT = (
    "The weather in Paris today is mild, with a light breeze from the west and a few clouds over "
    "the river. Tourists walk along the banks while the cafes fill up for lunch; later the sky "
    "should clear and the evening will be warm enough to sit outside until the sun goes down. "
)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    import tokenizers

    path = qwen_tokenizer_json()
    tok = tokenizers.Tokenizer.from_file(str(path))
    context = EngineContext(str(path), vocab_size=QWEN_LOGITS)
    ids = tok.encode(TEXT * 8, add_special_tokens=False).ids[: args.steps]
    prompt = ids[:1]
    row = torch.randn(QWEN_LOGITS) * 4
    work = torch.empty(1, QWEN_LOGITS)
    pipelines = {
        "temperature": [{"kind": "temperature", "temperature": 0.7}],
        "temperature + ban_strings (100)": [
            {"kind": "temperature", "temperature": 0.7},
            {"kind": "ban_strings", "strings": STRINGS},
        ],
    }
    times: dict[str, list[float]] = {name: [] for name in pipelines}
    copies: list[float] = []
    first: dict[str, float] = {}
    batches = {}
    for name, specs in pipelines.items():
        batches[name] = Batch(context=context)
        batches[name].add(0, specs, prompt_len=len(prompt))
    for r in range(args.rounds):
        for name, batch in batches.items():
            for k in range(1, len(ids)):
                work.copy_(row)
                started = time.perf_counter()
                batch.apply(work, [ids[:k]])
                took = time.perf_counter() - started
                if r == 0 and k == 1:
                    first[name] = took
                if r > 0:
                    times[name].append(took)
                started = time.perf_counter()
                work.copy_(row)
                copies.append(time.perf_counter() - started)
    memcpy = statistics.median(copies)
    print(f"V = {QWEN_LOGITS}, {len(ids) - 1} steps x {args.rounds - 1} rounds (medians, one row):")
    print(f"  row memcpy                          {memcpy * 1e6:9.1f} us")
    base = statistics.median(times["temperature"])
    for name, t in times.items():
        med = statistics.median(t)
        print(
            f"  {name:<34} {med * 1e6:9.1f} us  ({med / memcpy:5.1f}x memcpy, {med / base:4.2f}x temperature"
            f" alone); first step {first[name] * 1e3:.1f} ms"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
