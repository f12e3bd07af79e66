"""A real llama-cpp-python engine: a tiny random-weight Llama written here as a GGUF (the
``gguf`` package) over the real Qwen2 vocab llama.cpp's sources ship (151,936 ids, byte-level
BPE), generating through ``Llama.__call__`` and ``create_completion`` with
``logits_processor=LogitsProcessorList([LlamaCppLogitsProcessor(...)])``. Each request's output
is checked against what its specs demand: the forced ids and ``hello_world``'s text, banned ids
absent (and ``-inf`` in every row the sampler saw), ``ban_strings``' text absent, greedy outputs
unchanged by a temperature, a seeded sampled run repeated exactly, a regex and a JSON schema's
output parsing, a thinking budget's forced end, DRY lowering a repeat, one processor serving several calls
(a new prompt, even one that extends the last output, starting over).

Then conformance.py's requests, on the test command's tiny model (the weights every other
engine runs, written here as a GGUF): each request's tokens must keep what its specs demand, and
the record goes to ``$LOGITS_PROCESSING_CONFORMANCE_DIR`` for test_conformance.py to compare with
transformers' ``generate()``.

Runs in the venv scripts/llamacpp-python.sh makes (scripts/test-engines.sh runs it there);
skipped, with the reason, where llama_cpp, gguf, the vocab or the tiny model is missing.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")
llama_cpp = pytest.importorskip(
    "llama_cpp", reason="llama-cpp-python is not installed (scripts/llamacpp-python.sh)"
)
gguf = pytest.importorskip("gguf", reason="the gguf package is not installed (scripts/llamacpp-python.sh)")

from logits_processing.adapters.llama_cpp import (  # noqa: E402
    LlamaCppLogitsProcessor,
    context_from_llama,
    tokenizer_json_from_gguf,
)

# Where scripts/llamacpp-python.sh keeps its wheel and the vocab.
CACHE = Path(os.environ.get("LOGITS_PROCESSING_ENGINE_VENVS", Path.home() / ".cache" / "logits-processing"))
VOCAB_GGUF = Path(
    os.environ.get("LLAMACPP_VOCAB", CACHE / "llamacpp-python-wheels" / "vocab" / "ggml-vocab-qwen2.gguf")
)
if not VOCAB_GGUF.is_file():
    pytest.skip(
        f"no vocab GGUF at {VOCAB_GGUF} (scripts/llamacpp-python.sh keeps it)", allow_module_level=True
    )

N_EMBD, N_HEAD, N_FF, N_LAYER = 64, 4, 128, 2


def write_tiny_llama(path: Path, vocab_path: Path) -> None:
    """A 2-layer Llama with random weights (seeded) and the vocab of `vocab_path`."""
    fields = gguf.GGUFReader(str(vocab_path)).fields

    def field(name):
        return fields[name].contents()

    tokens = field("tokenizer.ggml.tokens")
    n_vocab = len(tokens)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-random-llama")
    w.add_context_length(512)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(N_EMBD // N_HEAD)
    w.add_tokenizer_model(field("tokenizer.ggml.model"))
    w.add_tokenizer_pre(field("tokenizer.ggml.pre"))
    w.add_token_list(tokens)
    w.add_token_types(field("tokenizer.ggml.token_type"))
    w.add_token_merges(field("tokenizer.ggml.merges"))
    w.add_eos_token_id(field("tokenizer.ggml.eos_token_id"))
    w.add_bos_token_id(field("tokenizer.ggml.bos_token_id"))
    w.add_add_bos_token(False)
    rng = np.random.default_rng(0)

    def tensor(name, *shape, scale=1.0):
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    # numpy shapes are ggml's reversed: token_embd is ggml [n_embd, n_vocab].
    tensor("token_embd.weight", n_vocab, N_EMBD)
    w.add_tensor("output_norm.weight", np.ones(N_EMBD, np.float32))
    tensor("output.weight", n_vocab, N_EMBD, scale=0.5)
    for b in range(N_LAYER):
        w.add_tensor(f"blk.{b}.attn_norm.weight", np.ones(N_EMBD, np.float32))
        w.add_tensor(f"blk.{b}.ffn_norm.weight", np.ones(N_EMBD, np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            tensor(f"blk.{b}.{name}.weight", N_EMBD, N_EMBD, scale=N_EMBD**-0.5)
        tensor(f"blk.{b}.ffn_gate.weight", N_FF, N_EMBD, scale=N_EMBD**-0.5)
        tensor(f"blk.{b}.ffn_up.weight", N_FF, N_EMBD, scale=N_EMBD**-0.5)
        tensor(f"blk.{b}.ffn_down.weight", N_EMBD, N_FF, scale=N_FF**-0.5)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama") / "tiny.gguf"
    write_tiny_llama(path, VOCAB_GGUF)
    return llama_cpp.Llama(str(path), n_ctx=512, n_threads=2, n_batch=64, seed=0, verbose=False)


@pytest.fixture(scope="module")
def context(llm):
    # Token texts (grammars, ban_strings, DRY) from the vocab the model carries.
    return context_from_llama(llm, tokenizer=tokenizer_json_from_gguf(llm.model_path))


PROMPT = "The quick brown fox"


class Recorder:
    """Last in the list: sees every row the sampler samples from, after our processor."""

    def __init__(self):
        self.rows, self.ids = [], []

    def __call__(self, input_ids, scores):
        self.ids.append([int(i) for i in input_ids])
        self.rows.append(scores.copy())
        return scores


def generate(llm, procs, *, via="call", max_tokens=12, prompt=PROMPT, **kw):
    """(text, token ids generated, recorder, finish reason). The tokens are the ids the last
    call saw past the prompt, plus the last one sampled (greedy: the last row's argmax)."""
    rec = Recorder()
    kw.setdefault("temperature", 0.0)
    fn = llm if via == "call" else llm.create_completion
    out = fn(
        prompt, max_tokens=max_tokens, logits_processor=llama_cpp.LogitsProcessorList([*procs, rec]), **kw
    )
    choice = out["choices"][0]
    prompt_len = len(rec.ids[0])
    tokens = rec.ids[-1][prompt_len:] + [int(np.argmax(rec.rows[-1]))]
    return choice["text"], tokens, rec, choice["finish_reason"]


def text_of(llm, ids):
    return llm.detokenize(ids).decode("utf-8", errors="replace")


@pytest.fixture(scope="module")
def baseline(llm):
    text, tokens, _, _ = generate(llm, [])
    assert len(tokens) == 12 and text_of(llm, tokens) == text
    return text, tokens


def test_forced_sequence_through_call_and_create_completion(llm, context):
    forced = llm.tokenize(b" jumps over the lazy dog", add_bos=False)
    eos = llm.token_eos()
    spec = {"kind": "forced_sequence", "token_ids": forced, "eos_token_id": eos}
    proc = LlamaCppLogitsProcessor(spec, context=context)
    for via in ("call", "completion"):  # one processor, two generations: each starts over
        text, tokens, _, finish = generate(llm, [proc], via=via)
        assert tokens == forced + [eos]
        assert text == " jumps over the lazy dog" and finish == "stop"


def test_hello_world_from_the_llama_tokenizer(llm):
    proc = LlamaCppLogitsProcessor({"kind": "hello_world"}, llama=llm)
    assert proc.context.hello_world == (llm.tokenize(b"Hello world!", add_bos=False), llm.token_eos())
    text, _, _, finish = generate(llm, [proc], via="completion")
    assert text == "Hello world!" and finish == "stop"


def test_ban_tokens(llm, context, baseline):
    _, base = baseline
    banned = sorted(set(base[:3]))
    proc = LlamaCppLogitsProcessor({"kind": "ban_tokens", "token_ids": banned}, context=context)
    _, tokens, rec, _ = generate(llm, [proc])
    assert not set(tokens) & set(banned)
    assert all(np.isneginf(row[banned]).all() for row in rec.rows)
    assert tokens != base


def test_temperature_keeps_greedy_and_seeded_sampling_repeats(llm, context, baseline):
    _, base = baseline
    proc = LlamaCppLogitsProcessor([{"kind": "temperature", "temperature": 0.5}], context=context)
    _, tokens, _, _ = generate(llm, [proc])
    assert tokens == base  # dividing by a temperature keeps the argmax
    specs = [{"kind": "temperature", "temperature": 1.5}, {"kind": "top_k", "k": 5}]
    runs = []
    for _ in range(2):
        proc = LlamaCppLogitsProcessor(specs, context=context)
        _, tokens, rec, _ = generate(llm, [proc], temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7)
        assert all(np.isfinite(row).sum() == 5 for row in rec.rows)
        runs.append(rec.ids[-1])
    assert runs[0] == runs[1]


def test_regex_grammar(llm, context):
    proc = LlamaCppLogitsProcessor({"kind": "grammar", "regex": "[0-9]{3}-[a-z]{2}"}, context=context)
    text, _, _, finish = generate(llm, [proc], max_tokens=20, via="completion")
    assert re.fullmatch("[0-9]{3}-[a-z]{2}", text), text
    assert finish == "stop"


def test_json_schema_grammar(llm, context):
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["ok", "n"],
        "additionalProperties": False,
        # The random model favours whitespace, which a flexible JSON grammar lets run on.
        "x-guidance": {"whitespace_flexible": False},
    }
    proc = LlamaCppLogitsProcessor({"kind": "grammar", "json_schema": schema}, context=context)
    text, _, _, finish = generate(llm, [proc], max_tokens=40)
    value = json.loads(text)
    assert set(value) == {"ok", "n"} and isinstance(value["ok"], bool) and 0 <= value["n"] <= 9
    assert finish == "stop"


def test_ban_strings(llm, context, baseline):
    text, _ = baseline
    # A piece of the unconstrained output, banned: it must not come back.
    target = text.strip()[:4]
    assert target
    proc = LlamaCppLogitsProcessor({"kind": "ban_strings", "strings": [target]}, context=context)
    out, _, _, _ = generate(llm, [proc])
    assert target not in out
    assert out != text


def test_thinking_budget_forces_the_end(llm, context):
    start, end, nl = (
        llm.tokenize(t.encode(), add_bos=False, special=True)[0] for t in ("<|im_start|>", "<|im_end|>", "\n")
    )
    spec = {
        "kind": "thinking_budget",
        "max_thinking_tokens": 4,
        "overflow_percentage": 0.0,
        "start_token_id": start,
        "end_token_id": end,
        "newline_token_id": nl,
    }
    proc = LlamaCppLogitsProcessor([spec], context=context)
    # The thinking starts at the first token, forced by a processor before ours in the list.
    first = LlamaCppLogitsProcessor([{"kind": "allowed_token_ids", "token_ids": [start]}], context=context)

    class FirstOnly:
        def __init__(self):
            self.calls = 0

        def __call__(self, input_ids, scores):
            self.calls += 1
            return first(input_ids, scores) if self.calls == 1 else scores

    _, tokens, _, _ = generate(llm, [FirstOnly(), proc], max_tokens=12)
    assert tokens[0] == start
    assert end in tokens[1:8], tokens  # ended within the budget (with the newline exit)


def test_dry_penalizes_the_repeat_with_text_breakers(llm, context):
    # "so one two three one two": continuing with " three" repeats three tokens; DRY (its default
    # text breakers resolved through the GGUF's vocab) lowers it, and nothing else here.
    prompt = "so one two three one two"
    three = llm.tokenize(b" three", add_bos=False)
    assert len(three) == 1
    _, _, base, _ = generate(llm, [], prompt=prompt, max_tokens=1)
    proc = LlamaCppLogitsProcessor({"kind": "dry", "multiplier": 0.8}, context=context)
    _, _, rec, _ = generate(llm, [proc], prompt=prompt, max_tokens=1)
    before, after = base.rows[0], rec.rows[0]
    assert after[three[0]] < before[three[0]] - 0.5
    changed = np.flatnonzero(after != before)
    assert three[0] in changed and len(changed) <= 3, changed


def test_a_new_prompt_starts_over_even_when_it_extends_the_last_output(llm, context):
    forced = llm.tokenize(b" jumps over the lazy dog", add_bos=False)
    eos = llm.token_eos()
    proc = LlamaCppLogitsProcessor(
        {"kind": "forced_sequence", "token_ids": forced, "eos_token_id": eos}, context=context
    )
    text, tokens, _, _ = generate(llm, [proc], max_tokens=2)
    assert tokens == forced[:2]
    # The next prompt is the last one, its output and more: the sequence is forced from its start.
    prompt = PROMPT + text + " and then"
    text, tokens, _, _ = generate(llm, [proc], prompt=prompt, max_tokens=12)
    assert tokens == forced + [eos] and proc.prompt_len == len(llm.tokenize(prompt.encode()))


def test_text_specs_are_encoded_by_llama_cpp_with_a_tokenizer_for_token_texts(llm, context):
    """With a tokenizer given for token texts, the text specs carry is still encoded by
    ``Llama.tokenize`` (the model's own split, special tokens not parsed)."""
    assert context.encode("Hello world!") == llm.tokenize(b"Hello world!", add_bos=False, special=False)
    assert context.hello_world == (llm.tokenize(b"Hello world!", add_bos=False), llm.token_eos())
    assert context.encode("<|im_start|>") == llm.tokenize(b"<|im_start|>", add_bos=False, special=False)
    assert len(context.encode("<|im_start|>")) > 1  # not the special token's id
    assert context.vocab is not None and context.vocab.vocab_size == llm.n_vocab()


def test_an_error_in_the_pipeline_ends_the_generation_and_is_kept(llm, context):
    """llama-cpp-python would print and drop the exception and go on sampling unprocessed rows:
    the generation ends at EOS instead, the error kept on the processor."""
    prompt_len = len(llm.tokenize(PROMPT.encode()))

    def fails_third(input_ids, row):
        if len(input_ids) == prompt_len + 2:
            raise RuntimeError("boom")

    proc = LlamaCppLogitsProcessor(
        [fails_third, {"kind": "temperature", "temperature": 0.5}], context=context
    )
    _, tokens, _, finish = generate(llm, [proc], via="completion")
    assert finish == "stop" and len(tokens) == 3 and tokens[-1] == llm.token_eos()
    assert "RuntimeError('boom')" in str(proc.error)


def test_bad_spec_is_refused_before_generation(llm, context):
    from logits_processing import SpecError

    with pytest.raises(SpecError):
        LlamaCppLogitsProcessor({"kind": "ban_tokens", "token_ids": [llm.n_vocab()]}, context=context)


MODEL = os.environ.get("LOGITS_PROCESSING_TINY_MODEL")


@pytest.mark.skipif(
    not MODEL, reason="no tiny model in $LOGITS_PROCESSING_TINY_MODEL (scripts/test-engines.sh makes it)"
)
def test_conformance_requests_recorded(tmp_path):
    """conformance.py's requests through llama-cpp-python on the same weights as every other engine:
    every one served but ``bitmask`` (refused, naming it), each keeping what its specs demand;
    test_conformance.py compares the record with transformers' ``generate()``."""
    pytest.importorskip("transformers")
    import conformance
    from transformers import AutoTokenizer

    rows = conformance.run_llamacpp(MODEL, str(tmp_path / "tiny.gguf"))["rows"]
    assert "bitmask" in rows["bitmask"].get("error", ""), rows["bitmask"]
    assert [n for n, row in rows.items() if "error" in row] == ["bitmask"]
    assert conformance.unmet_demands(AutoTokenizer.from_pretrained(MODEL), rows) == {}
