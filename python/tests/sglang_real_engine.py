"""One real SGLang engine (``sgl.Engine``, its default overlap scheduler) with our processor, run in
its own process by ``test_engine_sglang_real.py``: the tiny random-weight Llama over the real
DeepSeek tokenizer that ``vllm_real_engine.py`` saves, greedy decoding, one batch with every
pipeline beside rows without specs, the same requests joining at staggered times, bad specs; and
the same pipelines through transformers' ``generate()`` with our HF adapter on the same weights.
Prints one JSON object on the last line of stdout.

    python sglang_real_engine.py MODEL_DIR [ENV=VALUE ...]   # e.g. SGLANG_ENABLE_DELAY_SAMPLE=1

SGLang starts its scheduler in a subprocess, so everything runs under ``__main__``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

VOCAB = 129280
MAX_NEW = 12


def _phase(name: str, t0: list) -> None:
    now = time.perf_counter()
    print(f"[sglang_real_engine] {name}: {now - t0[0]:.1f} s", file=sys.stderr, flush=True)
    t0[0] = now


def pipelines(tok) -> dict:
    """name -> (prompt ids, specs or None, max new tokens)."""
    eos = tok.eos_token_id
    think, think_end = (tok.convert_tokens_to_ids(t) for t in ("<think>", "</think>"))
    nl = tok.encode("\n", add_special_tokens=False)[0]
    user = tok.encode("<｜User｜>Say something<｜Assistant｜>", add_special_tokens=False)
    other = tok.encode("<｜User｜>Count to ten, slowly<｜Assistant｜>", add_special_tokens=False)
    thinking = user + [think]
    forced = tok.encode(" one two three", add_special_tokens=False)
    schema = {
        "type": "object",
        "properties": {"b": {"type": "boolean"}, "c": {"enum": ["x", "y"]}},
        "required": ["b", "c"],
        "additionalProperties": False,
        "x-guidance": {"whitespace_flexible": False},
    }
    return {
        "forced": (user, [{"kind": "forced_sequence", "token_ids": forced, "eos_token_id": eos}], MAX_NEW),
        # After another spec, and counted by tokens.
        "forced_tokens": (
            other,
            [
                {"kind": "temperature", "temperature": 0.7},
                {"kind": "forced_sequence", "token_ids": forced[:2], "eos_token_id": eos, "position": "tokens"},
            ],
            MAX_NEW,
        ),
        "hello": (user, [{"kind": "hello_world"}], MAX_NEW),
        "temperature": (user, [{"kind": "temperature", "temperature": 0.5}], MAX_NEW),
        "bias_ban": (
            other,
            [{"kind": "logit_bias", "bias": {"4242": 9.0, "77": 8.0}}, {"kind": "ban_tokens", "token_ids": [4242]}],
            MAX_NEW,
        ),
        "penalties": (
            other,
            # Three ids favoured: the penalties must take each in turn, read from the history.
            [
                {"kind": "logit_bias", "bias": {"77": 20.0, "78": 19.5, "79": 19.0}},
                {"kind": "repetition_penalty", "penalty": 1.5},
                {"kind": "no_repeat_ngram", "n": 2},
            ],
            24,
        ),
        # EOS favoured: it may only come after exactly 5 new tokens.
        "min_new": (
            user,
            [
                {"kind": "logit_bias", "bias": {str(eos): 40.0}},
                {"kind": "min_new_tokens", "min_new_tokens": 5, "eos_token_ids": [eos]},
            ],
            MAX_NEW,
        ),
        # Hard limit: 4 + floor(4 * 0.5) = 6 thinking tokens, then </think>.
        "budget_hard": (
            thinking,
            [
                {"kind": "ban_tokens", "token_ids": [nl, think_end]},
                {"kind": "thinking_budget", "max_thinking_tokens": 4, "overflow_percentage": 0.5},
            ],
            MAX_NEW,
        ),
        # Graceful exit: every token a newline, so the budget closes at exactly 3.
        "budget_newline": (
            thinking,
            [{"kind": "logit_bias", "bias": {str(nl): 80.0}}, {"kind": "thinking_budget", "max_thinking_tokens": 3}],
            MAX_NEW,
        ),
        "grammar": (user, [{"kind": "grammar", "json_schema": schema}], 40),
        "plain": (user, None, MAX_NEW),
        "plain_other": (other, None, 24),
        "plain_think": (thinking, None, MAX_NEW),
    }


def hf_outputs(model: str, tok, rows: dict) -> dict:
    """The same pipelines through transformers' generate() and our HF adapter, one request at a
    time, on the same weights."""
    import torch
    from transformers import LlamaForCausalLM

    from logits_processing.adapters.hf import HFLogitsProcessor

    torch.manual_seed(0)
    hf = LlamaForCausalLM.from_pretrained(model, torch_dtype=torch.float32).eval()
    out = {}
    for name, (prompt, specs, max_new) in rows.items():
        ids = torch.tensor([prompt])
        processors = [HFLogitsProcessor(specs, tokenizer=tok)] if specs is not None else []
        with torch.no_grad():
            gen = hf.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                logits_processor=processors,
                do_sample=False,
                max_new_tokens=max_new,
                eos_token_id=tok.eos_token_id,
                pad_token_id=tok.eos_token_id,
            )
        out[name] = gen[0, len(prompt) :].tolist()
    return out


def main(model: str) -> dict:
    import sglang as sgl
    from transformers import AutoTokenizer

    from logits_processing.adapters import EngineContext
    from logits_processing.adapters.sglang import SGLangLogitProcessor, activate

    tok = AutoTokenizer.from_pretrained(model)
    context = EngineContext.resolve(tokenizer=tok, vocab_size=VOCAB)
    rows = pipelines(tok)
    names = list(rows)
    out: dict = {
        "env": {k: os.environ.get(k) for k in ("SGLANG_ENABLE_DELAY_SAMPLE",)},
        "ids": {
            "eos": tok.eos_token_id,
            "think_end": tok.convert_tokens_to_ids("</think>"),
            "nl": tok.encode("\n", add_special_tokens=False)[0],
            "forced": tok.encode(" one two three", add_special_tokens=False),
            "hello": tok.encode("Hello world!", add_special_tokens=False),
        },
    }

    t0 = [time.perf_counter()]
    out["hf"] = hf_outputs(model, tok, rows)
    _phase("transformers generate()", t0)

    llm = sgl.Engine(
        model_path=model,
        device="cpu",
        attention_backend="torch_native",
        disable_cuda_graph=True,
        max_total_tokens=4096,
        dtype="float32",
        enable_custom_logit_processor=True,
        random_seed=0,
        log_level="error",
    )
    _phase("engine start", t0)

    def request(name):
        prompt, specs, max_new = rows[name]
        params = {"temperature": 0.0, "max_new_tokens": max_new}
        extra = activate(params, specs, context=context) if specs is not None else {}
        return prompt, params, extra.get("custom_logit_processor")

    def batch(batch_names):
        reqs = [request(n) for n in batch_names]
        results = llm.generate(
            input_ids=[r[0] for r in reqs],
            sampling_params=[r[1] for r in reqs],
            custom_logit_processor=[r[2] for r in reqs],
        )
        return {n: r for n, r in zip(batch_names, results)}

    def tokens(result):
        return list(result["output_ids"])

    # Warm-up, and each plain row alone.
    alone = {n: tokens(batch([n])[n]) for n in names if rows[n][1] is None}
    _phase("plain rows alone", t0)

    results = batch(names)
    _phase("one batch with every pipeline", t0)
    out["rows"] = {n: tokens(r) for n, r in results.items()}
    out["text"] = {n: r["text"] for n, r in results.items()}
    out["finish"] = {n: r["meta_info"]["finish_reason"] for n, r in results.items()}
    out["plain_alone"] = alone

    # The same requests again, joining one by one while the others run (async, staggered).
    async def staggered():
        async def one(i, name):
            await asyncio.sleep(0.05 * i)
            prompt, params, processor = request(name)
            r = await llm.async_generate(input_ids=prompt, sampling_params=params, custom_logit_processor=processor)
            return name, tokens(r)

        return dict(await asyncio.gather(*(one(i, n) for i, n in enumerate(reversed(names)))))

    out["staggered"] = asyncio.get_event_loop().run_until_complete(staggered())
    _phase("staggered joins", t0)

    # Bad specs. In the client: activate() checks the structure.
    out["client"] = {}
    for case, specs in {
        "bad_field": [{"kind": "ban_tokens", "token_ids": "x"}],
        "unknown_kind": [{"kind": "no_such_kind"}],
    }.items():
        try:
            activate({}, specs, context=context)
            out["client"][case] = None
        except Exception as e:  # noqa: BLE001 - the message is the result
            out["client"][case] = f"{type(e).__name__}: {e}"
    # Raw custom_params, as an HTTP client may send them: refused in the scheduler.
    out["scheduler"] = {}
    for case, payload in {
        "beyond_vocab": json.dumps([{"kind": "ban_tokens", "token_ids": [VOCAB + 5]}]),
        "not_json": "[{not json",
        "bad_field": json.dumps([{"kind": "forced_sequence", "token_ids": [5]}]),
    }.items():
        prompt = rows["plain"][0]
        params = {"temperature": 0.0, "max_new_tokens": 8, "custom_params": {"logits_processing": payload}}
        try:
            r = llm.generate(
                input_ids=prompt, sampling_params=params, custom_logit_processor=SGLangLogitProcessor.to_str()
            )
            out["scheduler"][case] = {"finish": r["meta_info"]["finish_reason"], "output": tokens(r)}
        except Exception as e:  # noqa: BLE001 - the message is the result
            out["scheduler"][case] = {"raised": f"{type(e).__name__}: {e}"}
    out["after_errors"] = tokens(batch(["forced"])["forced"])
    _phase("bad specs", t0)
    llm.shutdown()
    return out


if __name__ == "__main__":
    for assignment in sys.argv[2:]:
        key, _, value = assignment.partition("=")
        os.environ[key] = value
    result = main(sys.argv[1])
    print("\n" + json.dumps(result))
