"""Converters from the settings users have (logits_processing.convert): llama.cpp's server
parameters (its default chain, its sampler order by names and by letters, every sampler it adds),
vLLM's SamplingParams and an OpenAI-style body; unconvertible fields listed, never dropped; and
llama.cpp's own chain through its library on random rows keeping the tokens our specs keep, with
its probabilities."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import logits_processing as lp
from logits_processing import Processor, cli
from logits_processing.convert import (
    LLAMACPP_DEFAULTS,
    Conversion,
    _llamacpp_order,
    from_llamacpp,
    from_openai,
    from_vllm,
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


def test_the_convert_command(tmp_path, capsys):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"top_k": 20, "temperature": 0.6}))
    assert cli.main(["convert", str(path), "--from", "llamacpp"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [s["kind"] for s in out["specs"]] == ["top_k", "top_p", "min_p", "temperature"]
    assert cli.main(["convert", '{"grammar": "x"}', "--from", "llamacpp"]) == 1
    assert "grammar" in json.loads(capsys.readouterr().out)["unsupported"]
    assert cli.main(["convert", "[1]", "--from", "llamacpp"]) == 2


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
