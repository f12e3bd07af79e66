"""logits-processor-zoo's kinds against the zoo's own transformers processors, on the DeepSeek
tokenizer, step by step on random rows.

Where a kind forces a token, ours is hard (every other logit -inf, the token keeps its value) and
the zoo's `enforce_tokens` lifts the token to the row's maximum and fills the rest with the row's
minimum: a forced step is compared as "the same single token", every other step bit for bit.
"""

from __future__ import annotations

import pytest
import torch
from conftest import bits

from logits_processing import EngineContext, Processor

zoo = pytest.importorskip("logits_processor_zoo.transformers")


@pytest.fixture(scope="module")
def tok(deepseek_hf_tokenizer):
    return deepseek_hf_tokenizer


@pytest.fixture(scope="module")
def vocab(tok):
    return len(tok)


@pytest.fixture(scope="module")
def context(tok, vocab):
    return EngineContext(tok, vocab_size=vocab)


def forced_token(row: torch.Tensor):
    finite = torch.isfinite(row).nonzero().flatten()
    return int(finite[0]) if len(finite) == 1 else None


def check_step(row, got, want):
    """`got` (ours) against `want` (the zoo's), from the same incoming `row`."""
    token = forced_token(got)
    if token is not None and forced_token(row) is None:
        assert got[token] == row[token], "a forced token keeps its value"
        assert int(want.argmax()) == token
        rest = torch.cat([want[:token], want[token + 1 :]])
        assert bool((rest == want.min()).all()) and want[token] > want.min()
        return token
    assert torch.equal(bits(got), bits(want))
    return None


def run(ours, ref, prompt, rows, steps, stop=None, seed=0):
    """Both processors over `steps` steps; the next id is the forced one, else drawn from our
    row. Returns the generated ids and the steps that forced."""
    g = torch.Generator().manual_seed(seed)
    ids = list(prompt)
    forced = []
    for step in range(steps):
        row = rows(step, ids)
        want = ref(torch.tensor([ids]), row.clone()[None])[0]
        got = row.clone()
        ours(ids, got)
        token = check_step(row, got, want)
        if token is None:
            token = int(torch.multinomial(torch.softmax(got.double(), -1), 1, generator=g))
        else:
            forced.append(step)
        ids.append(token)
        if stop is not None and token == stop:
            break
    return ids[len(prompt) :], forced


def random_rows(vocab, seed, lift=None, scale=2.0):
    """Random rows; `lift(step, ids)` names a token to make the argmax at that step."""

    def rows(step, ids):
        g = torch.Generator().manual_seed(seed * 1000 + step)
        row = torch.randn(vocab, generator=g) * scale
        token = lift(step, ids) if lift else None
        if token is not None:
            row[token] = row.max() + 30.0
        return row

    return rows


PROMPT_TEXT = "Tell me about the weather in Paris today."


@pytest.mark.parametrize("seed", range(4))
def test_force_last_phrase(tok, vocab, context, seed):
    phrase = "\n\nThanks for asking!"
    prompt = tok.encode(PROMPT_TEXT, add_special_tokens=False)
    eos = tok.eos_token_id
    ref = zoo.ForceLastPhraseLogitsProcessor(phrase, tok, batch_size=1)
    ours = Processor({"kind": "force_last_phrase", "phrase": phrase}, prompt_len=len(prompt), context=context)
    # EOS is the argmax from step 3 + seed on: the phrase comes first, then the model may end.
    rows = random_rows(vocab, seed, lift=lambda step, ids: eos if step >= 3 + seed else None)
    out, forced = run(ours, ref, prompt, rows, 20, stop=eos, seed=seed)
    phrase_ids = tok.encode(phrase, add_special_tokens=False)
    assert forced == list(range(3 + seed, 3 + seed + len(phrase_ids)))
    assert out[3 + seed : 3 + seed + len(phrase_ids)] == phrase_ids
    assert out[-1] == eos


def test_force_last_phrase_resumes_from_the_ids(tok, vocab, context):
    phrase = "\n\nThanks for asking!"
    phrase_ids = tok.encode(phrase, add_special_tokens=False)
    prompt = tok.encode(PROMPT_TEXT, add_special_tokens=False)
    spec = {"kind": "force_last_phrase", "phrase": phrase}
    # A request re-sent with two of the phrase's tokens already written continues the phrase.
    resumed = Processor(spec, prompt_len=len(prompt), context=context)
    row = torch.zeros(vocab)
    resumed(prompt + [100, 200] + phrase_ids[:2], row)
    assert forced_token(row) == phrase_ids[2]


def test_text_without_a_tokenizer_is_refused_naming_the_field():
    from logits_processing import SpecError

    with pytest.raises(SpecError) as e:
        Processor(
            {"kind": "force_last_phrase", "phrase": "Thanks!", "eos_token_id": 2}, context=EngineContext()
        )
    assert e.value.field == "phrase"
    with pytest.raises(SpecError) as e:
        Processor({"kind": "force_last_phrase", "phrase": [5, 6]}, context=EngineContext())
    assert e.value.field == "eos_token_id"


def full_stop(tok):
    return tok.encode("It is a sentence.", add_special_tokens=False)[-1]


@pytest.mark.parametrize(
    ("boost_factor", "p", "complete_sentences", "boost_token"),
    [(0.5, 2, False, None), (-1.0, 1, False, None), (3.0, 0, True, None), (0.7, 3, True, "</think>")],
)
def test_gen_length(tok, vocab, context, boost_factor, p, complete_sentences, boost_token):
    prompt = tok.encode(PROMPT_TEXT, add_special_tokens=False)
    ref = zoo.GenLengthLogitsProcessor(
        tok, boost_factor, p=p, complete_sentences=complete_sentences, boost_token_str=boost_token
    )
    spec = {
        "kind": "gen_length",
        "boost_factor": boost_factor,
        "p": p,
        "complete_sentences": complete_sentences,
    }
    if boost_token is not None:
        spec["boost_token"] = boost_token
    ours = Processor(spec, prompt_len=len(prompt), context=context)
    stop = full_stop(tok)
    # A full stop every third step, so complete_sentences boosts some steps.
    rows = random_rows(vocab, 5, lift=lambda step, ids: stop if step % 3 == 1 else None)
    out, forced = run(ours, ref, prompt, rows, 25)
    assert forced == []
    assert stop in out


@pytest.mark.parametrize("complete_sentences", [False, True])
def test_max_time_past_its_limit(tok, vocab, context, complete_sentences):
    # No full stop at the prompt's end: with complete_sentences, the first step is not forced.
    prompt = tok.encode(PROMPT_TEXT[:-1], add_special_tokens=False)
    eos = tok.eos_token_id
    ref = zoo.MaxTimeLogitsProcessor(tok, 0.0, complete_sentences=complete_sentences)
    spec = {"kind": "max_time", "max_time": 0.0, "complete_sentences": complete_sentences}
    ours = Processor(spec, prompt_len=len(prompt), context=context)
    stop = full_stop(tok)
    rows = random_rows(vocab, 6, lift=lambda step, ids: stop if step == 4 else None)
    out, forced = run(ours, ref, prompt, rows, 10, stop=eos)
    # Forced at once, or right after the first full stop.
    assert forced == ([5] if complete_sentences else [0])
    assert out[-1] == eos


def test_max_time_before_its_limit(tok, vocab, context):
    prompt = tok.encode(PROMPT_TEXT, add_special_tokens=False)
    ref = zoo.MaxTimeLogitsProcessor(tok, 1e6)
    ours = Processor({"kind": "max_time", "max_time": 1e6}, prompt_len=len(prompt), context=context)
    _, forced = run(ours, ref, prompt, random_rows(vocab, 7), 6)
    assert forced == []


@pytest.mark.parametrize(("trigger_count", "trigger_after"), [(1, False), (2, False), (2, True)])
def test_trigger_phrase(tok, vocab, context, trigger_count, trigger_after):
    phrase = " Wait, let me check."
    phrase_ids = tok.encode(phrase, add_special_tokens=False)
    trigger = "</think>"
    trigger_id = tok.encode(trigger, add_special_tokens=False)[-1]
    prompt = tok.encode(PROMPT_TEXT, add_special_tokens=False)
    ref = zoo.TriggerPhraseLogitsProcessor(
        tok, 1, phrase, trigger_token_phrase=trigger, trigger_count=trigger_count, trigger_after=trigger_after
    )
    spec = {
        "kind": "trigger_phrase",
        "phrase": phrase,
        "trigger_token_phrase": trigger,
        "trigger_count": trigger_count,
        "trigger_after": trigger_after,
    }
    ours = Processor(spec, prompt_len=len(prompt), context=context)
    trigger_steps = {2, 12, 24}
    rows = random_rows(vocab, 8, lift=lambda step, ids: trigger_id if step in trigger_steps else None)
    out, forced = run(ours, ref, prompt, rows, 30)
    start = [2, 12][:trigger_count]
    offset = 1 if trigger_after else 0
    assert forced == [s + offset + k for s in start for k in range(len(phrase_ids))]
    for s in start:
        assert out[s + offset : s + offset + len(phrase_ids)] == phrase_ids


@pytest.mark.parametrize(("minp", "tolerate"), [(0.4, 1), (0.5, 0), (0.2, 3)])
def test_prevent_hallucination(tok, vocab, context, minp, tolerate):
    phrase = "...I don't know actually.\n"
    phrase_ids = tok.encode(phrase, add_special_tokens=False)
    prompt = tok.encode(PROMPT_TEXT, add_special_tokens=False)
    ref = zoo.PreventHallucinationLogitsProcessor(tok, 1, minp=minp, tolerate=tolerate)
    spec = {"kind": "prevent_hallucination", "minp": minp, "tolerate": tolerate}
    ours = Processor(spec, prompt_len=len(prompt), context=context)
    # Sure rows (one token far ahead) and unsure ones (a flat random row), in a fixed pattern.
    sure = [1, 0, 1, 1, 0, 0, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 1, 0] * 3
    rows = random_rows(vocab, 9, lift=lambda step, ids: 1000 + step if sure[step] else None)
    out, forced = run(ours, ref, prompt, rows, len(sure))
    assert forced, "the phrase came"
    first = forced[0]
    assert out[first : first + len(phrase_ids)] == phrase_ids


@pytest.mark.parametrize(
    ("boost_factor", "boost_eos", "conditional"), [(1.0, True, 0.0), (-2.5, False, 1.5), (0.0, True, -0.75)]
)
def test_cite_from_prompt(tok, vocab, context, boost_factor, boost_eos, conditional):
    prompt = tok.encode(
        PROMPT_TEXT + " The weather in Paris is mild; the weather in Rome is hot.", add_special_tokens=False
    )
    ref = zoo.CiteFromPromptLogitsProcessor(
        tok, boost_factor=boost_factor, boost_eos=boost_eos, conditional_boost_factor=conditional
    )
    spec = {
        "kind": "cite_from_prompt",
        "boost_factor": boost_factor,
        "boost_eos": boost_eos,
        "conditional_boost_factor": conditional,
    }
    ours = Processor(spec, prompt_len=len(prompt), context=context)
    # The prompt's tokens now and then, so the conditional boost has followers to boost.
    rows = random_rows(
        vocab, 10, lift=lambda step, ids: prompt[(3 * step) % len(prompt)] if step % 2 else None
    )
    _, forced = run(ours, ref, prompt, rows, 12)
    assert forced == []


def test_multiple_choice(tok, vocab, context):
    choices = ["A", "B", "C", "D"]
    ref = zoo.MultipleChoiceLogitsProcessor(tok, choices=choices, delimiter=".")
    ours = Processor({"kind": "multiple_choice", "choices": choices}, context=context)
    ids = [tok.encode(c, add_special_tokens=False)[-1] for c in choices]
    prompt = tok.encode(
        "Which is a fruit?\nA. car\nB. apple\nC. desk\nD. road\nAnswer:", add_special_tokens=False
    )
    for seed in range(4):
        row = random_rows(vocab, 11 + seed)(0, prompt)
        want = ref(torch.tensor([prompt]), row.clone()[None])[0]
        got = row.clone()
        ours(prompt, got)
        assert sorted(torch.isfinite(got).nonzero().flatten().tolist()) == sorted(ids)
        assert torch.equal(got[ids], row[ids]), "the choices keep their values"
        # The zoo lifts the choices by one amount: the same distribution among them.
        assert torch.allclose(torch.softmax(want[ids], -1), torch.softmax(got[ids], -1), atol=1e-6)
        assert int(want.argmax()) == int(got.argmax())


@pytest.fixture(scope="module")
def tiny(tok):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    import demo_generate as demo

    return demo, demo.tiny_model(len(tok))


def test_every_zoo_kind_through_hf_generate_equals_the_zoo(tok, tiny):
    """Greedy generate() with the HF adapter gives the zoo's own processor's tokens, kind by kind
    (a tiny random-weight Llama: whatever it says, both must say the same)."""
    from logits_processing.adapters.hf import HFLogitsProcessor

    demo, model = tiny
    prompt = demo.prompt_ids(tok, "Which is a fruit?\nA. car\nB. apple\nC. desk\nD. road\nAnswer:")
    plain = demo.generate(model, [prompt], None, max_new_tokens=12)[0]
    # The model's own token at step 3 stands for the EOS and trigger tokens, so the triggers fire.
    marker = plain[3]
    phrase = " Wait, let me check."
    cases = [
        ({"kind": "gen_length", "boost_factor": 5.0}, zoo.GenLengthLogitsProcessor(tok, 5.0), None),
        ({"kind": "cite_from_prompt", "conditional_boost_factor": 2.0}, None, "cite"),
        ({"kind": "max_time", "max_time": 0.0}, zoo.MaxTimeLogitsProcessor(tok, 0.0), None),
        ({"kind": "multiple_choice", "choices": ["A", "B", "C", "D"]}, None, "choice"),
        ({"kind": "force_last_phrase", "phrase": phrase, "eos_token_id": marker}, None, "last"),
        ({"kind": "trigger_phrase", "phrase": phrase, "trigger_token_phrase": marker}, None, "trigger"),
        ({"kind": "prevent_hallucination", "minp": 0.5, "tolerate": 2}, None, "prevent"),
    ]
    for spec, ref, name in cases:
        if name == "cite":
            ref = zoo.CiteFromPromptLogitsProcessor(tok, conditional_boost_factor=2.0)
        elif name == "choice":
            ref = zoo.MultipleChoiceLogitsProcessor(tok, choices=["A", "B", "C", "D"])
        elif name == "last":
            ref = zoo.ForceLastPhraseLogitsProcessor(phrase, tok, batch_size=1)
            ref.eos_token_id = marker
        elif name == "trigger":
            ref = zoo.TriggerPhraseLogitsProcessor(tok, 1, phrase, trigger_token_phrase="A")
            ref.trigger_token = marker
        elif name == "prevent":
            ref = zoo.PreventHallucinationLogitsProcessor(tok, 1, minp=0.5, tolerate=2)
        ours = demo.generate(model, [prompt], HFLogitsProcessor(spec, tokenizer=tok), max_new_tokens=12)
        theirs = demo.generate(model, [prompt], ref, max_new_tokens=12)
        assert ours == theirs, spec["kind"]
        if name in ("last", "trigger", "prevent"):
            assert (
                tok.encode(phrase if name != "prevent" else "...I don't know", add_special_tokens=False)[0]
                in ours[0]
            ), spec["kind"]


@pytest.mark.parametrize("boost", [0.5, -1.25])
def test_multiple_choice_boosts_choices_by_their_first_words(tok, vocab, context, boost):
    choices = ["A", "B", "C", "D"]
    ref = zoo.MultipleChoiceLogitsProcessor(tok, choices=choices, delimiter=".", boost_first_words=boost)
    prompt = tok.encode(
        "Which is a fruit?\nA. car\nB. apple\nC. desk\nD. road\nAnswer:", add_special_tokens=False
    )
    spec = {"kind": "multiple_choice", "choices": choices, "boost_first_words": boost}
    ours = Processor(spec, prompt_len=len(prompt), context=context)
    ids = [tok.encode(c, add_special_tokens=False)[-1] for c in choices]
    firsts = [
        tok.encode(f"\n{c}. {w}", add_special_tokens=False)[3]
        for c, w in zip(choices, ["car", "apple", "desk", "road"])
    ]
    for seed in range(3):
        row = random_rows(vocab, 20 + seed)(0, prompt)
        want = ref(torch.tensor([prompt]), row.clone()[None])[0]
        got = row.clone()
        ours(prompt, got)
        expected = row.clone()
        expected[ids] += boost * row[firsts]  # the zoo's boost, before its enforce_tokens
        assert sorted(torch.isfinite(got).nonzero().flatten().tolist()) == sorted(ids)
        assert torch.equal(bits(got[ids]), bits(expected[ids]))
        assert torch.allclose(torch.softmax(want[ids], -1), torch.softmax(got[ids], -1), atol=1e-6)
        assert int(want.argmax()) == int(got.argmax())
