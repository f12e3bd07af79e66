"""TensorRT-LLM adapters against a fake engine loop. TensorRT-LLM cannot be installed here (no CPU
wheel), so the loop below states the interface the adapters are written to, as its docs and
examples give it:

- per request: ``processor(req_id: int, logits: Tensor[1, beam, vocab] (C++ runtime) or
  [beam, 1, vocab] (PyTorch backend, whose stream and client ids are None), token_ids:
  list[list[int]] (per beam, prompt + generated), stream_ptr: int | None, client_id: int | None)
  -> None``, editing ``logits`` in place;
- batched: ``processor(req_ids: list[int], logits: list[Tensor], token_ids: list[list[list[int]]],
  stream_ptr: int | None, client_ids: list[int | None]) -> None``, once per step for every request
  that set ``apply_batched_logits_processor``.
"""

import logging

import pytest

torch = pytest.importorskip("torch")

import functools  # noqa: E402

import device_reads  # noqa: E402

import logits_processing as lp  # noqa: E402
from logits_processing.adapters import trtllm  # noqa: E402
from logits_processing.adapters.trtllm import _as_block  # noqa: E402

# The fake loop below hands current ids (the scheduler without overlap, or the C++ runtime).
TRTLLMLogitsProcessor = functools.partial(trtllm.TRTLLMLogitsProcessor, disable_overlap_scheduler=True)
TRTLLMBatchedLogitsProcessor = functools.partial(
    trtllm.TRTLLMBatchedLogitsProcessor, disable_overlap_scheduler=True
)

V = 48
EOS = 0
THINK, THINK_END, NL = 44, 45, 46


class FakeEngine:
    """Requests with beams; each step one ``[batch, beam, vocab]`` logits buffer (as the C++
    runtime lays it out), each request's slice handed to its processor, greedy picks per beam."""

    def __init__(self, beams=1, layout="cpp", device="cpu", on_device=False):
        self.beams, self.layout, self.device = beams, layout, device
        self.on_device = on_device  # the logits as device_reads.OnDevice: the adapter's reads listed
        self.requests = []  # dicts: id, client_id, prompt, out (per beam), processor, done
        self.next_id = 100

    def add(self, prompt, processor=None, client_id=None, output=()):
        req = dict(
            id=self.next_id,
            client_id=client_id,
            prompt=list(prompt),
            out=[list(output) for _ in range(self.beams)],
            processor=processor,
            done=False,
        )
        self.next_id += 1
        self.requests.append(req)
        return req

    def active(self):
        return [r for r in self.requests if not r["done"]]

    def stream_ptr(self):
        return torch.cuda.current_stream().cuda_stream if self.device == "cuda" else None

    def step(self, logits, batched=None, max_new=8):
        active = self.active()
        logits = logits.to(self.device)
        if self.on_device:
            logits = device_reads.on_device(logits)
        # C++ runtime: [1, beam, vocab]; PyTorch backend: [beam, 1, vocab] (and None client ids);
        # "2d": [beam, vocab], which some versions' docs describe.
        slices = [
            {"pytorch": lambda t: t.unsqueeze(1), "2d": lambda t: t}.get(self.layout, lambda t: t[None])(
                logits[i]
            )
            for i in range(len(active))
        ]
        ids = [[r["prompt"] + r["out"][b] for b in range(self.beams)] for r in active]
        if batched is not None:
            batched(
                [r["id"] for r in active], slices, ids, self.stream_ptr(), [r["client_id"] for r in active]
            )
        else:
            for r, s, i in zip(active, slices, ids):
                if r["processor"] is not None:
                    r["processor"](r["id"], s, i, self.stream_ptr(), r["client_id"])
        picks = logits.argmax(-1).tolist()  # [batch, beam]
        for r, p in zip(active, picks):
            for b in range(self.beams):
                r["out"][b].append(p[b])
            if all(EOS in o for o in r["out"]) or len(r["out"][0]) >= max_new:
                r["done"] = True
        return logits


def oracle(specs, prompt_len):
    batch = lp.Batch(V)
    batch.add(0, specs, prompt_len=prompt_len)
    return batch


@pytest.mark.parametrize("layout", ["cpp", "pytorch", "2d"])
@pytest.mark.parametrize("beams", [1, 3])
def test_per_request_processors_match_each_pipeline_alone(layout, beams):
    torch.manual_seed(1)
    engine = FakeEngine(beams=beams, layout=layout)
    kinds = [
        [{"kind": "forced_sequence", "token_ids": [5, 6, 7], "eos_token_id": EOS}],
        [{"kind": "temperature", "temperature": 0.5}, {"kind": "ban_tokens", "token_ids": [EOS]}],
        [
            {
                "kind": "thinking_budget",
                "max_thinking_tokens": 2,
                "overflow_percentage": 0.5,
                "start_token_id": THINK,
                "end_token_id": THINK_END,
                "newline_token_id": NL,
            }
        ],
        None,
    ]
    oracles = {}
    for i, specs in enumerate(kinds):
        prompt = [1, 2, THINK][: 2 + i % 2]
        proc = TRTLLMLogitsProcessor(specs, prompt_len=len(prompt), vocab_size=V) if specs else None
        r = engine.add(prompt, proc)
        if specs:
            oracles[r["id"]] = [oracle(specs, len(prompt)) for _ in range(beams)]
    while engine.active():
        active = engine.active()
        shape = (len(active), beams, V)
        logits = torch.randn(shape)
        expected = logits.clone()
        for i, r in enumerate(active):
            for b in range(beams):
                if r["id"] in oracles:
                    oracles[r["id"]][b].apply(expected[i, b : b + 1], [r["prompt"] + r["out"][b]])
        out = engine.step(logits)
        assert torch.equal(out, expected)
    assert engine.requests[0]["out"][0] == [5, 6, 7, EOS]


def test_errors_are_logged_with_the_request_id_and_the_row_left_alone(caplog):
    def broken(ids, row):
        row.fill_(123.0)  # half done ...
        raise RuntimeError("boom")  # ... then fails

    engine = FakeEngine()
    bad = engine.add([1], TRTLLMLogitsProcessor([{"kind": "temperature", "temperature": 0.5}, broken]))
    good = engine.add(
        [1], TRTLLMLogitsProcessor([{"kind": "forced_sequence", "token_ids": [9], "eos_token_id": EOS}])
    )
    logits = torch.randn(2, 1, V)
    before = logits.clone()
    with caplog.at_level(logging.ERROR):
        out = engine.step(logits)
    assert f"request {bad['id']}" in caplog.text and "boom" in caplog.text
    assert torch.equal(out[0], before[0])
    assert good["out"][0] == [9]


def test_batched_processor_one_call_for_all_requests():
    torch.manual_seed(2)
    specs_of = {
        7: [{"kind": "forced_sequence", "token_ids": [3, 4], "eos_token_id": EOS}],
        8: [{"kind": "logit_bias", "bias": {"11": 40.0}}],
    }
    batched = TRTLLMBatchedLogitsProcessor(vocab_size=V)
    engine = FakeEngine(beams=2)
    reqs = []
    for client in (7, 9, 8):
        r = engine.add([1, 2, 3], client_id=client)
        if client in specs_of:
            batched.register(client, specs_of[client], prompt_len=3)
        reqs.append(r)
    while engine.active():
        engine.step(torch.randn(len(engine.active()), 2, V), batched=batched)
        assert len(batched.keyed) <= 2 * len(engine.active()) + 4
    assert reqs[0]["out"] == [[3, 4, EOS]] * 2
    assert all(t == 11 for t in reqs[2]["out"][0])
    assert reqs[1]["out"][0][:2] != [3, 4]


def test_bitmask_specs_are_refused_when_given():
    """TensorRT-LLM hands its processors no mask: refused naming the field when the processor
    is built or the request registered, not at every step after."""
    with pytest.raises(lp.SpecError, match=r"\[0\]\.kind.*'bitmask'"):
        TRTLLMLogitsProcessor([{"kind": "bitmask"}], prompt_len=3)
    batched = TRTLLMBatchedLogitsProcessor(vocab_size=V)
    with pytest.raises(lp.SpecError, match=r"\[1\]\.kind.*'bitmask'.*TensorRT-LLM gives none"):
        batched.register(7, [{"kind": "temperature", "temperature": 0.5}, {"kind": "bitmask"}])


def test_batched_pytorch_backend_finds_specs_by_request_id(caplog):
    """The PyTorch backend: rows [beam, 1, vocab], client ids None. Specs registered by request
    id are found; specs registered by a client id are not, and a warning says so once."""
    torch.manual_seed(4)
    batched = TRTLLMBatchedLogitsProcessor(vocab_size=V)
    engine = FakeEngine(beams=2, layout="pytorch")
    forced = engine.add([1, 2, 3])
    other = engine.add([1, 2, 3])
    batched.register(
        forced["id"], [{"kind": "forced_sequence", "token_ids": [3, 4], "eos_token_id": EOS}], prompt_len=3
    )
    batched.register("client-7", [{"kind": "ban_tokens", "token_ids": list(range(V - 1))}])
    with caplog.at_level(logging.WARNING):
        while engine.active():
            engine.step(torch.randn(len(engine.active()), 2, V), batched=batched)
    assert forced["out"] == [[3, 4, EOS]] * 2
    assert any(t != V - 1 for t in other["out"][0])  # the client-keyed ban never applied
    assert caplog.text.count("register specs by request id") == 1


def test_batched_blocks_need_no_copy_when_the_slices_are_consecutive():
    buffer = torch.randn(3, 2, V)
    block, scatter = _as_block([buffer[i : i + 1].reshape(-1, V) for i in range(3)])
    assert not scatter and block.data_ptr() == buffer.data_ptr() and block.shape == (6, V)
    block, scatter = _as_block([torch.randn(2, V), torch.randn(2, V)])
    assert scatter and block.shape == (4, V)


def test_batched_gathered_path_writes_back():
    batched = TRTLLMBatchedLogitsProcessor(
        lambda req_id, client_id: (
            [{"kind": "forced_sequence", "token_ids": [5], "eos_token_id": EOS}] if req_id == 1 else None
        ),
        vocab_size=V,
    )
    a, b = torch.randn(1, V), torch.randn(1, V)
    b_before = b.clone()
    batched([0, 1], [b, a], [[[1, 2]], [[1, 2]]], None, [None, None])
    assert torch.equal(b, b_before)
    assert a.argmax().item() == 5 and torch.isinf(a).sum() == V - 1


def test_batched_state_is_bounded():
    batched = TRTLLMBatchedLogitsProcessor(
        lambda req_id, client_id: [
            {"kind": "forced_sequence", "token_ids": [5] * (req_id % 3), "eos_token_id": EOS}
        ],
        vocab_size=V,
    )
    engine = FakeEngine()
    for i in range(300):
        engine.add([1, 2])
        if len(engine.active()) >= 6 or i == 299:
            while engine.active():
                engine.step(torch.randn(len(engine.active()), 1, V), batched=batched)
                assert len(batched.keyed) <= 6
    assert all(r["out"][0] == [5] * (r["id"] % 3) + [EOS] for r in engine.requests)


def test_prefill_role_does_nothing():
    proc = TRTLLMLogitsProcessor(
        [{"kind": "forced_sequence", "token_ids": [5], "eos_token_id": EOS}], role="prefill"
    )
    logits = torch.randn(1, 1, V)
    before = logits.clone()
    proc(1, logits, [[1, 2]], None, None)
    assert torch.equal(logits, before)


def test_decode_worker_continues_after_the_prefill_token():
    """Disaggregated: TRT-LLM's context (prefill) server produced the first token; the
    generation (decode) server's processor sees it in token_ids and continues from the ids."""
    engine = FakeEngine()
    forced = engine.add(
        [1, 2, 3],
        TRTLLMLogitsProcessor(
            [
                {
                    "kind": "forced_sequence",
                    "token_ids": [20, 21, 22],
                    "eos_token_id": EOS,
                    "position": "tokens",
                }
            ],
            prompt_len=3,
            role="decode",
        ),
        output=[20],
    )
    budget = engine.add(
        [1, THINK],
        TRTLLMLogitsProcessor(
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
            prompt_len=2,
            role="decode",
        ),
        output=[17],
    )
    logits = torch.randn(2, 1, V)
    logits[1, 0, THINK_END] = -100
    engine.step(logits)
    engine.step(torch.randn(2, 1, V))
    assert forced["out"][0] == [20, 21, 22]
    assert budget["out"][0][-1] == THINK_END and len(budget["out"][0]) == 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_runs_on_the_engine_stream():
    stream = torch.cuda.Stream()
    proc = TRTLLMLogitsProcessor([{"kind": "forced_sequence", "token_ids": [5], "eos_token_id": EOS}])
    logits = torch.randn(1, 2, V, device="cuda")
    with torch.cuda.stream(stream):
        proc(1, logits, [[1], [1]], stream.cuda_stream, None)
    stream.synchronize()
    assert logits.argmax(-1).tolist() == [[5, 5]]


@pytest.mark.parametrize("position", ["calls", "tokens"])
def test_one_processor_serving_several_requests_gives_each_what_a_fresh_one_gives(position):
    """One ``SamplingParams`` (so one processor object) given to several prompts: each request,
    concurrent or one after the other, starts its own state."""
    specs = [{"kind": "forced_sequence", "token_ids": [5, 6, 7], "eos_token_id": EOS, "position": position}]
    shared = TRTLLMLogitsProcessor(specs, vocab_size=V)
    engine = FakeEngine()
    first = engine.add([1, 2], shared)
    engine.step(torch.zeros(1, 1, V))
    # A second request joins with a longer prompt, and a third after both have finished.
    second = engine.add([1, 2, 3, 4, 9, 9, 9], shared)
    while engine.active():
        engine.step(torch.zeros(len(engine.active()), 1, V))
    third = engine.add([3, 3, 3, 3, 3], shared)
    while engine.active():
        engine.step(torch.zeros(1, 1, V))
    for request in (first, second, third):
        assert request["out"][0] == [5, 6, 7, EOS]
    # Finished requests are dropped once idle, and a request that starts late is kept.
    for _ in range(40):
        late = engine.add([2, 2], shared)
        engine.step(torch.zeros(len(engine.active()), 1, V))
    assert late["out"][0] == [5] and len(shared._requests) <= 8
    while engine.active():
        engine.step(torch.zeros(len(engine.active()), 1, V))
    assert all(r["out"][0] == [5, 6, 7, EOS] for r in engine.requests)
    shared.reset()
    assert not shared._requests


class OverlapEngine(FakeEngine):
    """TensorRT-LLM's overlap scheduler (the PyTorch backend's default): each step's processors
    run before the previous step's token is appended, so ``token_ids`` are one step stale."""

    def step(self, logits, batched=None, max_new=8):
        active = self.active()
        for r in active:
            r.setdefault("pending", None)
        slices = [logits[i].unsqueeze(1) for i in range(len(active))]
        ids = [[r["prompt"] + r["out"][b] for b in range(self.beams)] for r in active]
        for r, s, i in zip(active, slices, ids):
            if r["processor"] is not None:
                r["processor"](r["id"], s, i, None, None)
        picks = logits.argmax(-1).tolist()
        for r, p in zip(active, picks):
            if r["pending"] is not None:  # the previous step's token lands only now
                for b in range(self.beams):
                    r["out"][b].append(r["pending"][b])
            r["pending"] = p
            if len(r["out"][0]) + 1 >= max_new:
                r["done"] = True
        return logits


HISTORY_READING = [
    [{"kind": "forced_sequence", "token_ids": [5, 6], "eos_token_id": EOS}],
    [{"kind": "repetition_penalty", "penalty": 1.5}],
    [{"kind": "temperature", "temperature": 0.5}, lambda ids, row: None],
]


@pytest.mark.parametrize("specs", HISTORY_READING)
def test_overlap_scheduler_refuses_history_reading_specs_naming_the_setting(specs):
    with pytest.raises(lp.SpecError, match="disable_overlap_scheduler"):
        trtllm.TRTLLMLogitsProcessor(specs, vocab_size=V)
    batched = trtllm.TRTLLMBatchedLogitsProcessor(vocab_size=V)
    if all(isinstance(s, dict) for s in specs):
        with pytest.raises(lp.SpecError, match="disable_overlap_scheduler"):
            batched.register(1, specs)
        with pytest.raises(lp.SpecError, match="disable_overlap_scheduler"):
            trtllm.TRTLLMBatchedLogitsProcessor({1: specs}, vocab_size=V)
    trtllm.TRTLLMLogitsProcessor(specs, vocab_size=V, disable_overlap_scheduler=True)  # exact there


def test_overlap_scheduler_refusal_comes_from_the_core_registry():
    # Every kind the core says reads no history is accepted under overlap; every other refused.
    free = [{"kind": "temperature", "temperature": 0.5}, {"kind": "top_k", "k": 3}]
    assert not lp.reads_history(free)
    trtllm.TRTLLMLogitsProcessor(free, vocab_size=V)
    reading = [{"kind": "no_repeat_ngram", "n": 2}]
    assert lp.reads_history(reading)
    with pytest.raises(lp.SpecError):
        trtllm.TRTLLMLogitsProcessor(reading, vocab_size=V)


def test_overlap_scheduler_history_free_specs_are_exact_on_stale_ids():
    torch.manual_seed(3)
    specs = [{"kind": "temperature", "temperature": 0.5}, {"kind": "logit_bias", "bias": {"7": 50.0}}]
    prompt = [1, 2, 3]
    steps = [torch.randn(1, 1, V) for _ in range(6)]
    engine = OverlapEngine(layout="pytorch")
    engine.add(prompt, trtllm.TRTLLMLogitsProcessor(specs, vocab_size=V))
    ref = oracle(specs, len(prompt))
    for logits in steps:
        want = logits[0].clone()
        ref.apply(want, [prompt])  # history-free: the ids do not matter
        got = engine.step(logits.clone(), max_new=100)
        assert torch.equal(got[0], want)


def test_overlap_scheduler_callable_specs_are_refused_at_the_first_call(caplog):
    batched = trtllm.TRTLLMBatchedLogitsProcessor(
        lambda req_id, client_id: [{"kind": "forced_sequence", "token_ids": [5], "eos_token_id": EOS}],
        vocab_size=V,
    )
    engine = OverlapEngine(layout="pytorch")
    engine.add([1, 2, 3])
    with caplog.at_level(logging.ERROR):
        for _ in range(3):
            logits = torch.randn(1, 1, V)
            got = engine.step(logits.clone(), batched=None)
            batched([100], [logits[0].unsqueeze(1)], [[[1, 2, 3]]], None, [None])
            assert torch.equal(logits, got)  # never edited: not even one step late
    assert "disable_overlap_scheduler" in caplog.text


def test_speculative_config_refuses_every_spec():
    with pytest.raises(lp.SpecError, match="speculative_config"):
        trtllm.TRTLLMLogitsProcessor(
            [{"kind": "temperature", "temperature": 0.5}],
            vocab_size=V,
            speculative_config={"decoding_type": "MTP"},
        )
    batched = trtllm.TRTLLMBatchedLogitsProcessor(
        vocab_size=V, disable_overlap_scheduler=True, speculative_config=object()
    )
    with pytest.raises(lp.SpecError, match="speculative_config"):
        batched.register(1, [{"kind": "temperature", "temperature": 0.5}])


def test_stale_ids_under_a_setting_that_claims_no_overlap_are_refused_not_late(caplog):
    """Told the overlap scheduler is off while the ids arrive a step stale: the request is left
    alone from the first call with no new id, never processed on the stale history."""
    specs = [{"kind": "forced_sequence", "token_ids": [5, 6, 7], "eos_token_id": EOS}]
    engine = OverlapEngine(layout="pytorch")
    req = engine.add([1, 2, 3], TRTLLMLogitsProcessor(specs, vocab_size=V))
    torch.manual_seed(5)
    with caplog.at_level(logging.ERROR):
        first = torch.randn(1, 1, V)
        assert engine.step(first.clone())[0, 0].argmax() == 5  # the prompt alone: exact
        for _ in range(4):
            logits = torch.randn(1, 1, V)
            assert torch.equal(engine.step(logits.clone()), logits)  # left alone, not a step late
    assert "disable_overlap_scheduler" in caplog.text and str(req["id"]) in caplog.text


@device_reads.needs_interpreter
@pytest.mark.parametrize("batched", [False, True])
def test_the_device_path_through_the_switch_gives_the_same_steps(monkeypatch, batched):
    """``LOGITS_PROCESSING_DEVICE=interpret``: the processors' host tensors take the device path
    (the Triton kernels under the interpreter, the round trip for what they do not carry). Every
    step's logits and every request's tokens equal those of the same loop without the switch, and
    no step reads anything from the device, for history-free specs and history readers alike
    (``token_ids`` come as host lists): ``device_reads`` stays 0, as the reads of the logits
    (``device_reads.OnDevice``) say."""
    from logits_processing import kernels

    specs_of = {
        0: [{"kind": "forced_sequence", "token_ids": [5, 6, 7], "eos_token_id": EOS}],
        1: [{"kind": "temperature", "temperature": 0.5}, {"kind": "top_k", "k": 3}],
        2: [{"kind": "repetition_penalty", "penalty": 1.5}, {"kind": "ban_tokens", "token_ids": [EOS]}],
        3: [{"kind": "mirostat", "version": 2, "tau": 3.0}],  # not carried: the round trip
        4: None,
    }
    if batched:
        # A batch with a row the kernels do not carry takes the round trip whole.
        del specs_of[3]

    def run(on_device=False):
        torch.manual_seed(5)
        engine = FakeEngine(beams=2, on_device=on_device)
        processor = TRTLLMBatchedLogitsProcessor(vocab_size=V) if batched else None
        processors = [processor] if batched else []
        for client, specs in specs_of.items():
            if batched:
                engine.add([1, 2, 3], client_id=client)
                if specs:
                    processor.register(client, specs, prompt_len=3)
            else:
                proc = TRTLLMLogitsProcessor(specs, prompt_len=3, vocab_size=V) if specs else None
                processors += [proc] if proc else []
                engine.add([1, 2, 3], proc)
        steps, reads = [], []
        while engine.active():
            steps.append(engine.step(torch.randn(len(engine.active()), 2, V), batched=processor).clone())
            reads.append([p.device_reads for p in processors] + [device_reads.reads()])
        return steps, [r["out"] for r in engine.requests], reads

    plain = run()
    launched = []
    launch = kernels.launch
    monkeypatch.setattr(kernels, "launch", lambda *args: launched.append(args[1]) or launch(*args))
    monkeypatch.setenv("LOGITS_PROCESSING_DEVICE", "interpret")
    del device_reads.READS[:]
    switched = run(on_device=True)
    assert launched, "the kernels never ran"
    assert switched[2] == [[0] * len(switched[2][0])] * len(switched[0])
    assert plain[1] == switched[1]
    assert len(plain[0]) == len(switched[0])
    for a, b in zip(plain[0], switched[0]):
        assert torch.equal(a, b)
