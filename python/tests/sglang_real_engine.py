"""One real SGLang engine (``sgl.Engine``, its default overlap scheduler) with our processor, run in
its own process by ``test_engine_sglang_real.py``: the tiny random-weight Llama over the real
DeepSeek tokenizer that ``vllm_real_engine.py`` saves, greedy decoding, one batch with every
pipeline beside rows without specs, the same requests joining at staggered times, bad specs; and
the same pipelines through transformers' ``generate()`` with our HF adapter on the same weights.
Prints one JSON object on the last line of stdout.

    python sglang_real_engine.py MODEL_DIR [stress | interpret] [ENV=VALUE ...]   # e.g. SGLANG_ENABLE_DELAY_SAMPLE=1

``stress``: SGLang's HTTP server (``python -m sglang.launch_server``, its ``/generate`` with
``custom_logit_processor``, as an HTTP client sends it) and the same batch with what only a real
scheduler does to requests: chunked prefill (16-token chunks, so the long prompts are prefilled
over several steps) and retraction (``SGLANG_TEST_RETRACT=1``, SGLang's own hook: running
requests are retracted every third step and come back re-prefilled from their ids); then raw bad
``custom_params`` over HTTP.

``interpret``: conformance.py's requests alone, their first ``conformance.DEVICE_PATH_TOKENS`` tokens, with
``LOGITS_PROCESSING_DEVICE=interpret`` and ``TRITON_INTERPRET=1`` in the scheduler: its host
tensors take the device path (packed plans, the Triton kernels under Triton's interpreter, the
round trip for the steps the kernels do not carry). The scheduler process appends a line to
``$LOGITS_PROCESSING_LAUNCH_LOG`` for each kernel launch (``launch_log.py``).

SGLang starts its scheduler in a subprocess, so everything runs under ``__main__``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import launch_log

VOCAB = 129280
MAX_NEW = 12
#: The file each call of our processor in the scheduler appends ``rows reads`` to (:func:`log_reads`).
READS_LOG = "LOGITS_PROCESSING_READS_LOG"


def log_reads() -> None:
    """In the scheduler process, where SGLang runs our processor: each call appends a line to the
    file ``$LOGITS_PROCESSING_READS_LOG`` names, its rows and the reads from the device it made
    (``SGLangLogitProcessor.device_reads`` before and after the call)."""
    path = os.environ.get(READS_LOG)
    if not path:
        return
    from logits_processing.adapters.sglang import SGLangLogitProcessor as processor

    call = processor.__call__
    if getattr(call, "logged", False):
        return

    def logged(self, logits, params=None):
        before = processor.device_reads
        try:
            return call(self, logits, params)
        finally:
            with open(path, "a") as log:
                log.write(f"{len(params or ())} {processor.device_reads - before}\n")

    logged.logged = True
    processor.__call__ = logged


# In every process that imports this file (the scheduler does, as SGLang spawns it).
launch_log.install()
log_reads()


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
    long = tok.encode("<｜User｜>" + "Tell me a long story about a small boat. " * 6 + "<｜Assistant｜>", add_special_tokens=False)
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
        # A prompt longer than the stress engine's prefill chunks.
        "long_budget": (
            long + [think],
            [{"kind": "logit_bias", "bias": {str(nl): 80.0}}, {"kind": "thinking_budget", "max_thinking_tokens": 3}],
            MAX_NEW,
        ),
        "long_penalties": (
            long,
            [{"kind": "repetition_penalty", "penalty": 1.3}, {"kind": "no_repeat_ngram", "n": 3}],
            40,
        ),
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


ENGINE_ARGS = dict(
    device="cpu",
    attention_backend="torch_native",
    disable_cuda_graph=True,
    max_total_tokens=4096,
    dtype="float32",
    enable_custom_logit_processor=True,
    random_seed=0,
)


def http_server(model: str, port: int):
    """SGLang's HTTP server in a subprocess (of this process's session, which the test ends),
    with 16-token prefill chunks; returns once it answers ``/health_generate``."""
    import subprocess
    import urllib.request

    args = [sys.executable, "-m", "sglang.launch_server", "--model-path", model, "--host", "127.0.0.1"]
    args += ["--port", str(port), "--chunked-prefill-size", "16", "--log-level", "warning"]
    for key, value in ENGINE_ARGS.items():
        flag = "--" + key.replace("_", "-")
        args += [flag] if value is True else [flag, str(value)]
    server = subprocess.Popen(args, stdout=sys.stderr, stderr=sys.stderr)
    deadline = time.time() + 1200
    while time.time() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health_generate", timeout=30) as r:
                if r.status == 200:
                    return server
        except OSError:
            time.sleep(2)
    raise RuntimeError("the server did not come up")


def post(port: int, body: dict):
    """``(status, decoded body)`` of a ``/generate`` call."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/generate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=600) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def main_http(model: str, tok, rows: dict, out: dict, t0: list) -> dict:
    import socket

    from logits_processing.adapters import EngineContext
    from logits_processing.adapters.sglang import SGLangLogitProcessor, activate

    context = EngineContext(tokenizer=tok, vocab_size=VOCAB)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = http_server(model, port)
    _phase("server start", t0)
    names = list(rows)
    params, processors = [], []
    for n in names:
        prompt, specs, max_new = rows[n]
        p = {"temperature": 0.0, "max_new_tokens": max_new}
        extra = activate(p, specs, context=context) if specs is not None else {}
        params.append(p)
        processors.append(extra.get("custom_logit_processor"))
    body = {
        "input_ids": [rows[n][0] for n in names],
        "sampling_params": params,
        "custom_logit_processor": processors,
    }
    status, results = post(port, body)
    assert status == 200, (status, results)
    out["rows"] = {n: list(r["output_ids"]) for n, r in zip(names, results)}
    out["text"] = {n: r["text"] for n, r in zip(names, results)}
    _phase("one batch with every pipeline over HTTP, chunked and retracted", t0)
    out["scheduler"] = {}
    for case, payload in BAD_PAYLOADS.items():
        status, reply = post(
            port,
            {
                "input_ids": rows["plain"][0],
                "sampling_params": {"temperature": 0.0, "max_new_tokens": 8, "custom_params": {"logits_processing": payload}},
                "custom_logit_processor": SGLangLogitProcessor.to_str(),
            },
        )
        out["scheduler"][case] = {"status": status, "reply": reply}
    _phase("bad specs over HTTP", t0)
    server.terminate()
    server.wait(timeout=60)
    return out


BAD_PAYLOADS = {
    "beyond_vocab": json.dumps([{"kind": "ban_tokens", "token_ids": [VOCAB + 5]}]),
    "not_json": "[{not json",
    "bad_field": json.dumps([{"kind": "forced_sequence", "token_ids": [5]}]),
}


def conformance_rows(llm, tok, model: str, context, max_new: int = 0) -> dict:
    """conformance.py's requests, all at once (SGLang batches them), each as docs/engines/sglang.md
    tells users to send it; a request that fails has its error as its result. With `max_new`,
    each request's first `max_new` tokens, not recorded for test_conformance.py."""
    import conformance

    from logits_processing.adapters.sglang import SGLangLogitProcessor, activate

    reqs = conformance.requests(tok)

    async def one(name, r):
        params = {"temperature": 0.0, "max_new_tokens": min(r.max_new, max_new or r.max_new)}
        try:
            processor = None
            if r.specs is not None and r.key == conformance.SPEC_KEY:
                processor = activate(params, r.specs, context=context)["custom_logit_processor"]
            elif r.specs is not None:  # Dynamo's entries, read as they are
                params["custom_params"] = {r.key: r.specs}
                processor = SGLangLogitProcessor.to_str()
            result = await llm.async_generate(
                input_ids=r.prompt, sampling_params=params, custom_logit_processor=processor
            )
            return name, {"tokens": list(result["output_ids"])}
        except Exception as e:  # noqa: BLE001 - the refusal is the result
            return name, {"error": conformance.short_error(e)}

    async def every():
        return dict(await asyncio.gather(*(one(n, r) for n, r in reqs.items())))

    rows = asyncio.get_event_loop().run_until_complete(every())
    if max_new:
        return rows
    route = (
        "`Engine.async_generate`, `activate()`'s `custom_params` and `custom_logit_processor` "
        "(Dynamo's key: `custom_params` set directly), every request at once; default overlap scheduler"
    )
    versions = conformance.versions("sglang", "torch")
    return conformance.record("sglang", model, reqs, rows, versions=versions, route=route)["rows"]


def waits(llm, tok, context, max_new: int) -> dict:
    """Each call of the processor in the scheduler, ``[rows, reads from the device]``, for two
    rows sent together, every row running ``max_new`` steps: both history-free, then a history
    reader beside a history-free row."""
    from logits_processing.adapters.sglang import activate

    prompts = [tok.encode(text, add_special_tokens=False) for text in ("<｜User｜>Hi", "<｜User｜>Count to ten")]
    free = [{"kind": "temperature", "temperature": 0.5}, {"kind": "ban_tokens", "token_ids": [4242]}]
    batches = {
        "history_free": [free, [{"kind": "logit_bias", "bias": {"77": 2.0}}]],
        "reads_history": [[{"kind": "repetition_penalty", "penalty": 1.5}] + free, free],
    }
    out = {}
    for name, specs in batches.items():
        params = [{"temperature": 0.0, "max_new_tokens": max_new, "ignore_eos": True} for _ in specs]
        processors = [activate(p, s, context=context)["custom_logit_processor"] for p, s in zip(params, specs)]
        open(os.environ[READS_LOG], "w").close()
        llm.generate(input_ids=prompts, sampling_params=params, custom_logit_processor=processors)
        with open(os.environ[READS_LOG]) as log:
            out[name] = [[int(n) for n in line.split()] for line in log]
    return out


def main_interpret(model: str) -> dict:
    import conformance
    import sglang as sgl
    from transformers import AutoTokenizer

    from logits_processing.adapters import EngineContext

    tok = AutoTokenizer.from_pretrained(model)
    context = EngineContext(tokenizer=tok, vocab_size=VOCAB)
    t0 = [time.perf_counter()]
    llm = sgl.Engine(model_path=model, log_level="error", **ENGINE_ARGS)
    _phase("engine start", t0)
    out = {
        "env": {k: os.environ.get(k) for k in ("SGLANG_ENABLE_DELAY_SAMPLE", "LOGITS_PROCESSING_DEVICE")},
        "conformance": conformance_rows(llm, tok, model, context, max_new=conformance.DEVICE_PATH_TOKENS),
    }
    _phase("conformance requests through the device path", t0)
    out["waits"] = waits(llm, tok, context, conformance.DEVICE_PATH_TOKENS)
    _phase("waits through the device path", t0)
    llm.shutdown()
    out["launches"] = launch_log.count()
    return out


def main(model: str, stress: bool) -> dict:
    import sglang as sgl
    from transformers import AutoTokenizer

    from logits_processing.adapters import EngineContext
    from logits_processing.adapters.sglang import SGLangLogitProcessor, activate

    tok = AutoTokenizer.from_pretrained(model)
    context = EngineContext(tokenizer=tok, vocab_size=VOCAB)
    rows = pipelines(tok)
    names = list(rows)
    out: dict = {
        "env": {k: os.environ.get(k) for k in ("SGLANG_ENABLE_DELAY_SAMPLE", "SGLANG_TEST_RETRACT")},
        "stress": stress,
        "prompt_lens": {n: len(p) for n, (p, _, _) in rows.items()},
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
    if stress:
        return main_http(model, tok, rows, out, t0)

    llm = sgl.Engine(model_path=model, log_level="error", **ENGINE_ARGS)
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
    out["plain_alone"] = {n: tokens(batch([n])[n]) for n in names if rows[n][1] is None}
    _phase("plain rows alone", t0)
    results = batch(names)
    out["rows"] = {n: tokens(r) for n, r in results.items()}
    out["text"] = {n: r["text"] for n, r in results.items()}
    out["finish"] = {n: r["meta_info"]["finish_reason"] for n, r in results.items()}
    _phase("one batch with every pipeline", t0)
    out["conformance"] = conformance_rows(llm, tok, model, context)
    _phase("conformance requests", t0)
    out["waits"] = waits(llm, tok, context, MAX_NEW)
    _phase("waits", t0)

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

    # A request aborted while it runs beside others.
    async def aborted():
        prompt, params, processor = request("penalties")
        params = {**params, "max_new_tokens": 400, "ignore_eos": True}
        doomed = asyncio.ensure_future(
            llm.async_generate(
                input_ids=prompt, sampling_params=params, custom_logit_processor=processor, rid="doomed"
            )
        )
        await asyncio.sleep(0.3)
        prompt, params, processor = request("forced")
        beside = asyncio.ensure_future(
            llm.async_generate(input_ids=prompt, sampling_params=params, custom_logit_processor=processor)
        )
        await asyncio.sleep(0.2)
        llm.tokenizer_manager.abort_request("doomed")
        beside = await beside
        try:
            r = await doomed
            return {"finish": r["meta_info"]["finish_reason"], "tokens": len(r["output_ids"])}, tokens(beside)
        except Exception as e:  # noqa: BLE001 - how SGLang reports it is the result
            return {"raised": f"{type(e).__name__}: {e}"}, tokens(beside)

    out["aborted"], out["beside_abort"] = asyncio.get_event_loop().run_until_complete(aborted())
    _phase("abort", t0)

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
    for case, payload in BAD_PAYLOADS.items():
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
    stress = "stress" in sys.argv[2:]
    if stress:
        os.environ["SGLANG_TEST_RETRACT"] = "1"
    for assignment in sys.argv[2:]:
        if "=" in assignment:
            key, _, value = assignment.partition("=")
            os.environ[key] = value
    launch_log.install()  # with the log named above (a forked scheduler inherits it)
    import shutil
    import tempfile

    reads_dir = tempfile.mkdtemp(prefix="sglang-reads-")
    os.environ[READS_LOG] = os.path.join(reads_dir, "reads")  # the scheduler, spawned later, inherits it
    try:
        result = main_interpret(sys.argv[1]) if "interpret" in sys.argv[2:] else main(sys.argv[1], stress)
    finally:
        shutil.rmtree(reads_dir, ignore_errors=True)
    print("\n" + json.dumps(result))
