"""Converters from the settings users have (logits_processing.convert): llama.cpp's server
parameters (its default chain, its sampler order by names and by letters, every sampler it adds),
text-generation-webui presets (sampler_priority, temperature_last, greedy, every field),
KoboldCpp's generate parameters (sampler_order, rep_pen_slope, mirostat), vLLM's SamplingParams
and an OpenAI-style body; unconvertible fields listed, never dropped; the converted specs admitted
by a Batch; a webui preset's chain, written out as the webui builds and sorts it (transformers'
warpers and the webui's definitions), keeping the tokens our specs keep with its probabilities;
a KoboldCpp request's chain written out as its SampleLogits runs it (KoboldCpp is not installable
here), and llama.cpp's own chain through its library on random rows, likewise."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import logits_processing as lp
from logits_processing import Processor, cli
from logits_processing.convert import (
    KOBOLDCPP_DEFAULTS,
    LLAMACPP_DEFAULTS,
    WEBUI_DEFAULTS,
    Conversion,
    _llamacpp_order,
    from_koboldcpp,
    from_llamacpp,
    from_openai,
    from_vllm,
    from_webui,
)


def kinds(conversion):
    return [spec["kind"] for spec in conversion.specs]


def test_llamacpps_defaults_give_its_default_chain():
    c = from_llamacpp({})
    assert c.specs == [
        {"kind": "top_k", "k": 40},
        {"kind": "top_p", "p": 0.95},
        {"kind": "min_p", "p": 0.05},
        {"kind": "temperature", "temperature": 0.8},
    ]
    assert c.unsupported == {}
    lp.validate_specs(c.specs)  # admitted as they are (raises otherwise)


def test_the_sampler_order_by_names_aliases_and_letters():
    params = {"top_k": 10, "typical_p": 0.9, "min_p": 0.0}
    by_names = from_llamacpp({**params, "samplers": ["temp", "Top-K", "typ", "nucleus", "minp"]})
    assert kinds(by_names) == ["temperature", "top_k", "typical_p", "top_p"]
    by_letters = from_llamacpp({**params, "samplers": "tkyp"})
    assert by_letters.specs == by_names.specs
    unknown = from_llamacpp({"samplers": ["top_k", "tfs_z"]})
    assert kinds(unknown) == ["top_k"] and "tfs_z" in unknown.unsupported["samplers"]


def test_every_sampler_llama_cpp_adds():
    c = from_llamacpp({
        "repeat_penalty": 1.2, "frequency_penalty": 0.3, "presence_penalty": 0.1, "repeat_last_n": 32,
        "dry_multiplier": 0.8, "top_n_sigma": 1.5, "typical_p": 0.9, "xtc_probability": 0.5,
        "dynatemp_range": 0.3, "seed": 5, "min_keep": 2, "logit_bias": [[5, 1.5], [9, False]],
    })
    assert kinds(c) == [
        "logit_bias", "ban_tokens", "repetition_penalty", "frequency_penalty", "presence_penalty",
        "dry", "top_n_sigma", "top_k", "typical_p", "top_p", "min_p", "xtc", "dynamic_temperature",
    ]
    assert all(spec.get("window") == 32 for spec in c.specs if spec["kind"].endswith("_penalty"))
    assert c.specs[-2]["seed"] == 5 and c.specs[-3]["min_tokens_to_keep"] == 2
    assert c.unsupported == {}
    mirostat = from_llamacpp({"mirostat": 2, "mirostat_tau": 4.0, "temperature": 0.7})
    assert mirostat.specs == [
        {"kind": "temperature", "temperature": 0.7},
        {"kind": "mirostat", "version": 2, "tau": 4.0, "eta": 0.1},
    ]
    greedy = from_llamacpp({"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0})
    assert greedy.specs == [{"kind": "top_k", "k": 1}]


def test_fields_that_cannot_be_converted_are_listed():
    c = from_llamacpp({"grammar": "root ::= \"a\"", "tfs_z": 0.9, "n_predict": 5, "stream": True})
    assert set(c.unsupported) == {"grammar", "tfs_z"}
    assert "GBNF" in c.unsupported["grammar"]


def test_vllm_and_openai_bodies():
    c = from_vllm({"temperature": 0.7, "top_k": -1, "top_p": 0.9, "min_p": 0.1, "repetition_penalty": 1.1,
                   "max_tokens": 20, "foo": 1})
    assert kinds(c) == ["repetition_penalty", "temperature", "min_p", "top_p"] and set(c.unsupported) == {"foo"}
    assert kinds(from_vllm({"temperature": 0.0, "top_p": 0.5})) == ["top_k"]
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    body = {"temperature": 0.5, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
    assert from_openai(body).specs[-1] == {"kind": "grammar", "json_schema": schema}


def test_vllm_fields_that_end_a_request_need_the_eos_ids():
    fields = {"min_tokens": 4, "repetition_detection": {"max_pattern_size": 8, "min_count": 3}}
    assert set(from_vllm(fields).unsupported) == {"min_tokens", "repetition_detection"}
    c = from_vllm({**fields, "temperature": 0.5}, eos_token_ids=[2])
    assert c.unsupported == {} and c.specs == [
        {"kind": "min_new_tokens", "min_new_tokens": 4, "eos_token_ids": [2]},
        {"kind": "repetition_detection", "max_pattern_size": 8, "min_pattern_size": 0, "min_count": 3,
         "eos_token_ids": [2]},
        {"kind": "temperature", "temperature": 0.5},
    ]
    Processor(c.specs, prompt_len=0)([], torch.zeros(8))  # admitted in this order
    off = {"repetition_detection": {"max_pattern_size": 0, "min_count": 0}}
    assert from_vllm(off, eos_token_ids=[2]).specs == []


def test_the_convert_command(tmp_path, capsys):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"top_k": 20, "temperature": 0.6}))
    assert cli.main(["convert", str(path), "--from", "llamacpp"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [s["kind"] for s in out["specs"]] == ["top_k", "top_p", "min_p", "temperature"]
    assert cli.main(["convert", '{"grammar": "x"}', "--from", "llamacpp"]) == 1
    assert "grammar" in json.loads(capsys.readouterr().out)["unsupported"]
    assert cli.main(["convert", "[1]", "--from", "llamacpp"]) == 2


def test_the_convert_command_on_a_webui_yaml_preset_and_koboldcpp(tmp_path, capsys):
    pytest.importorskip("yaml")
    path = tmp_path / "Preset.yaml"
    path.write_text("temperature: 1.2\nmin_p: 0.05\ntemperature_last: true\nsampler_priority: |-\n  min_p\n  temperature\n")
    assert cli.main(["convert", str(path), "--from", "webui"]) == 0
    assert [s["kind"] for s in json.loads(capsys.readouterr().out)["specs"]] == ["min_p", "temperature"]
    assert cli.main(["convert", '{"sampler_order": [6, 0, 5], "top_k": 8}', "--from", "koboldcpp"]) == 0
    assert [s["kind"] for s in json.loads(capsys.readouterr().out)["specs"]] == ["top_k", "top_k", "temperature"]
    assert cli.main(["convert", '{"ban_eos_token": true}', "--from", "koboldcpp"]) == 1
    capsys.readouterr()
    path.write_text("- a list\n")
    assert cli.main(["convert", str(path), "--from", "webui"]) == 2


# -- text-generation-webui presets -----------------------------------------------------------

# presets.py's default sampler_priority, as the webui writes it.
WEBUI_PRIORITY_TEXT = (
    "repetition_penalty\npresence_penalty\nfrequency_penalty\ndry\ntop_n_sigma\ntemperature\n"
    "dynamic_temperature\nquadratic_sampling\ntop_k\ntop_p\ntypical_p\nepsilon_cutoff\neta_cutoff\n"
    "tfs\ntop_a\nmin_p\nadaptive_p\nmirostat\nxtc\nencoder_repetition_penalty\nno_repeat_ngram"
)
WEBUI_SIMPLE = {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.15}
WEBUI_MIN_P = {"temperature": 1.0, "min_p": 0.05, "top_p": 1.0, "top_k": 0, "repetition_penalty": 1.0}
WEBUI_PRIORITY = {
    "temperature": 1.3, "top_k": 50, "min_p": 0.08, "tfs": 0.95, "temperature_last": True,
    "sampler_priority": "min_p\ntemperature\ntop_k\ntfs",
}
WEBUI_DRY_XTC = {
    "dry_multiplier": 0.8, "dry_base": 1.75, "dry_allowed_length": 3, "repetition_penalty_range": 0,
    "dry_sequence_breakers": '"\\n", ":", "\\"", "*"', "xtc_threshold": 0.15, "xtc_probability": 0.5,
    "min_p": 0.02, "seed": 7,
}
WEBUI_EVERY = {
    "temperature": 0.9, "dynamic_temperature": True, "dynatemp_low": 0.5, "dynatemp_high": 1.5,
    "dynatemp_exponent": 1.2, "smoothing_factor": 0.3, "smoothing_curve": 1.5, "top_p": 0.95, "min_p": 0.05,
    "top_k": 60, "typical_p": 0.97, "tfs": 0.98, "top_a": 0.1, "epsilon_cutoff": 3, "eta_cutoff": 4,
    "repetition_penalty": 1.1, "repetition_penalty_range": 512, "frequency_penalty": 0.1,
    "presence_penalty": 0.2, "encoder_repetition_penalty": 1.05, "no_repeat_ngram_size": 4,
    "dry_multiplier": 0.5, "dry_base": 2.0, "dry_allowed_length": 2, "dry_sequence_breakers": ["\n", "."],
    "xtc_threshold": 0.2, "xtc_probability": 0.3, "mirostat_mode": 2, "mirostat_tau": 4.0, "mirostat_eta": 0.2,
    "top_n_sigma": 1.5, "adaptive_target": 0.6, "adaptive_decay": 0.8, "custom_token_bans": "11, 12",
    "do_sample": True, "temperature_last": False, "guidance_scale": 1.0, "penalty_alpha": 0.0,
    "max_new_tokens": 512, "seed": -1,
}


def test_a_preset_without_samplers_gives_none():
    assert from_webui({}).specs == [] and from_webui({}).unsupported == {}
    off = {k: v for k, v in WEBUI_DEFAULTS.items() if k != "sampler_priority"}
    assert from_webui(off).specs == [] and from_webui(off).unsupported == {}
    # the webui's own sample presets
    assert from_webui({"top_p": 0.95}).specs == [{"kind": "top_p", "p": 0.95}]
    assert from_webui({"do_sample": False, "top_k": 1}).specs == [{"kind": "top_k", "k": 1}]
    assert kinds(from_webui({"min_p": 0.02, "xtc_probability": 0.5})) == ["min_p", "xtc"]


def test_webui_simple_and_min_p_presets():
    c = from_webui(WEBUI_SIMPLE)
    assert c.specs == [
        {"kind": "repetition_penalty", "penalty": 1.15, "window": 1024},
        {"kind": "temperature", "temperature": 0.7},
        {"kind": "top_k", "k": 20},
        {"kind": "top_p", "p": 0.9},
    ]
    assert c.unsupported == {}
    assert from_webui({**WEBUI_SIMPLE, "sampler_priority": WEBUI_PRIORITY_TEXT}).specs == c.specs
    assert from_webui(WEBUI_MIN_P).specs == [{"kind": "min_p", "p": 0.05}]


def test_webui_sampler_priority_and_temperature_last():
    c = from_webui(WEBUI_PRIORITY)
    assert kinds(c) == ["min_p", "top_k", "tail_free", "temperature"] and c.unsupported == {}
    first = from_webui({**WEBUI_PRIORITY, "temperature_last": False})
    assert kinds(first) == ["min_p", "temperature", "top_k", "tail_free"]
    # Samplers the list leaves out go first, in the order the webui builds them.
    listed = from_webui({"sampler_priority": ["top_p", "temperature", "nope"], "top_k": 30, "top_p": 0.9,
                         "temperature": 0.8, "repetition_penalty": 1.1})
    assert kinds(listed) == ["top_k", "repetition_penalty", "top_p", "temperature"]
    assert "nope" in listed.unsupported["sampler_priority"]
    comma = from_webui({**WEBUI_PRIORITY, "sampler_priority": "min_p, temperature,top_k, tfs"})
    assert comma.specs == c.specs


def test_webui_dry_and_xtc():
    c = from_webui(WEBUI_DRY_XTC)
    assert c.specs == [
        {"kind": "dry", "multiplier": 0.8, "base": 1.75, "allowed_length": 3, "penalty_last_n": -1,
         "sequence_breakers": ["\n", ":", '"', "*"]},
        {"kind": "min_p", "p": 0.02},
        {"kind": "xtc", "probability": 0.5, "threshold": 0.15, "seed": 7},
    ]
    assert c.unsupported == {}


def test_webui_every_field():
    c = from_webui(WEBUI_EVERY)
    assert kinds(c) == [
        "ban_tokens", "repetition_penalty", "presence_penalty", "frequency_penalty", "dry", "top_n_sigma",
        "temperature", "dynamic_temperature", "smoothing", "top_k", "top_p", "typical_p", "epsilon_cutoff",
        "eta_cutoff", "tail_free", "top_a", "min_p", "adaptive_p", "mirostat", "xtc", "repetition_penalty",
        "no_repeat_ngram",
    ]
    by_kind = {spec["kind"]: spec for spec in c.specs}
    assert c.specs[0] == {"kind": "ban_tokens", "token_ids": [11, 12]}
    assert all(spec.get("window") == 512 for spec in c.specs[1:4])
    assert by_kind["dry"]["penalty_last_n"] == 512 and by_kind["dry"]["sequence_breakers"] == ["\n", "."]
    assert by_kind["dynamic_temperature"] == {"kind": "dynamic_temperature", "temperature": 1.0, "range": 0.5,
                                              "exponent": 1.2}
    assert by_kind["epsilon_cutoff"]["epsilon"] == pytest.approx(3e-4)
    assert by_kind["eta_cutoff"]["epsilon"] == pytest.approx(4e-4)
    assert by_kind["mirostat"] == {"kind": "mirostat", "version": 2, "tau": 4.0, "eta": 0.2}
    assert c.specs[-2] == {"kind": "repetition_penalty", "penalty": 1 / 1.05, "scope": "prompt"}
    assert "seed" not in by_kind["xtc"]
    assert c.unsupported == {}


def test_webui_greedy():
    greedy = from_webui({"do_sample": False, "temperature": 0.5, "top_p": 0.5, "repetition_penalty": 1.2,
                         "top_a": 0.3})
    assert greedy.specs == [
        {"kind": "repetition_penalty", "penalty": 1.2, "window": 1024},
        {"kind": "top_a", "a": 0.3},
        {"kind": "top_k", "k": 1},
    ]
    assert kinds(from_webui({"temperature": 0, "min_p": 0.1})) == ["top_k"]


def test_webui_fields_that_cannot_be_converted_are_listed():
    c = from_webui({
        "guidance_scale": 1.5, "negative_prompt": "x", "penalty_alpha": 0.6, "mirostat_mode": 1,
        "grammar_string": "root ::= \"a\"", "ban_eos_token": True, "foo": 1, "max_new_tokens": 200,
        "seed": -1, "num_beams": 1, "typical_p": 0,
    })
    assert set(c.unsupported) == {"guidance_scale", "penalty_alpha", "mirostat_mode", "grammar_string",
                                  "ban_eos_token", "foo", "typical_p"}
    assert "version': 1" in c.unsupported["mirostat_mode"] and "GBNF" in c.unsupported["grammar_string"]
    assert from_webui({"ban_eos_token": False, "grammar_string": " ", "num_beams": 1}).unsupported == {}


# -- KoboldCpp's generate parameters ----------------------------------------------------------

def test_koboldcpps_defaults():
    c = from_koboldcpp({})
    assert c.specs == [
        {"kind": "top_k", "k": 5000},
        {"kind": "top_k", "k": 100},
        {"kind": "top_p", "p": 0.92},
        {"kind": "temperature", "temperature": 0.7},
    ]
    assert c.unsupported == {}
    assert from_koboldcpp(KOBOLDCPP_DEFAULTS).specs == c.specs
    off = from_koboldcpp({"top_k": 0, "top_p": 1.0, "temperature": 1.0, "rep_pen": 1.0, "typical": 1, "tfs": 1})
    assert off.specs == [{"kind": "top_k", "k": 5000}]


def test_koboldcpps_sampler_order():
    params = {"rep_pen": 1.1, "rep_pen_range": 256, "presence_penalty": 0.2, "top_a": 0.1, "tfs": 0.9,
              "typical": 0.95, "min_p": 0.05, "temperature": 1.2, "sampler_order": [6, 0, 1, 3, 4, 2, 5]}
    c = from_koboldcpp(params)
    assert kinds(c) == ["top_k", "repetition_penalty", "presence_penalty", "top_k", "top_a", "tail_free",
                        "typical_p", "top_p", "min_p", "temperature"]
    assert c.specs[1] == {"kind": "repetition_penalty", "penalty": 1.1, "window": 256}
    assert c.specs[2] == {"kind": "presence_penalty", "penalty": 0.2, "window": 256}
    assert c.unsupported == {}
    temperature_first = from_koboldcpp({"sampler_order": [5, 0, 2], "top_k": 40})
    assert kinds(temperature_first) == ["top_k", "temperature", "top_k", "top_p"]
    unknown = from_koboldcpp({"sampler_order": [6, 0, 9]})
    assert kinds(unknown) == ["top_k", "top_k"] and "9" in unknown.unsupported["sampler_order"]
    too_long = from_koboldcpp({"sampler_order": [6, 0, 1, 3, 4, 2, 5, 5]})
    assert too_long.specs == from_koboldcpp({}).specs and "sampler_order" in too_long.unsupported


def test_koboldcpps_penalty_slope_temperature_and_greedy():
    c = from_koboldcpp({"rep_pen": 1.2, "rep_pen_slope": 0.5, "rep_pen_range": 100, "sampler_order": [6]})
    assert c.specs[1:] == [
        {"kind": "repetition_penalty", "penalty": pytest.approx(1.1), "window": 100},
        {"kind": "repetition_penalty", "penalty": pytest.approx(1.2 / 1.1), "window": 50},
    ]
    flat = from_koboldcpp({"rep_pen": 1.2, "rep_pen_slope": 0.0, "rep_pen_range": 100, "sampler_order": [6]})
    assert flat.specs[1:] == [{"kind": "repetition_penalty", "penalty": 1.2, "window": 50}]
    assert from_koboldcpp({"rep_pen": 1.2, "rep_pen_range": 0, "sampler_order": [6]}).specs[1:] == []
    dyn = from_koboldcpp({"temperature": 1.0, "dynatemp_range": 0.5, "smoothing_factor": 0.25, "sampler_order": [5]})
    assert dyn.specs[1:] == [
        {"kind": "dynamic_temperature", "temperature": 1.0, "range": 0.5, "exponent": 1.0},
        {"kind": "smoothing", "factor": 0.25},
    ]
    greedy = from_koboldcpp({"temperature": 0.0, "smoothing_factor": 0.25})
    assert kinds(greedy) == ["top_k", "top_k", "top_p", "top_k"] and greedy.specs[-1] == {"kind": "top_k", "k": 1}


def test_koboldcpps_dry_xtc_bias_and_mirostat():
    c = from_koboldcpp({
        "dry_multiplier": 0.8, "dry_sequence_breakers": ["\n", ":"], "dry_penalty_last_n": 0,
        "xtc_probability": 0.5, "xtc_threshold": 0.15, "sampler_seed": 3,
        "logit_bias": {"5": 150, "6": -3}, "custom_token_bans": "9, 10",
    })
    assert c.specs[0] == {"kind": "logit_bias", "bias": {"5": 100.0, "6": -3.0, "9": -100.0, "10": -100.0}}
    assert c.specs[1] == {"kind": "dry", "multiplier": 0.8, "base": 1.75, "allowed_length": 2,
                          "penalty_last_n": -1, "sequence_breakers": ["\n", ":"]}
    assert c.specs[-1] == {"kind": "xtc", "probability": 0.5, "threshold": 0.15, "seed": 3}
    assert c.unsupported == {}
    no_breakers = from_koboldcpp({"dry_multiplier": 0.8})
    assert no_breakers.specs[0]["sequence_breaker_ids"] == [] and no_breakers.specs[0]["penalty_last_n"] == 320
    assert kinds(from_koboldcpp({"xtc_probability": 0.5, "xtc_threshold": 0.6}))[-1] != "xtc"
    mirostat = from_koboldcpp({"mirostat": 2, "mirostat_tau": 4.0, "rep_pen": 1.1, "xtc_probability": 0.5,
                               "sampler_order": [0, 5]})
    assert mirostat.specs == [
        {"kind": "top_k", "k": 5000},
        {"kind": "repetition_penalty", "penalty": 1.1, "window": 320},
        {"kind": "temperature", "temperature": 0.7},
        {"kind": "mirostat", "version": 2, "tau": 4.0, "eta": 0.1},
    ]
    assert "ignored" in mirostat.unsupported["sampler_order"]


def test_koboldcpp_fields_that_cannot_be_converted_are_listed():
    c = from_koboldcpp({"grammar": "root ::= \"a\"", "ban_eos_token": True, "banned_tokens": ["As an AI"],
                        "foo": 1, "prompt": "hi", "max_length": 80, "mirostat": 3, "logit_bias": {"hello": 2}})
    assert set(c.unsupported) == {"grammar", "ban_eos_token", "banned_tokens", "foo", "mirostat", "logit_bias"}
    assert from_koboldcpp({"grammar": "", "ban_eos_token": False, "banned_tokens": []}).unsupported == {}
    assert "use_default_badwordsids" in from_koboldcpp({"use_default_badwordsids": True}).unsupported
    alias = from_koboldcpp({"repetition_penalty": 1.2, "rep_pen": 1.1, "sampler_order": [6]})
    assert alias.specs[1:] == [{"kind": "repetition_penalty", "penalty": 1.2, "window": 320}]
    assert alias.unsupported == {}


# -- the converted specs are admitted --------------------------------------------------------

WEBUI_PRESETS = [WEBUI_SIMPLE, WEBUI_MIN_P, WEBUI_PRIORITY, WEBUI_DRY_XTC, WEBUI_EVERY,
                 {"do_sample": False, "top_k": 1}]
KOBOLDCPP_PRESETS = [
    {}, {"sampler_order": [6, 0, 1, 3, 4, 2, 5], "rep_pen": 1.1, "rep_pen_slope": 0.7, "presence_penalty": 0.1,
         "top_a": 0.1, "tfs": 0.9, "typical": 0.9, "min_p": 0.05, "dynatemp_range": 0.3, "smoothing_factor": 0.2,
         "xtc_probability": 0.5, "logit_bias": {"5": 2}, "dry_multiplier": 0.8},
    {"mirostat": 1, "temperature": 0.0}, {"dry_multiplier": 0.8, "dry_sequence_breakers": '["\\n", ":"]'},
]


def admit(specs, context=None):
    batch = lp.Batch(context=context) if context is not None else lp.Batch(1000)
    batch.add(0, specs, prompt_len=4)


def has_text_breakers(specs):
    return any(spec.get("sequence_breakers") for spec in specs)


CONVERTED = [(from_webui, p) for p in WEBUI_PRESETS] + [(from_koboldcpp, p) for p in KOBOLDCPP_PRESETS]
WITH_TEXT_BREAKERS = [(f, p) for f, p in CONVERTED if has_text_breakers(f(p).specs)]


@pytest.mark.parametrize("convert, preset", CONVERTED)
def test_the_converted_specs_are_admitted_in_the_sources_order(convert, preset):
    specs = convert(preset).specs
    if has_text_breakers(specs):  # their resolution needs a tokenizer: the next test
        lp.validate_specs(specs, context=lp.EngineContext.structure_only())
    else:
        admit(specs)


@pytest.mark.parametrize("convert, preset", WITH_TEXT_BREAKERS)
def test_dry_text_breakers_are_admitted_with_a_tokenizer(convert, preset, deepseek_hf_tokenizer):
    tok = deepseek_hf_tokenizer
    admit(convert(preset).specs, lp.EngineContext(tok, vocab_size=len(tok)))


# -- a webui preset's chain, as the webui builds and sorts it --------------------------------

webui_defs = pytest.importorskip("test_webui_samplers")
hf = pytest.importorskip("transformers.generation.logits_process")


def webui_dynamic_temperature(scores, low, high, exponent):
    """DynamicTemperatureLogitsWarper.__call__."""
    probs = torch.softmax(scores, dim=-1)
    entropy = -1.0 * torch.where(probs > 0, probs * torch.log(probs), torch.zeros_like(probs)).sum()
    entropy = max(entropy, torch.tensor(1e-10))
    max_entropy = math.log(torch.sum(scores > -float("inf")).item())
    max_entropy = max_entropy if max_entropy > 0.0 else 1e-10
    return scores / (low + (high - low) * (entropy / max_entropy).pow(exponent))


def webui_penalty(kind, value, window):
    """RepetitionPenaltyLogitsProcessorWithRange, PresencePenaltyLogitsProcessor and
    FrequencyPenaltyLogitsProcessor on one row."""
    def apply(ids, scores):
        ids = torch.tensor(ids[-window:] if window > 0 else ids)
        unique, counts = torch.unique(ids, return_counts=True)
        scores = scores.clone()
        if kind == "repetition_penalty":
            score = scores[unique]
            scores[unique] = torch.where(score < 0, score * value, score / value)
        elif kind == "presence_penalty":
            scores.scatter_add_(0, unique, -(counts > 0).to(scores.dtype) * value)
        else:
            scores.scatter_add_(0, unique, -counts.to(scores.dtype) * value)
        return scores
    return apply


def warper(w):
    return lambda ids, scores: w(torch.tensor([ids]), scores[None])[0]


def webui_chain(preset):
    """get_logits_processor_patch's samplers (those these cases use), in the order it builds
    them, sorted by sampler_priority as it sorts them."""
    p = {**WEBUI_DEFAULTS, **preset}
    built = []
    if p["temperature"] != 1.0:
        built.append(("temperature", warper(hf.TemperatureLogitsWarper(float(p["temperature"])))))
    if p["top_k"] != 0:
        built.append(("top_k", warper(hf.TopKLogitsWarper(p["top_k"]))))
    if p["top_p"] < 1.0:
        built.append(("top_p", warper(hf.TopPLogitsWarper(p["top_p"]))))
    built.append(("min_p", warper(hf.MinPLogitsWarper(float(p["min_p"])))))
    if p["typical_p"] < 1.0:
        built.append(("typical_p", warper(hf.TypicalLogitsWarper(p["typical_p"]))))
    if p["epsilon_cutoff"] > 0:
        built.append(("epsilon_cutoff", warper(hf.EpsilonLogitsWarper(p["epsilon_cutoff"] * 1e-4))))
    if p["eta_cutoff"] > 0:
        built.append(("eta_cutoff", warper(hf.EtaLogitsWarper(p["eta_cutoff"] * 1e-4))))
    for kind, off in (("repetition_penalty", 1.0), ("presence_penalty", 0.0), ("frequency_penalty", 0.0)):
        if p[kind] != off:
            built.append((kind, webui_penalty(kind, p[kind], p["repetition_penalty_range"])))
    if 0.0 <= p["tfs"] < 1.0:
        built.append(("tfs", lambda ids, x: webui_defs.webui_tail_free(x, p["tfs"])))
    if 0.0 < p["top_a"] <= 1.0:
        built.append(("top_a", lambda ids, x: webui_defs.webui_top_a(x, p["top_a"])))
    if p["dynamic_temperature"]:
        built.append(("dynamic_temperature", lambda ids, x: webui_dynamic_temperature(
            x, p["dynatemp_low"], p["dynatemp_high"], p["dynatemp_exponent"])))
    if p["smoothing_factor"] > 0:
        built.append(("quadratic_sampling", lambda ids, x: webui_defs.webui_quadratic(
            x, p["smoothing_factor"], p["smoothing_curve"])))
    priority = p["sampler_priority"] or WEBUI_PRIORITY_TEXT
    priority = [x.strip() for x in priority.replace("\n", ",").split(",") if x.strip()]
    if p["temperature_last"]:
        for name in ["temperature", "dynamic_temperature", "quadratic_sampling"]:
            if name in priority:
                priority.append(priority.pop(priority.index(name)))
            else:
                priority.append(name)
    built.sort(key=lambda entry: priority.index(entry[0]) if entry[0] in priority else -1)
    return [fn for _, fn in built]


CHAIN_CASES = [
    {"temperature": 0.7, "top_k": 40, "top_p": 0.9, "repetition_penalty": 1.15, "repetition_penalty_range": 16},
    {"min_p": 0.05, "temperature": 1.5, "temperature_last": True},
    # tfs first: after a truncation the webui's tail-free sampling counts the -inf logits too
    # (see test_webui_samplers.py), which the tail_free kind does not.
    {"sampler_priority": "tfs\ntop_a\ntemperature\ntop_p", "top_a": 0.2, "tfs": 0.95, "top_p": 0.95,
     "temperature": 0.8},
    {"dynamic_temperature": True, "dynatemp_low": 0.5, "dynatemp_high": 1.5, "smoothing_factor": 0.3,
     "smoothing_curve": 1.5, "min_p": 0.02, "temperature_last": True},
    {"epsilon_cutoff": 3, "eta_cutoff": 3, "temperature": 1.2, "typical_p": 0.9, "presence_penalty": 0.3, "frequency_penalty": 0.2,
     "repetition_penalty_range": 0},
]


@pytest.mark.parametrize("preset", CHAIN_CASES, ids=[json.dumps(c) for c in CHAIN_CASES])
def test_the_converted_chain_keeps_what_the_webuis_chain_keeps(preset):
    g = torch.Generator().manual_seed(5)
    specs = from_webui(preset).specs
    for scale in (0.5, 1.0, 3.0, 8.0):
        row = torch.randn(4000, generator=g) * scale
        likely = torch.argsort(row, descending=True)[:40]  # the penalties hit likely tokens
        ids = likely[torch.randint(0, 40, (40,), generator=g)].tolist()
        ids += ids[-5:]  # a repetition
        want = row.clone()
        for step in webui_chain(preset):
            want = step(ids, want)
        got = row.clone()
        Processor(specs, prompt_len=0)(ids, got)
        # torch's f32 sums against ours: at most a token at a cut.
        assert (got.isfinite() != want.isfinite()).sum() <= 1, scale
        both = got.isfinite() & want.isfinite()
        np.testing.assert_allclose(softmax(got[both].numpy()), softmax(want[both].numpy()), atol=1e-5)


# -- a KoboldCpp request's chain, as SampleLogits runs it -------------------------------------

def kcpp_chain(params, ids, row):
    """gpttype_adapter.cpp's SampleLogits for the samplers these cases use (sample_rep_pen's two
    halves of a zero-filled window, sample_top_k, sample_top_p then sample_min_p,
    sample_temperature with its smoothing, sample_entropy), on an f32 row, -inf for a token no
    longer a candidate. The rows are shorter than the top-k 5000 prefilter."""
    p = {**KOBOLDCPP_DEFAULTS, **params}
    x = row.astype(np.float32).copy()

    def probs():
        return softmax(x)

    for sampler in p["sampler_order"]:
        if sampler == 6:
            n = p["rep_pen_range"]
            last = ([0] * n + list(ids))[-n:]
            near = {t for i, t in enumerate(last) if 2 * i >= n}
            far = {t for i, t in enumerate(last) if 2 * i < n}
            rep = np.float32(p["rep_pen"])
            reduced = np.float32(1 + (p["rep_pen"] - 1) * p["rep_pen_slope"]) if rep > 1 else rep
            for t in near | far:
                penalty = rep if t in near else reduced
                x[t] = x[t] * penalty if x[t] <= 0 else x[t] / penalty
                x[t] -= np.float32(p["presence_penalty"])
        elif sampler == 0 and p["top_k"] > 0:
            x[np.argsort(-x, kind="stable")[p["top_k"]:]] = -np.inf
        elif sampler == 2:
            if p["top_p"] < 1:
                order = np.argsort(-x, kind="stable")
                cum = np.cumsum(probs()[order], dtype=np.float32)
                x[order[int(np.argmax(cum >= p["top_p"])) + 1:]] = -np.inf
            if p["min_p"] > 0:
                x[x < x.max() + np.float32(math.log(p["min_p"]))] = -np.inf
        elif sampler == 5:
            finite = np.isfinite(x)
            if p["dynatemp_range"] > 0:
                pr = probs()[finite]
                entropy = -np.sum(pr[pr > 0] * np.log(pr[pr > 0]), dtype=np.float32)
                lo = max(p["temperature"] - p["dynatemp_range"], 0.0)
                hi = p["temperature"] + p["dynatemp_range"]
                x[finite] /= np.float32(lo + (hi - lo) * (entropy / math.log(finite.sum())) ** p["dynatemp_exponent"])
            else:
                x[finite] /= np.float32(p["temperature"])
            if p["smoothing_factor"] > 0:
                h = x.max()
                x[finite] = -np.float32(p["smoothing_factor"]) * (x[finite] - h) ** 2 + h
    return x


KCPP_CASES = [
    {"rep_pen": 1.2, "rep_pen_range": 64, "rep_pen_slope": 0.5, "top_k": 50, "top_p": 0.9, "min_p": 0.02,
     "temperature": 0.8, "sampler_order": [6, 0, 2, 5]},
    {"sampler_order": [6, 5, 2, 0], "temperature": 1.5, "min_p": 0.05, "top_p": 0.95, "top_k": 300,
     "rep_pen": 1.1, "presence_penalty": 0.5, "rep_pen_range": 32},
    {"temperature": 1.0, "smoothing_factor": 0.3, "top_p": 0.9, "sampler_order": [5, 2]},
    {"temperature": 1.0, "dynatemp_range": 0.4, "top_k": 200, "top_p": 1.0, "sampler_order": [0, 5, 2]},
]


@pytest.mark.parametrize("params", KCPP_CASES, ids=[json.dumps(c) for c in KCPP_CASES])
def test_the_converted_chain_keeps_what_koboldcpps_chain_keeps(params):
    rng = np.random.default_rng(11)
    specs = from_koboldcpp(params).specs
    for scale in (0.5, 1.0, 3.0, 8.0):
        row = rng.normal(0, scale, 4000).astype(np.float32)
        # Among the likely tokens, and longer than the window (no zero-filled part).
        ids = rng.choice(np.argsort(-row)[:300], 200).tolist()
        want = kcpp_chain(params, ids, row)
        got = torch.tensor(row)
        Processor(specs, prompt_len=0)(ids, got)
        got = got.numpy()
        assert (np.isfinite(got) != np.isfinite(want)).sum() <= 1, scale
        both = np.isfinite(got) & np.isfinite(want)
        np.testing.assert_allclose(softmax(np.where(both, got, -np.inf)), softmax(np.where(both, want, -np.inf)),
                                   atol=1e-5)


# -- llama.cpp's own chain through its library ---------------------------------------------------

llama = pytest.importorskip("test_llamacpp_samplers")
needs_llama = pytest.mark.skipif(llama.LIB_PATH is None, reason="libllama.so is not built (scripts/llamacpp.sh)")

CASES = [
    {},
    {"top_k": 0, "top_p": 0.8, "min_p": 0.02, "temperature": 1.3},
    {"typical_p": 0.9, "top_k": 100, "top_p": 1.0},
    {"top_n_sigma": 1.5, "top_k": 0, "min_p": 0.0, "samplers": "skpmt"},
    {"temperature": 0.7, "dynatemp_range": 0.4, "top_k": 60, "min_keep": 3},
    {"samplers": ["min_p", "temperature", "top_k"], "min_p": 0.1, "temperature": 0.5, "top_k": 8},
]


def llama_chain(params, row):
    """llama.cpp's samplers built as common_sampler_init builds them (without the final dist),
    applied in turn to the finite entries of `row`."""
    lib = llama.lib()
    p = {**LLAMACPP_DEFAULTS, **params}
    names = _llamacpp_order(params.get("samplers"), Conversion())
    make = {
        "top_k": lambda: lib.llama_sampler_init_top_k(int(p["top_k"])),
        "top_p": lambda: lib.llama_sampler_init_top_p(float(p["top_p"]), int(p["min_keep"])),
        "min_p": lambda: lib.llama_sampler_init_min_p(float(p["min_p"]), int(p["min_keep"])),
        "typ_p": lambda: lib.llama_sampler_init_typical(float(p["typical_p"]), int(p["min_keep"])),
        "top_n_sigma": lambda: lib.llama_sampler_init_top_n_sigma(float(p["top_n_sigma"])),
        "temperature": lambda: lib.llama_sampler_init_temp_ext(
            float(p["temperature"]), float(p["dynatemp_range"]), float(p["dynatemp_exponent"])),
    }
    out = row.copy()
    for name in names:
        if name in ("penalties", "dry", "xtc"):
            continue  # off in these cases
        candidates = np.flatnonzero(np.isfinite(out))
        out = llama.llama_apply(make[name](), out, candidates=candidates)
    return out


def softmax(row):
    finite = np.isfinite(row)
    e = np.zeros_like(row, dtype=np.float64)
    m = row[finite].max()
    e[finite] = np.exp(row[finite].astype(np.float64) - m)
    return e / e.sum()


@needs_llama
@pytest.mark.parametrize("params", CASES, ids=[json.dumps(c) for c in CASES])
def test_the_converted_chain_keeps_what_llama_cpps_chain_keeps(params):
    rng = np.random.default_rng(3)
    specs = from_llamacpp(params).specs
    compared = 0
    for scale in (0.5, 1.0, 3.0, 8.0):
        row = (rng.normal(0, scale, 4000)).astype(np.float32)
        want = llama_chain(params, row)
        got = torch.tensor(row)
        Processor(specs, prompt_len=0)([1], got)
        got = got.numpy()
        assert np.array_equal(np.isfinite(got), np.isfinite(want)), scale
        np.testing.assert_allclose(softmax(got), softmax(want), atol=1e-5)
        compared += 1
    assert compared == 4
