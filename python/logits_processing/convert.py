"""Spec lists from the sampling settings users already have, in the source system's order.

Each ``from_*`` function takes the source's settings (a mapping, as its JSON or YAML holds them)
and returns a :class:`Conversion`: the specs, in the order the source applies its samplers, and
every field it could not carry, with the reason (``unsupported``); a field is never dropped in
silence. Samplers at their "off" values are left out (the source treats them as no-ops). The
``logits-processing convert`` command runs them on a file.

>>> from logits_processing.convert import from_llamacpp, from_webui
>>> c = from_llamacpp({"temperature": 0.7, "top_k": 20, "top_p": 0.9, "min_p": 0.0})
>>> [s["kind"] for s in c.specs]
['top_k', 'top_p', 'temperature']
>>> c.unsupported
{}
>>> [s["kind"] for s in from_webui({"min_p": 0.02, "xtc_probability": 0.5}).specs]
['min_p', 'xtc']

Where a conversion differs from the source on purpose:

- llama.cpp's temperature ``<= 0`` (greedy) becomes ``top_k`` 1, which keeps every token tied at
  the maximum where llama.cpp keeps the first;
- llama.cpp applies its three penalties in one expression (``x / repeat - (count * freq +
  present)``); here they are three kinds in that order, which can round the last bit differently.

text-generation-webui (:func:`from_webui`), as its Transformers loader's samplers define a preset
(modules/sampler_hijack.py; its llama.cpp and ExLlama loaders map a preset onto their own):

- the webui's presence and frequency penalties count the prompt's ids too; the kinds count the
  generated ids (in the same window);
- ``dry`` is llama.cpp's DRY: its text breakers are resolved through the tokenizer as llama.cpp
  does (the webui takes the last token of each ``"a" + text``), and a match is not capped at 50;
- ``xtc`` does not skip the steps where the webui's would remove the newline or EOS token, and
  draws from its own generator;
- ``top_n_sigma``'s deviation is the population one over the finite logits; the webui's is
  torch's ``std`` (``N - 1``) over the whole row, ``-inf`` counted as 0;
- ``dynatemp_low`` and ``dynatemp_high`` become ``dynamic_temperature``'s ``temperature``
  (their mean) and ``range`` (half their gap): the same temperature in exact arithmetic;
- temperature 0 is greedy, as the webui's API makes it, and greedy is ``top_k`` 1, which keeps
  every token tied at the maximum where argmax keeps the first;
- mirostat and adaptive-p: the webui samples inside the sampler and masks every other token;
  the kinds leave the sampling to the engine;
- ``encoder_repetition_penalty`` is a ``repetition_penalty`` of ``1 / penalty`` over the prompt
  (transformers divides by its inverse), which can round the last bit differently;
- ``tail_free`` after a truncation: the webui's tail-free counts the tokens earlier samplers
  removed (their ``-inf`` as probability 0) in its curvature, the kind only the tokens left, so
  with tfs after top-k, top-p or typical (the webui's default order) the two can keep a different
  number of tokens.

KoboldCpp (:func:`from_koboldcpp`):

- its tail-free sampling (llama.cpp's former one) keeps one token fewer at the cut than
  ``tail_free`` (the webui's definition), and every token when the cut is not reached;
- ``rep_pen_slope`` becomes two windowed repetition penalties (the older half's penalty over the
  window, the rest of ``rep_pen`` over its newer half): the same factors in exact arithmetic;
  KoboldCpp's window starts filled with id 0, which it penalizes until the history fills it;
- its presence penalty counts the window's prompt ids too; the kind counts the generated ids;
- XTC lowers the removed tokens by 999 there, to ``-inf`` here;
- its mirostat ``mu`` is one value shared by every request; here each request has its own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence

__all__ = ["Conversion", "from_llamacpp", "from_webui", "from_koboldcpp", "from_vllm", "from_openai", "SOURCES"]


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


# -- text-generation-webui (modules/presets.py, modules/sampler_hijack.py) ---------------------

# presets.py's default_preset_values: what a preset does not set.
WEBUI_DEFAULTS: Dict[str, Any] = {
    "temperature": 1.0,
    "dynatemp_low": 1.0,
    "dynatemp_high": 1.0,
    "dynatemp_exponent": 1.0,
    "smoothing_factor": 0.0,
    "smoothing_curve": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "top_n_sigma": 0.0,
    "typical_p": 1.0,
    "xtc_threshold": 0.1,
    "xtc_probability": 0.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "tfs": 1.0,
    "top_a": 0.0,
    "adaptive_target": 0.0,
    "adaptive_decay": 0.9,
    "dry_multiplier": 0.0,
    "dry_allowed_length": 2,
    "dry_base": 1.75,
    "repetition_penalty": 1.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "encoder_repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "repetition_penalty_range": 1024,
    "penalty_alpha": 0.0,
    "guidance_scale": 1.0,
    "mirostat_mode": 0,
    "mirostat_tau": 5.0,
    "mirostat_eta": 0.1,
    "do_sample": True,
    "dynamic_temperature": False,
    "temperature_last": False,
    "sampler_priority": None,
    "dry_sequence_breakers": '"\\n", ":", "\\"", "*"',
}
# presets.py's default sampler_priority.
WEBUI_ORDER = [
    "repetition_penalty", "presence_penalty", "frequency_penalty", "dry", "top_n_sigma", "temperature",
    "dynamic_temperature", "quadratic_sampling", "top_k", "top_p", "typical_p", "epsilon_cutoff",
    "eta_cutoff", "tfs", "top_a", "min_p", "adaptive_p", "mirostat", "xtc", "encoder_repetition_penalty",
    "no_repeat_ngram",
]
# The order get_logits_processor_patch builds the samplers in (transformers' own, then DRY, then the
# webui's): its sort puts those sampler_priority does not name first, in this order.
_WEBUI_BUILT = [
    "encoder_repetition_penalty", "no_repeat_ngram", "temperature", "top_k", "top_p", "min_p",
    "typical_p", "epsilon_cutoff", "eta_cutoff", "dry", "repetition_penalty", "presence_penalty",
    "frequency_penalty", "tfs", "top_a", "top_n_sigma", "adaptive_p", "xtc", "dynamic_temperature",
    "quadratic_sampling", "mirostat",
]
# transformers' warpers: only when sampling (do_sample), the webui's own always.
_WEBUI_WARPERS = {"temperature", "top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff"}
_WEBUI_NOT_SAMPLING = {
    "max_new_tokens", "auto_max_new_tokens", "max_tokens_second", "max_updates_second", "seed",
    "prompt_lookup_num_tokens", "add_bos_token", "skip_special_tokens", "stream", "truncation_length",
    "custom_stopping_strings", "stopping_strings", "static_cache", "negative_prompt", "sampler_priority",
    "temperature_last", "do_sample", "preset",
}
# Fields we cannot carry, with their "off" value and why.
_WEBUI_WHY = {
    "grammar_string": ("", "a GBNF grammar: give a grammar spec (regex, Lark or JSON schema) instead"),
    "ban_eos_token": (False, "needs the EOS id: give ban_tokens with it"),
    "num_beams": (1, "beam search is a decoding method, not a logits edit"),
}


def _webui_order(p: Mapping[str, Any], out: Conversion) -> List[str]:
    priority = p.get("sampler_priority")
    if isinstance(priority, str):
        names = [n.strip() for n in priority.replace("\n", ",").split(",") if n.strip()]
    else:
        names = [str(n) for n in priority or []]
    names = names or list(WEBUI_ORDER)
    if p["temperature_last"]:
        for name in ("temperature", "dynamic_temperature", "quadratic_sampling"):
            if name in names:
                names.remove(name)
            names.append(name)
    unknown = [n for n in names if n not in _WEBUI_BUILT]
    if unknown:
        out.unsupported["sampler_priority"] = f"unknown sampler names {unknown} (the webui skips them too)"
    listed = list(dict.fromkeys(n for n in names if n in _WEBUI_BUILT))
    return [n for n in _WEBUI_BUILT if n not in listed] + listed


def _webui_breakers(value: Any) -> List[str]:
    if isinstance(value, str):
        return list(json.loads(value if value.startswith("[") else f"[{value}]"))
    return [str(v) for v in value]


def from_webui(preset: Mapping[str, Any]) -> Conversion:
    """text-generation-webui's generation parameters (a preset, as its YAML holds them), in the
    order its samplers run: ``sampler_priority`` (a list, or names one a line or comma-separated;
    default the webui's own), with ``temperature_last`` moving temperature, dynamic temperature
    and quadratic sampling to the end, as the webui does. Unset fields take the webui's defaults,
    at which every sampler is off, so ``{}`` gives ``[]``. ``do_sample`` false (or temperature 0)
    is greedy: transformers' warpers (temperature, top-k, top-p, min-p, typical-p, epsilon and
    eta) drop out, the webui's own samplers stay, and ``top_k`` 1 ends the chain.

    >>> from logits_processing.convert import from_webui
    >>> c = from_webui({"temperature": 0.7, "min_p": 0.05, "repetition_penalty": 1.15})
    >>> [s["kind"] for s in c.specs]
    ['repetition_penalty', 'temperature', 'min_p']
    >>> [s["kind"] for s in from_webui({"temperature": 0.7, "min_p": 0.05, "temperature_last": True}).specs]
    ['min_p', 'temperature']
    """
    out = Conversion()
    p = {**WEBUI_DEFAULTS, **{k: v for k, v in preset.items() if v is not None}}
    rep_range = int(p["repetition_penalty_range"])
    window = {"window": rep_range} if rep_range > 0 else {}
    temperature = float(p["temperature"])
    greedy = not p["do_sample"] or temperature == 0.0
    seed = preset.get("seed")
    seeded = {"seed": int(seed) & 0xFFFFFFFF} if isinstance(seed, int) and seed >= 0 else {}

    def refuse(key: str, why: str) -> List[Dict[str, Any]]:
        out.unsupported[key] = why
        return []

    def sampler(name: str) -> List[Dict[str, Any]]:
        if name == "repetition_penalty":
            penalty = float(p["repetition_penalty"])
            if penalty <= 0:
                return refuse(name, f"{penalty}: the webui needs a positive penalty")
            return [] if penalty == 1.0 else [{"kind": name, "penalty": penalty, **window}]
        if name in ("presence_penalty", "frequency_penalty"):
            penalty = float(p[name])
            return [] if penalty == 0.0 else [{"kind": name, "penalty": penalty, **window}]
        if name == "dry":
            if float(p["dry_multiplier"]) <= 0.0:
                return []
            return [{
                "kind": "dry",
                "multiplier": float(p["dry_multiplier"]),
                "base": float(p["dry_base"]),
                "allowed_length": int(p["dry_allowed_length"]),
                "penalty_last_n": rep_range if rep_range > 0 else -1,
                "sequence_breakers": _webui_breakers(p["dry_sequence_breakers"]),
            }]
        if name == "top_n_sigma":
            n = float(p["top_n_sigma"])
            return [{"kind": "top_n_sigma", "n": n}] if n > 0 else []
        if name == "temperature":
            if temperature < 0:
                return refuse(name, f"{temperature}: transformers needs a positive temperature")
            return [] if temperature == 1.0 else [{"kind": "temperature", "temperature": temperature}]
        if name == "dynamic_temperature":
            if not p["dynamic_temperature"]:
                return []
            low, high = float(p["dynatemp_low"]), float(p["dynatemp_high"])
            if low < 0 or high < low:
                return refuse("dynatemp_low", f"{low}..{high}: the kind takes 0 <= dynatemp_low <= dynatemp_high")
            if high == low:
                return [] if low == 1.0 else [{"kind": "temperature", "temperature": low}]
            return [{"kind": "dynamic_temperature", "temperature": (low + high) / 2, "range": (high - low) / 2,
                     "exponent": float(p["dynatemp_exponent"])}]
        if name == "quadratic_sampling":
            factor = float(p["smoothing_factor"])
            if factor <= 0:
                return []
            return [{"kind": "smoothing", "factor": factor, "curve": float(p["smoothing_curve"])}]
        if name == "top_k":
            k = int(p["top_k"])
            if k < 0:
                return refuse(name, f"{k}: transformers needs top_k >= 0")
            return [{"kind": "top_k", "k": k}] if k > 0 else []
        if name == "top_p":
            top_p = float(p["top_p"])
            return [{"kind": "top_p", "p": top_p}] if top_p < 1.0 else []
        if name == "min_p":
            min_p = float(p["min_p"])
            if min_p > 1.0:
                return refuse(name, f"{min_p}: transformers needs 0 <= min_p <= 1")
            return [{"kind": "min_p", "p": min_p}] if min_p > 0.0 else []
        if name == "typical_p":
            mass = float(p["typical_p"])
            if mass <= 0:
                return refuse(name, f"{mass}: transformers needs 0 < typical_p < 1")
            return [{"kind": "typical_p", "mass": mass}] if mass < 1.0 else []
        if name in ("epsilon_cutoff", "eta_cutoff"):
            epsilon = float(p[name]) * 1e-4  # the webui's unit
            return [{"kind": name, "epsilon": epsilon}] if 0.0 < epsilon < 1.0 else []
        if name == "tfs":
            z = float(p["tfs"])
            return [{"kind": "tail_free", "z": z}] if 0.0 <= z < 1.0 else []
        if name == "top_a":
            a = float(p["top_a"])
            return [{"kind": "top_a", "a": a}] if 0.0 < a <= 1.0 else []
        if name == "adaptive_p":
            target = float(p["adaptive_target"])
            if target <= 0:
                return []
            return [{"kind": "adaptive_p", "target": target, "decay": float(p["adaptive_decay"])}]
        if name == "xtc":
            probability = float(p["xtc_probability"])
            if probability <= 0:
                return []
            return [{"kind": "xtc", "probability": probability, "threshold": float(p["xtc_threshold"]), **seeded}]
        if name == "mirostat":
            mode = int(p["mirostat_mode"])
            if mode == 1:
                return refuse("mirostat_mode", "1: the webui's own samplers have mode 2 only (its llama.cpp "
                              "loader passes 1 on): give {'kind': 'mirostat', 'version': 1}")
            if mode != 2:
                return [] if mode == 0 else refuse("mirostat_mode", f"{mode}: the webui knows 0 and 2")
            return [{"kind": "mirostat", "version": 2, "tau": float(p["mirostat_tau"]),
                     "eta": float(p["mirostat_eta"])}]
        if name == "encoder_repetition_penalty":
            penalty = float(p["encoder_repetition_penalty"])
            if penalty <= 0:
                return refuse(name, f"{penalty}: transformers needs a positive penalty")
            # transformers divides by 1 / penalty: the prompt's tokens become likelier.
            return [] if penalty == 1.0 else [{"kind": "repetition_penalty", "penalty": 1.0 / penalty,
                                               "scope": "prompt"}]
        size = int(p["no_repeat_ngram_size"])  # no_repeat_ngram
        return [{"kind": "no_repeat_ngram", "n": size}] if size > 0 else []

    bans = str(p.get("custom_token_bans") or "")
    banned = [int(t) for t in (t.strip() for t in bans.split(",")) if t.isdigit()]
    if banned:  # transformers' suppress_tokens, which the webui's sort leaves first
        out.specs.append({"kind": "ban_tokens", "token_ids": banned})
    for name in _webui_order(p, out):
        if greedy and name in _WEBUI_WARPERS:
            continue
        out.specs.extend(sampler(name))
    if greedy:
        out.specs.append({"kind": "top_k", "k": 1})
    if float(p["guidance_scale"]) != 1.0:
        out.unsupported["guidance_scale"] = "classifier-free guidance runs the model on the negative prompt too"
    if float(p["penalty_alpha"]) > 0:
        out.unsupported["penalty_alpha"] = "contrastive search needs the model's hidden states"
    for key, value in preset.items():
        if key in WEBUI_DEFAULTS or key in _WEBUI_NOT_SAMPLING or key in out.unsupported or key == "custom_token_bans":
            continue
        if key in _WEBUI_WHY:
            off, why = _WEBUI_WHY[key]
            if value is not None and value != off and not (isinstance(value, str) and not value.strip()):
                out.unsupported[key] = why
            continue
        out.unsupported[key] = "not a webui generation field we know"
    return out


# -- KoboldCpp's generate API (koboldcpp.py's generate, gpttype_adapter.cpp's SampleLogits) ---

# koboldcpp.py's defaults for what a request does not set.
KOBOLDCPP_DEFAULTS: Dict[str, Any] = {
    "temperature": 0.7,
    "top_k": 100,
    "top_a": 0.0,
    "top_p": 0.92,
    "min_p": 0.0,
    "typical": 1.0,
    "tfs": 1.0,
    "rep_pen": 1.0,
    "rep_pen_range": 320,
    "rep_pen_slope": 1.0,
    "presence_penalty": 0.0,
    "mirostat": 0,
    "mirostat_tau": 5.0,
    "mirostat_eta": 0.1,
    "dry_multiplier": 0.0,
    "dry_base": 1.75,
    "dry_allowed_length": 2,
    "dry_penalty_last_n": 320,
    "dry_sequence_breakers": [],
    "xtc_threshold": 0.2,
    "xtc_probability": 0.0,
    "sampler_order": [6, 0, 1, 3, 4, 2, 5],
    "sampler_seed": -1,
    "dynatemp_range": 0.0,
    "dynatemp_exponent": 1.0,
    "smoothing_factor": 0.0,
    "logit_bias": {},
    "custom_token_bans": "",
}
# expose.h's samplers: the ids of sampler_order.
KOBOLDCPP_SAMPLERS = {0: "top_k", 1: "top_a", 2: "top_p", 3: "tfs", 4: "typical", 5: "temperature", 6: "rep_pen"}
# The top-k prefilter SampleLogits applies after DRY, before the samplers in order.
KOBOLDCPP_PREFILTER = 5000
_KOBOLDCPP_NOT_SAMPLING = {
    "prompt", "memory", "images", "max_context_length", "max_length", "stop_sequence", "genkey",
    "trim_stop", "render_special", "quiet", "stream", "bypass_eos", "grammar_retain_state", "n",
    "frmttriminc", "frmtrmblln", "sampler_full_determinism", "mode", "repeat_penalty",
    "repetition_penalty",
}
_KOBOLDCPP_WHY = {
    "grammar": ("", "a GBNF grammar: give a grammar spec (regex, Lark or JSON schema) instead"),
    "ban_eos_token": (False, "needs the EOS id: give ban_tokens with it"),
    "use_default_badwordsids": (False, "bans the EOS token, which needs its id: give ban_tokens with it"),
    "banned_tokens": ([], "KoboldCpp's phrase bans backtrack over the text: give ban_strings"),
    "banned_strings": ([], "KoboldCpp's phrase bans backtrack over the text: give ban_strings"),
}


def _koboldcpp_order(order: Any, out: Conversion) -> List[str]:
    if not isinstance(order, (list, tuple)) or not order:
        return [KOBOLDCPP_SAMPLERS[i] for i in KOBOLDCPP_DEFAULTS["sampler_order"]]
    if len(order) > len(KOBOLDCPP_SAMPLERS):
        out.unsupported["sampler_order"] = f"{len(order)} ids: KoboldCpp takes at most 7 and uses its default"
        return [KOBOLDCPP_SAMPLERS[i] for i in KOBOLDCPP_DEFAULTS["sampler_order"]]
    unknown = [i for i in order if i not in KOBOLDCPP_SAMPLERS]
    if unknown:
        out.unsupported["sampler_order"] = f"unknown sampler ids {unknown} (KoboldCpp skips them too)"
    return [KOBOLDCPP_SAMPLERS[i] for i in order if i in KOBOLDCPP_SAMPLERS]


def from_koboldcpp(params: Mapping[str, Any]) -> Conversion:
    """KoboldCpp's generate parameters (a ``/api/v1/generate`` request body), in the order its
    ``SampleLogits`` runs them: ``logit_bias``, DRY, its top-k 5000 prefilter, then the samplers
    of ``sampler_order`` (ids: 0 top-k, 1 top-a, 2 top-p then min-p, 3 tail-free, 4 typical,
    5 temperature (dynamic with ``dynatemp_range``, then ``smoothing_factor``), 6 repetition and
    presence penalties; default ``[6, 0, 1, 3, 4, 2, 5]``), then XTC. With ``mirostat`` 1 or 2
    the chain is KoboldCpp's: penalties, temperature, mirostat. Unset fields take KoboldCpp's
    defaults: top-k 100, top-p 0.92, temperature 0.7. ``repeat_penalty`` and
    ``repetition_penalty`` are aliases of ``rep_pen`` (the largest of the three counts).

    >>> from logits_processing.convert import from_koboldcpp
    >>> [s["kind"] for s in from_koboldcpp({"rep_pen": 1.1, "min_p": 0.05}).specs]
    ['top_k', 'repetition_penalty', 'top_k', 'top_p', 'min_p', 'temperature']
    >>> from_koboldcpp({"rep_pen": 1.1, "rep_pen_range": 64}).specs[1]
    {'kind': 'repetition_penalty', 'penalty': 1.1, 'window': 64}
    """
    out = Conversion()
    p = {**KOBOLDCPP_DEFAULTS, **{k: v for k, v in params.items() if v is not None}}
    # KoboldCpp's aliases of rep_pen: the largest of the three counts.
    p["rep_pen"] = max(float(p.get(name, 1.0)) for name in ("rep_pen", "repeat_penalty", "repetition_penalty"))
    seed = int(p["sampler_seed"])
    seeded = {"seed": seed & 0xFFFFFFFF} if seed >= 0 else {}

    def refuse(key: str, why: str) -> List[Dict[str, Any]]:
        out.unsupported[key] = why
        return []

    def penalties() -> List[Dict[str, Any]]:
        rep_pen, slope = float(p["rep_pen"]), float(p["rep_pen_slope"])
        last_n = int(p["rep_pen_range"])
        if last_n <= 0:
            return []
        specs: List[Dict[str, Any]] = []
        if rep_pen <= 0:
            refuse("rep_pen", f"{rep_pen}: the kind needs a positive penalty")
        elif rep_pen != 1.0:
            # The older half of the window gets 1 + (rep_pen - 1) * slope, the newer rep_pen: the
            # reduced penalty over the window, then the rest of rep_pen over its newer half.
            reduced = 1.0 + (rep_pen - 1.0) * slope if rep_pen > 1.0 else rep_pen
            if reduced <= 0:
                refuse("rep_pen_slope", f"{slope}: makes the older half's penalty {reduced}, not positive")
            elif reduced == rep_pen:
                specs.append({"kind": "repetition_penalty", "penalty": rep_pen, "window": last_n})
            else:
                if reduced != 1.0:
                    specs.append({"kind": "repetition_penalty", "penalty": reduced, "window": last_n})
                if last_n // 2 > 0:
                    specs.append({"kind": "repetition_penalty", "penalty": rep_pen / reduced, "window": last_n // 2})
        if float(p["presence_penalty"]) != 0.0:
            specs.append({"kind": "presence_penalty", "penalty": float(p["presence_penalty"]), "window": last_n})
        return specs

    def temperature() -> List[Dict[str, Any]]:
        t = float(p["temperature"])
        if t <= 0:
            return [{"kind": "top_k", "k": 1}]  # KoboldCpp's greedy: no smoothing
        dyn = float(p["dynatemp_range"])
        if dyn > 0:
            specs = [{"kind": "dynamic_temperature", "temperature": t, "range": dyn,
                      "exponent": max(float(p["dynatemp_exponent"]), 0.0)}]
        else:
            specs = [] if t == 1.0 else [{"kind": "temperature", "temperature": t}]
        if float(p["smoothing_factor"]) > 0:
            specs.append({"kind": "smoothing", "factor": float(p["smoothing_factor"])})
        return specs

    def sampler(name: str) -> List[Dict[str, Any]]:
        if name == "rep_pen":
            return penalties()
        if name == "temperature":
            return temperature()
        if name == "top_k":
            k = int(float(p["top_k"]))
            return [{"kind": "top_k", "k": k}] if k > 0 else []
        if name == "top_a":
            a = float(p["top_a"])
            return [{"kind": "top_a", "a": a}] if a > 0 else []
        if name == "top_p":
            specs = []
            if float(p["top_p"]) < 1.0:
                specs.append({"kind": "top_p", "p": float(p["top_p"])})
            if float(p["min_p"]) > 0.0:
                specs.append({"kind": "min_p", "p": float(p["min_p"])})
            return specs
        if name == "tfs":
            z = float(p["tfs"])
            return [{"kind": "tail_free", "z": max(z, 0.0)}] if z < 1.0 else []
        mass = float(p["typical"])  # typical
        return [{"kind": "typical_p", "mass": mass}] if 0.0 < mass < 1.0 else []

    bias: Dict[str, float] = {}
    for token, value in dict(p["logit_bias"] or {}).items():
        if not str(token).lstrip("-").isdigit():
            out.unsupported["logit_bias"] = "text keys need the tokenizer: give token ids"
        elif int(token) >= 0:
            bias[str(int(token))] = min(max(float(value), -100.0), 100.0)  # KoboldCpp's clamp
    for token in str(p["custom_token_bans"]).split(","):
        if token.strip().isdigit():
            bias[str(int(token))] = -100.0  # as KoboldCpp bans them
    if bias:
        out.specs.append({"kind": "logit_bias", "bias": bias})
    dry = float(p["dry_multiplier"])
    if dry > 0 and float(p["dry_base"]) > 0:
        breakers = p["dry_sequence_breakers"]
        if isinstance(breakers, str):
            breakers = json.loads(breakers)
        last_n = int(p["dry_penalty_last_n"])
        spec = {"kind": "dry", "multiplier": dry, "base": float(p["dry_base"]),
                "allowed_length": int(p["dry_allowed_length"]), "penalty_last_n": last_n if last_n > 0 else -1}
        if breakers:
            spec["sequence_breakers"] = [str(b) for b in breakers]
        else:
            spec["sequence_breaker_ids"] = []  # KoboldCpp's default: none
        out.specs.append(spec)
    out.specs.append({"kind": "top_k", "k": KOBOLDCPP_PREFILTER})
    mirostat = int(p["mirostat"])
    if mirostat in (1, 2):
        out.specs.extend(penalties())
        out.specs.extend(temperature())
        out.specs.append({"kind": "mirostat", "version": mirostat, "tau": float(p["mirostat_tau"]),
                          "eta": float(p["mirostat_eta"])})
        if "sampler_order" in params:
            out.unsupported["sampler_order"] = "ignored with mirostat on (KoboldCpp ignores it too)"
    else:
        if mirostat != 0:
            out.unsupported["mirostat"] = f"{mirostat}: KoboldCpp knows 0, 1 and 2"
        for name in _koboldcpp_order(p["sampler_order"], out):
            out.specs.extend(sampler(name))
        probability, threshold = float(p["xtc_probability"]), float(p["xtc_threshold"])
        if probability > 0 and threshold <= 0.5:
            out.specs.append({"kind": "xtc", "probability": probability, "threshold": threshold, **seeded})
    for key, value in params.items():
        if key in KOBOLDCPP_DEFAULTS or key in _KOBOLDCPP_NOT_SAMPLING or key in out.unsupported:
            continue
        if key in _KOBOLDCPP_WHY:
            off, why = _KOBOLDCPP_WHY[key]
            if value is not None and value != off and not (isinstance(value, str) and not value.strip()):
                out.unsupported[key] = why
            continue
        out.unsupported[key] = "not a KoboldCpp generate field we know"
    return out


# -- vLLM's SamplingParams, and an OpenAI-style request body ------------------------------------

# vLLM's sampler: penalties (repetition, frequency, presence) on the logits, then temperature,
# then min-p, top-k and top-p (vllm/v1/sample/sampler.py).
_VLLM_FIELDS = {
    "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "frequency_penalty",
    "presence_penalty", "logit_bias", "allowed_token_ids", "bad_words", "min_tokens",
    "repetition_detection",
}
_VLLM_NOT_SAMPLING = {
    "n", "best_of", "seed", "stop", "stop_token_ids", "ignore_eos", "max_tokens", "logprobs",
    "prompt_logprobs", "detokenize", "skip_special_tokens", "spaces_between_special_tokens",
    "include_stop_str_in_output", "output_kind", "extra_args", "truncate_prompt_tokens",
    "guided_decoding", "structured_outputs", "logits_processors", "model", "prompt", "messages",
    "stream", "stream_options", "user", "max_completion_tokens",
}


def from_vllm(params: Any, eos_token_ids: Optional[Sequence[int]] = None) -> Conversion:
    """vLLM's ``SamplingParams`` (the object, or a mapping of its fields), in the order vLLM's
    sampler applies them: allowed ids, logit bias, penalties, temperature, min-p, top-k, top-p
    (a bias is added before the repetition penalty scales the logit, as in vLLM). vLLM's penalties count
    the output tokens only (repetition also the prompt's), as the specs' ``scope`` says.
    ``min_tokens`` and ``repetition_detection`` end or hold back the end of a request, so they
    need the model's ``eos_token_ids``; without them they are listed as unsupported.

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
    if get("allowed_token_ids"):
        out.specs.append({"kind": "allowed_token_ids", "token_ids": [int(t) for t in get("allowed_token_ids")]})
    if get("logit_bias"):
        out.specs.extend(_llamacpp_bias(get("logit_bias"), out))
    if get("repetition_penalty") not in (None, 1.0):
        out.specs.append({"kind": "repetition_penalty", "penalty": float(get("repetition_penalty"))})
    for name in ("frequency_penalty", "presence_penalty"):
        if get(name) not in (None, 0.0):
            out.specs.append({"kind": name, "penalty": float(get(name))})
    eos = [int(t) for t in eos_token_ids] if eos_token_ids else None
    if get("min_tokens"):
        if eos:
            out.specs.append({"kind": "min_new_tokens", "min_new_tokens": int(get("min_tokens")),
                              "eos_token_ids": eos})
        else:
            out.unsupported["min_tokens"] = "needs the EOS ids: give from_vllm eos_token_ids"
    detection = get("repetition_detection")
    if detection is not None:
        detection = detection if isinstance(detection, Mapping) else vars(detection)
        if not eos:
            out.unsupported["repetition_detection"] = "needs the EOS ids: give from_vllm eos_token_ids"
        elif detection.get("max_pattern_size", 0) > 0:
            out.specs.append({"kind": "repetition_detection", **{
                name: int(detection.get(name, 0))
                for name in ("max_pattern_size", "min_pattern_size", "min_count")
            }, "eos_token_ids": eos})
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


SOURCES = {
    "llamacpp": from_llamacpp,
    "webui": from_webui,
    "koboldcpp": from_koboldcpp,
    "vllm": from_vllm,
    "openai": from_openai,
}
