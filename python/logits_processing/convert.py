"""Spec lists from the sampling settings users already have, in the source system's order.

Each ``from_*`` function takes the source's settings (a mapping, as its JSON or YAML holds them)
and returns a :class:`Conversion`: the specs, in the order the source applies its samplers, and
every field it could not carry, with the reason (``unsupported``); a field is never dropped in
silence. Samplers at their "off" values are left out (the source treats them as no-ops). The
``logits-processing convert`` command runs them on a file.

>>> from logits_processing.convert import from_llamacpp
>>> c = from_llamacpp({"temperature": 0.7, "top_k": 20, "top_p": 0.9, "min_p": 0.0})
>>> [s["kind"] for s in c.specs]
['top_k', 'top_p', 'temperature']
>>> c.unsupported
{}

Where a conversion differs from the source on purpose:

- llama.cpp's temperature ``<= 0`` (greedy) becomes ``top_k`` 1, which keeps every token tied at
  the maximum where llama.cpp keeps the first;
- llama.cpp applies its three penalties in one expression (``x / repeat - (count * freq +
  present)``); here they are three kinds in that order, which can round the last bit differently.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping

__all__ = ["Conversion", "from_llamacpp", "from_vllm", "from_openai", "SOURCES"]


@dataclass
class Conversion:
    """The specs converted from a source's settings, and the fields that could not be.

    >>> from logits_processing.convert import Conversion
    >>> Conversion([{"kind": "top_k", "k": 5}], {"tfs_z": "no kind"}).as_json()["unsupported"]
    {'tfs_z': 'no kind'}
    """

    specs: List[Dict[str, Any]] = field(default_factory=list)
    unsupported: Dict[str, str] = field(default_factory=dict)

    def as_json(self) -> Dict[str, Any]:
        return {"specs": self.specs, "unsupported": self.unsupported}


# -- llama.cpp's server (tools/server: its /completion parameters and `samplers`) ---------------

# common/common.h's default order of common_params_sampling::samplers.
LLAMACPP_ORDER = ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"]
# common_params_sampling's defaults.
LLAMACPP_DEFAULTS: Dict[str, Any] = {
    "temperature": 0.8,
    "dynatemp_range": 0.0,
    "dynatemp_exponent": 1.0,
    "top_k": 40,
    "top_p": 0.95,
    "min_p": 0.05,
    "typical_p": 1.0,
    "xtc_probability": 0.0,
    "xtc_threshold": 0.1,
    "top_n_sigma": -1.0,
    "repeat_last_n": 64,
    "repeat_penalty": 1.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "dry_multiplier": 0.0,
    "dry_base": 1.75,
    "dry_allowed_length": 2,
    "dry_penalty_last_n": 64,
    "dry_sequence_breakers": ["\n", ":", '"', "*"],
    "mirostat": 0,
    "mirostat_tau": 5.0,
    "mirostat_eta": 0.1,
    "adaptive_target": -1.0,
    "adaptive_decay": 0.9,
    "seed": 0xFFFFFFFF,
    "min_keep": 0,
}
# common_sampler_types_from_names: canonical names, their kebab-case and no-dash forms, aliases.
_LLAMACPP_NAMES = {
    "dry": "dry",
    "top_k": "top_k",
    "top_p": "top_p",
    "nucleus": "top_p",
    "top_n_sigma": "top_n_sigma",
    "typ_p": "typ_p",
    "typ": "typ_p",
    "min_p": "min_p",
    "temperature": "temperature",
    "temp": "temperature",
    "xtc": "xtc",
    "infill": "infill",
    "penalties": "penalties",
    "adaptive_p": "adaptive_p",
}
for _name, _canonical in list(_LLAMACPP_NAMES.items()):
    if "_" in _name:
        _LLAMACPP_NAMES[_name.replace("_", "-")] = _canonical
        _LLAMACPP_NAMES[_name.replace("_", "")] = _canonical
# common_sampler_types_from_chars.
_LLAMACPP_CHARS = {
    "d": "dry",
    "k": "top_k",
    "y": "typ_p",
    "p": "top_p",
    "s": "top_n_sigma",
    "m": "min_p",
    "t": "temperature",
    "x": "xtc",
    "i": "infill",
    "e": "penalties",
    "a": "adaptive_p",
}
# Fields that do not change which logits a request keeps, or that the engine handles around us.
_LLAMACPP_NOT_SAMPLING = {
    "prompt", "n_predict", "stream", "stop", "cache_prompt", "n_probs", "ignore_eos", "n_keep",
    "id_slot", "return_tokens", "post_sampling_probs", "timings_per_token", "n_indent", "n_cmpl",
    "t_max_predict_ms", "t_max_prompt_ms", "response_fields", "lora", "backend_sampling",
    "return_progress", "n_discard", "n_cache_reuse", "samplers", "model", "messages",
}


def _llamacpp_order(samplers: Any, out: Conversion) -> List[str]:
    if samplers is None:
        return list(LLAMACPP_ORDER)
    if isinstance(samplers, str):
        names = [_LLAMACPP_CHARS.get(c) for c in samplers]
        unknown = [c for c, n in zip(samplers, names) if n is None]
    else:
        names = [_LLAMACPP_NAMES.get(str(n).lower()) for n in samplers]
        unknown = [str(n) for n, c in zip(samplers, names) if c is None]
    if unknown:
        out.unsupported["samplers"] = f"unknown sampler names {unknown} (llama.cpp skips them too)"
    return [n for n in names if n is not None]


def from_llamacpp(params: Mapping[str, Any]) -> Conversion:
    """llama.cpp server's sampling parameters (a ``/completion`` request body, or the same names
    from its command line), in its sampler order (``samplers``: names, or a string of its
    one-letter codes such as ``"edskypmxt"``; default its own order). Unset fields take llama.cpp's
    defaults, so ``{}`` gives its default chain: top-k 40, top-p 0.95, min-p 0.05, temperature
    0.8. With ``mirostat`` 1 or 2 the chain is llama.cpp's: temperature, then mirostat.

    >>> from logits_processing.convert import from_llamacpp
    >>> [s["kind"] for s in from_llamacpp({"samplers": "kt", "top_k": 8, "temperature": 0.5}).specs]
    ['top_k', 'temperature']
    >>> from_llamacpp({"mirostat": 2}).specs[-1]
    {'kind': 'mirostat', 'version': 2, 'tau': 5.0, 'eta': 0.1}
    """
    out = Conversion()
    p = {**LLAMACPP_DEFAULTS, **{k: v for k, v in params.items() if v is not None}}
    min_keep = max(int(p["min_keep"]), 1)
    keep = {} if min_keep == 1 else {"min_tokens_to_keep": min_keep}
    seed = int(p["seed"]) & 0xFFFFFFFF

    def temperature(plain: bool) -> List[Dict[str, Any]]:
        t = float(p["temperature"])
        if t <= 0:
            return [{"kind": "top_k", "k": 1}]
        if not plain and float(p["dynatemp_range"]) > 0:
            return [{
                "kind": "dynamic_temperature",
                "temperature": t,
                "range": float(p["dynatemp_range"]),
                "exponent": float(p["dynatemp_exponent"]),
            }]
        return [] if t == 1.0 else [{"kind": "temperature", "temperature": t}]

    def penalties() -> List[Dict[str, Any]]:
        last_n = int(p["repeat_last_n"])
        if last_n == 0:
            return []
        window = {} if last_n < 0 else {"window": last_n}
        specs = []
        if float(p["repeat_penalty"]) != 1.0:
            specs.append({"kind": "repetition_penalty", "penalty": float(p["repeat_penalty"]), **window})
        if float(p["frequency_penalty"]) != 0.0:
            specs.append({"kind": "frequency_penalty", "penalty": float(p["frequency_penalty"]), **window})
        if float(p["presence_penalty"]) != 0.0:
            specs.append({"kind": "presence_penalty", "penalty": float(p["presence_penalty"]), **window})
        return specs

    def sampler(name: str) -> List[Dict[str, Any]]:
        if name == "penalties":
            return penalties()
        if name == "dry":
            if float(p["dry_multiplier"]) == 0.0 or int(p["dry_penalty_last_n"]) == 0:
                return []
            return [{
                "kind": "dry",
                "multiplier": float(p["dry_multiplier"]),
                "base": float(p["dry_base"]),
                "allowed_length": int(p["dry_allowed_length"]),
                "penalty_last_n": int(p["dry_penalty_last_n"]),
                "sequence_breakers": list(p["dry_sequence_breakers"]),
            }]
        if name == "top_n_sigma":
            n = float(p["top_n_sigma"])
            return [{"kind": "top_n_sigma", "n": n}] if n > 0 else []
        if name == "top_k":
            k = int(p["top_k"])
            return [{"kind": "top_k", "k": k}] if k > 0 else []  # llama.cpp's has no min_keep
        if name == "typ_p":
            mass = float(p["typical_p"])
            return [{"kind": "typical_p", "mass": mass, **keep}] if mass < 1.0 else []
        if name == "top_p":
            top_p = float(p["top_p"])
            return [{"kind": "top_p", "p": top_p, **keep}] if top_p < 1.0 else []
        if name == "min_p":
            min_p = float(p["min_p"])
            return [{"kind": "min_p", "p": min_p, **keep}] if min_p > 0.0 else []
        if name == "xtc":
            probability, threshold = float(p["xtc_probability"]), float(p["xtc_threshold"])
            if probability <= 0.0 or threshold > 0.5:
                return []
            return [{"kind": "xtc", "probability": probability, "threshold": threshold,
                     "min_keep": min_keep, "seed": seed}]
        if name == "temperature":
            return temperature(plain=False)
        if name == "adaptive_p":
            target = float(p["adaptive_target"])
            if target < 0:
                return []
            return [{"kind": "adaptive_p", "target": target, "decay": float(p["adaptive_decay"])}]
        out.unsupported.setdefault("samplers", f"{name}: no kind does what llama.cpp's {name} sampler does")
        return []

    bias = params.get("logit_bias")
    if bias:
        out.specs.extend(_llamacpp_bias(bias, out))
    mirostat = int(p["mirostat"])
    if mirostat in (1, 2):
        out.specs.extend(temperature(plain=True))
        spec = {"kind": "mirostat", "version": mirostat, "tau": float(p["mirostat_tau"]),
                "eta": float(p["mirostat_eta"])}
        out.specs.append(spec)
        if params.get("samplers") is not None:
            out.unsupported["samplers"] = "ignored with mirostat on (llama.cpp ignores it too)"
    else:
        if mirostat != 0:
            out.unsupported["mirostat"] = f"{mirostat}: llama.cpp knows 0, 1 and 2"
        for name in _llamacpp_order(params.get("samplers"), out):
            out.specs.extend(sampler(name))
    for key in params:
        if key in LLAMACPP_DEFAULTS or key in _LLAMACPP_NOT_SAMPLING or key == "logit_bias":
            continue
        out.unsupported.setdefault(key, _LLAMACPP_WHY.get(key, "not a llama.cpp sampling field we know"))
    return out


_LLAMACPP_WHY = {
    "grammar": "a GBNF grammar: give a grammar spec (regex, Lark or JSON schema) instead",
    "json_schema": "give {'kind': 'grammar', 'json_schema': ...} (llama.cpp turns it into GBNF)",
    "grammar_lazy": "lazy grammars are not a kind yet",
    "grammar_triggers": "lazy grammars are not a kind yet",
    "reasoning_budget_tokens": "give a thinking_budget spec with the model's thinking tokens",
    "reasoning_budget_message": "a budget message is not part of thinking_budget yet",
}


def _llamacpp_bias(bias: Any, out: Conversion) -> List[Dict[str, Any]]:
    """llama.cpp's ``logit_bias``: ``[[id, bias], ...]`` or ``{"id": bias}``, a bias of ``false``
    (or ``-inf``) banning the token. Text keys need the tokenizer and are listed as unsupported."""
    pairs = bias.items() if isinstance(bias, Mapping) else bias
    biases: Dict[str, float] = {}
    banned: List[int] = []
    for pair in pairs:
        token, value = pair
        if not isinstance(token, int) and not str(token).isdigit():
            out.unsupported["logit_bias"] = "text keys need the tokenizer: give token ids"
            continue
        if value is False or value == float("-inf"):
            banned.append(int(token))
        else:
            biases[str(int(token))] = float(value)
    specs: List[Dict[str, Any]] = []
    if biases:
        specs.append({"kind": "logit_bias", "bias": biases})
    if banned:
        specs.append({"kind": "ban_tokens", "token_ids": banned})
    return specs


# -- vLLM's SamplingParams, and an OpenAI-style request body ------------------------------------

# vLLM's sampler: penalties (repetition, frequency, presence) on the logits, then temperature,
# then min-p, top-k and top-p (vllm/v1/sample/sampler.py).
_VLLM_FIELDS = {
    "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "frequency_penalty",
    "presence_penalty", "logit_bias", "allowed_token_ids", "bad_words", "min_tokens",
}
_VLLM_NOT_SAMPLING = {
    "n", "best_of", "seed", "stop", "stop_token_ids", "ignore_eos", "max_tokens", "logprobs",
    "prompt_logprobs", "detokenize", "skip_special_tokens", "spaces_between_special_tokens",
    "include_stop_str_in_output", "output_kind", "extra_args", "truncate_prompt_tokens",
    "guided_decoding", "structured_outputs", "logits_processors", "model", "prompt", "messages",
    "stream", "stream_options", "user", "max_completion_tokens",
}


def from_vllm(params: Any) -> Conversion:
    """vLLM's ``SamplingParams`` (the object, or a mapping of its fields), in the order vLLM's
    sampler applies them: penalties, temperature, min-p, top-k, top-p. vLLM's penalties count
    the output tokens only (repetition also the prompt's), as the specs' ``scope`` says.

    >>> from logits_processing.convert import from_vllm
    >>> [s["kind"] for s in from_vllm({"temperature": 0.7, "top_p": 0.9, "presence_penalty": 0.5}).specs]
    ['presence_penalty', 'temperature', 'top_p']
    """
    fields = params if isinstance(params, Mapping) else {
        name: getattr(params, name) for name in dir(params) if not name.startswith("_")
        and not callable(getattr(params, name, None))
    }
    out = Conversion()
    get = fields.get
    if get("repetition_penalty") not in (None, 1.0):
        out.specs.append({"kind": "repetition_penalty", "penalty": float(get("repetition_penalty"))})
    for name in ("frequency_penalty", "presence_penalty"):
        if get(name) not in (None, 0.0):
            out.specs.append({"kind": name, "penalty": float(get(name))})
    if get("logit_bias"):
        out.specs.extend(_llamacpp_bias(get("logit_bias"), out))
    if get("allowed_token_ids"):
        out.specs.append({"kind": "allowed_token_ids", "token_ids": [int(t) for t in get("allowed_token_ids")]})
    if get("min_tokens"):
        out.unsupported["min_tokens"] = "needs the EOS ids: give a min_new_tokens spec with them"
    if get("bad_words"):
        out.unsupported["bad_words"] = "text: give ban_strings (or bad_words with token ids)"
    temperature = get("temperature")
    greedy = temperature is not None and float(temperature) < 1e-5  # vLLM's _SAMPLING_EPS
    if greedy:
        out.specs.append({"kind": "top_k", "k": 1})
    else:
        if temperature not in (None, 1.0):
            out.specs.append({"kind": "temperature", "temperature": float(temperature)})
        if get("min_p") not in (None, 0.0):
            out.specs.append({"kind": "min_p", "p": float(get("min_p"))})
        if get("top_k") not in (None, 0, -1):
            out.specs.append({"kind": "top_k", "k": int(get("top_k"))})
        if get("top_p") not in (None, 1.0):
            out.specs.append({"kind": "top_p", "p": float(get("top_p"))})
    if isinstance(params, Mapping):
        for key in params:
            if key not in _VLLM_FIELDS and key not in _VLLM_NOT_SAMPLING:
                out.unsupported.setdefault(key, "not a vLLM sampling field we know")
    return out


def from_openai(body: Mapping[str, Any]) -> Conversion:
    """An OpenAI-style request body (``/v1/chat/completions`` or ``/v1/completions``):
    ``temperature``, ``top_p``, ``frequency_penalty``, ``presence_penalty``, ``logit_bias``, and
    the extensions vLLM's server accepts beside them (``top_k``, ``min_p``,
    ``repetition_penalty``), applied as vLLM applies them. ``response_format`` with a JSON schema
    becomes a grammar spec.

    >>> from logits_processing.convert import from_openai
    >>> from_openai({"temperature": 0.2, "response_format": {"type": "json_object"}}).specs
    [{'kind': 'temperature', 'temperature': 0.2}, {'kind': 'json_object'}]
    """
    out = from_vllm({k: v for k, v in body.items() if k != "response_format"})
    response = body.get("response_format")
    if isinstance(response, Mapping):
        kind = response.get("type")
        if kind == "json_schema" and isinstance(response.get("json_schema"), Mapping):
            out.specs.append({"kind": "grammar", "json_schema": response["json_schema"].get("schema", {})})
        elif kind == "json_object":
            out.specs.append({"kind": "json_object"})
        elif kind not in (None, "text"):
            out.unsupported["response_format"] = f"type {kind!r}"
    return out


SOURCES = {"llamacpp": from_llamacpp, "vllm": from_vllm, "openai": from_openai}
