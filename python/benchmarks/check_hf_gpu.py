"""transformers' `generate()` on a GPU through the HF adapter: what `scripts/gpu-check.sh` runs.

    python python/benchmarks/check_hf_gpu.py [--device cuda]

A tiny random-weight Llama (built from a config, no download) over Qwen3's vocab generates greedily
on the device (its `input_ids` and logits there) through an `HFLogitsProcessor`; at each step a
twin processor with the same specs edits a copy of the same ids and logits on the host, and the
device's scores must equal the host's bit for bit (specs that read no history, specs that read it,
kinds whose next step reads their pass, and one the host round trip carries). The adapter must copy
ids to the host only for specs that read the history, at most once a step. Exits 0 with a line
saying so, 1 on a difference, and 2 (skipped) where transformers or a GPU is missing.
"""

from __future__ import annotations

import argparse
import sys

PIPELINES = {
    "history-free": [{"kind": "temperature", "temperature": 0.7}, {"kind": "top_k", "k": 40},
                     {"kind": "logit_bias", "bias": {"11": 5.0}}],
    "reads history": [{"kind": "repetition_penalty", "penalty": 1.3}, {"kind": "no_repeat_ngram", "n": 2}],
    "reads its pass": [{"kind": "mirostat", "version": 2, "tau": 3.0},
                       {"kind": "trigger_phrase", "phrase": [629, 1077], "trigger_token_phrase": 7}],
    "host round trip": [{"kind": "tail_free", "z": 0.9}],
}
VOCAB = 151_936
NEW_TOKENS = 6


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    try:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as error:
        print(f"check_hf_gpu: skipped ({error})")
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("check_hf_gpu: skipped (no CUDA device)")
        return 2
    from transformers import LogitsProcessor

    from logits_processing.adapters.hf import HFLogitsProcessor

    class Twin(LogitsProcessor):
        """The processor on the device, and its twin on a host copy of the same step."""

        def __init__(self, specs):
            self.device, self.host, self.differing = HFLogitsProcessor(specs), HFLogitsProcessor(specs), 0

        def __call__(self, input_ids, scores):
            want = self.host(input_ids.cpu(), scores.cpu())
            got = self.device(input_ids, scores)
            self.differing += not torch.equal(got.cpu().view(torch.int32), want.view(torch.int32))
            return got

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         initializer_range=0.5, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(config).eval().to(args.device)
    prompts = torch.tensor([[1, 500, 900, 7, 31], [1, 7, 7, 80, 4000]], device=args.device)
    failed = False
    for name, specs in PIPELINES.items():
        twin = Twin(specs)
        with torch.no_grad():
            model.generate(prompts, attention_mask=torch.ones_like(prompts), logits_processor=[twin],
                           do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)
        reads = twin.device.device_reads
        reads_ok = reads == 0 if name == "history-free" else reads <= NEW_TOKENS
        failed |= bool(twin.differing) or not reads_ok
        print(f"{name}: {twin.differing} of {NEW_TOKENS} steps differ from the host's; "
              f"{reads} reads of ids from the device in {NEW_TOKENS} steps")
    print(f"check_hf_gpu: {'FAILED' if failed else 'every pipeline equal'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
