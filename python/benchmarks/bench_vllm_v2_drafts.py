"""What a Model Runner V2 step costs per draft row: ``VLLMV2LogitsProcessor.apply`` on CPU logits
laid out as V2 lays them out under speculative decoding (one row per draft position, the drafts
in ``ctx.input_ids``, the committed ids in ``req_states.all_token_ids``), with vLLM's own types.

Each step, every request gets ``k`` drafts; after the step the committed ids advance either by
all of them and a bonus token (``accepted``: the next step's ids extend the last draft row's) or
by one token in place of the first draft (``rejected``: every processor rolls back). Reports the
median ``apply`` time per step and, against the same batch with no drafts, per draft row.

    python python/benchmarks/bench_vllm_v2_drafts.py            # in the vLLM venv
    python python/benchmarks/bench_vllm_v2_drafts.py --requests 8 --steps 20 --prompt 200
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from types import SimpleNamespace

import numpy as np
import torch
import vllm.v1.worker.cpu.shm  # noqa: F401 - CPU stand-ins for pinned memory and UVA
from vllm import SamplingParams
from vllm.v1.worker.gpu.sample.logits_processor import LogitsContext, LogitsProcRequestState
from vllm.v1.worker.gpu.states import RequestState

from logits_processing.adapters import vllm as adapter

SPECS = {
    "penalties": [
        {"kind": "repetition_penalty", "penalty": 1.2},
        {"kind": "no_repeat_ngram", "n": 3},
        {"kind": "temperature", "temperature": 0.7},
        {"kind": "top_k", "k": 50},
    ],
    "history-free": [{"kind": "temperature", "temperature": 0.7}, {"kind": "top_p", "p": 0.9}],
    # Their next step reads what the last pass saw: each draft row's pass is kept.
    "mirostat": [{"kind": "temperature", "temperature": 0.7}, {"kind": "mirostat", "tau": 5.0}],
    "adaptive-p": [{"kind": "adaptive_p", "target": 0.3}],
}


def run(specs, *, k, mode, requests, steps, prompt, vocab, seed=0):
    rng = random.Random(seed)
    state = RequestState(
        max_num_reqs=requests,
        max_model_len=prompt + 4 * steps * (k + 1) + 16,
        max_num_batched_tokens=4096,
        num_speculative_steps=max(k, 1),
        vocab_size=vocab,
        device=torch.device("cpu"),
    )
    model_config = SimpleNamespace(get_vocab_size=lambda: vocab, tokenizer=None, model="toy", logits_processors=None)
    config = SimpleNamespace(
        model_config=model_config,
        kv_transfer_config=None,
        speculative_config=SimpleNamespace(method="ngram", num_speculative_tokens=max(k, 1)),
        use_v2_model_runner=True,
    )
    proc = adapter.VLLMV2LogitsProcessor(config, LogitsProcRequestState.from_request_state(state))
    slots = []
    for r in range(requests):
        ids = [rng.randrange(1, vocab) for _ in range(prompt)]
        state.add_request(f"r{r}", prompt, ids, 0, 1 << 20)
        slot = state.req_id_to_index[f"r{r}"]
        for staged in (state.all_token_ids, state.total_len, state.num_computed_tokens):
            staged.clear_staged_writes()
        state.all_token_ids.gpu[slot, :prompt] = torch.tensor(ids, dtype=torch.int32)
        state.total_len.gpu[slot] = prompt
        assert proc.add_request(slot, SamplingParams(extra_args={adapter.SPEC_KEY: specs}))
        slots.append(slot)
    slots_np = np.array(slots, dtype=np.int32)
    times = []
    for step in range(steps + 3):
        totals = [int(state.total_len.gpu[s]) for s in slots]
        drafts = [[rng.randrange(1, vocab) for _ in range(k)] for _ in slots]
        fed = [state.all_token_ids.gpu[s, t - 1].item() for s, t in zip(slots, totals)]
        rows = requests * (k + 1)
        ctx = LogitsContext(
            expanded_idx_mapping=torch.from_numpy(np.repeat(slots_np, k + 1)),
            idx_mapping=torch.from_numpy(slots_np),
            idx_mapping_np=slots_np,
            expanded_local_pos=torch.arange(k + 1, dtype=torch.int32).repeat(requests),
            input_ids=torch.tensor([t for f, d in zip(fed, drafts) for t in [f] + d], dtype=torch.int32),
            pos=torch.tensor([t - 1 + j for t in totals for j in range(k + 1)], dtype=torch.int64),
            seq_lens_upper_bound_np=np.array([t + k for t in totals], dtype=np.int32),
        )
        logits = torch.randn(rows, vocab)
        start = time.perf_counter()
        proc.apply(logits, ctx)
        if step >= 3:
            times.append(time.perf_counter() - start)
        for s, t, d in zip(slots, totals, drafts):
            new = d + [rng.randrange(1, vocab)] if mode == "accepted" or not k else [d[0] % (vocab - 1) + 1]
            state.all_token_ids.gpu[s, t : t + len(new)] = torch.tensor(new, dtype=torch.int32)
            state.total_len.gpu[s] = t + len(new)
    return statistics.median(times), proc.device_reads


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--prompt", type=int, default=1000)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--drafts", type=int, nargs="+", default=[1, 3])
    args = parser.parse_args()
    kw = dict(requests=args.requests, steps=args.steps, prompt=args.prompt, vocab=args.vocab)
    print(f"{args.requests} requests, {args.prompt}-id prompts, vocab {args.vocab}, median of {args.steps} steps")
    for name, specs in SPECS.items():
        base, _ = run(specs, k=0, mode="accepted", **kw)
        print(f"{name}: no drafts {base * 1e3:.2f} ms/step")
        for k in args.drafts:
            for mode in ("accepted", "rejected"):
                t, reads = run(specs, k=k, mode=mode, **kw)
                per_row = (t - base) / (args.requests * k)
                print(
                    f"{name}: {k} drafts, {mode}: {t * 1e3:.2f} ms/step, "
                    f"{per_row * 1e6:.1f} us per draft row, {reads} device reads in {args.steps + 3} steps"
                )


if __name__ == "__main__":
    main()
