"""One set of requests for every engine: prompts as token ids, greedy decoding, one spec list per
request, on the tiny random-weight Llama over the DeepSeek tokenizer that ``vllm_real_engine.py``
saves. Each engine's runner sends them its own way (HF ``generate()`` with our HF adapter, vLLM's
``LLM.generate``, SGLang's ``Engine``, Dynamo's generate route) and records the token ids it got
with :func:`record`; ``test_conformance.py`` compares the records and renders the table in
docs/engines/conformance.md from them (``python/tools/gen_conformance_table.py`` writes it).

A request is ``decided`` when its specs fix every token it produces whatever the model's own
scores are, by margins of a logit or more over the random model's scores (which lie within about
+-1): forced sequences, strong biases, bans, and penalties and lengths on biased ids. Engines must
agree on those exactly. The rest (truncations, temperatures, penalties on the model's own picks,
grammars, rows without specs) follow the model's argmax, so their tokens depend on each engine's
arithmetic: they must agree where the engines' plain outputs of the same prompt agree.

Importable without torch or an engine (the runners import it in their own venvs).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

VOCAB = 129280
SPEC_KEY = "logits_processing"
DYNAMO_SPEC_KEY = "dynamo_logits"
RESULTS_ENV = "LOGITS_PROCESSING_CONFORMANCE_DIR"
MODEL_ENV = "LOGITS_PROCESSING_TINY_MODEL"
ENGINES = ("hf", "vllm", "sglang", "dynamo", "llamacpp")
ENGINE_NAMES = {
    "hf": "HF generate()",
    "vllm": "vLLM",
    "sglang": "SGLang",
    "dynamo": "Dynamo",
    "llamacpp": "llama.cpp",
}


@dataclass(frozen=True)
class Request:
    prompt: List[int]
    specs: Optional[list]
    max_new: int
    decided: bool
    # The request without specs on the same prompt and length: its outputs tell whether the
    # engines' arithmetic agrees on the model's own picks.
    baseline: str
    key: str = SPEC_KEY
    note: str = ""
    kinds: List[str] = field(default_factory=list)


def _ids(tok) -> dict:
    think, think_end = (tok.convert_tokens_to_ids(t) for t in ("<think>", "</think>"))
    (nl,) = tok.encode("\n", add_special_tokens=False)
    user = tok.encode("<｜User｜>Say something<｜Assistant｜>", add_special_tokens=False)
    other = tok.encode("<｜User｜>Count to ten, slowly<｜Assistant｜>", add_special_tokens=False)
    forced = tok.encode(" one two three", add_special_tokens=False)
    return dict(
        eos=tok.eos_token_id, think=think, think_end=think_end, nl=nl, user=user, other=other, forced=forced
    )


def requests(tok) -> Dict[str, Request]:
    """name -> request, in the order the table lists them."""
    i = _ids(tok)
    eos, nl, think_end = i["eos"], i["nl"], i["think_end"]
    user, other, thinking, forced = i["user"], i["other"], i["user"] + [i["think"]], i["forced"]
    schema = {
        "type": "object",
        "properties": {"b": {"type": "boolean"}, "c": {"enum": ["x", "y"]}},
        "required": ["b", "c"],
        "additionalProperties": False,
        "x-guidance": {"whitespace_flexible": False},
    }

    def bias(**by_id: float) -> dict:
        return {"kind": "logit_bias", "bias": {k.lstrip("t"): v for k, v in by_id.items()}}

    def eos_bias(value: float, **more: float) -> dict:
        return {
            "kind": "logit_bias",
            "bias": {str(eos): value, **{k.lstrip("t"): v for k, v in more.items()}},
        }

    rows = {
        # Decided by the specs.
        "forced_calls": Request(
            user, [{"kind": "forced_sequence", "token_ids": forced, "eos_token_id": eos}], 12, True, "plain"
        ),
        "forced_tokens": Request(
            other,
            [
                {"kind": "temperature", "temperature": 0.7},
                {
                    "kind": "forced_sequence",
                    "token_ids": forced[:2],
                    "eos_token_id": eos,
                    "position": "tokens",
                },
            ],
            24,
            True,
            "plain_other",
        ),
        "forced_dynamo_key": Request(
            user,
            [{"kind": "forced_sequence", "token_ids": forced[:2], "eos_token_id": eos}],
            12,
            True,
            "plain",
            key=DYNAMO_SPEC_KEY,
            note=f"Dynamo's key `{DYNAMO_SPEC_KEY}`; HF takes the specs as they are",
        ),
        "hello_world": Request(user, [{"kind": "hello_world"}], 12, True, "plain"),
        "bias_ban": Request(
            other,
            [bias(t4242=9.0, t77=8.0), {"kind": "ban_tokens", "token_ids": [4242]}],
            24,
            True,
            "plain_other",
        ),
        "allowed_ids": Request(
            user,
            [{"kind": "allowed_token_ids", "token_ids": [500, 600, 700]}, bias(t600=5.0)],
            12,
            True,
            "plain",
        ),
        "bad_words": Request(
            user,
            [bias(t77=20.0, t78=18.0), {"kind": "bad_words", "sequences": [[77, 77]]}],
            12,
            True,
            "plain",
        ),
        "sequence_bias": Request(
            user,
            [bias(t77=20.0, t79=18.0), {"kind": "sequence_bias", "biases": [[[77, 78], 30.0]]}],
            12,
            True,
            "plain",
        ),
        # 77, 78, 79 in the order the penalties allow; 8 tokens before the 2-grams run out.
        "repetition_ngram": Request(
            user,
            [
                bias(t77=20.0, t78=18.0, t79=16.0),
                {"kind": "repetition_penalty", "penalty": 2.0},
                {"kind": "no_repeat_ngram", "n": 2},
            ],
            8,
            True,
            "plain",
        ),
        "frequency_presence": Request(
            user,
            [
                bias(t77=20.0, t78=17.0),
                {"kind": "frequency_penalty", "penalty": 2.0},
                {"kind": "presence_penalty", "penalty": 2.0},
            ],
            8,
            True,
            "plain",
        ),
        "min_new_tokens": Request(
            user,
            [
                eos_bias(40.0, t77=20.0),
                {"kind": "min_new_tokens", "min_new_tokens": 5, "eos_token_ids": [eos]},
            ],
            12,
            True,
            "plain",
        ),
        "min_length": Request(
            user,
            [
                eos_bias(40.0, t77=20.0),
                {"kind": "min_length", "min_length": len(user) + 3, "eos_token_ids": [eos]},
            ],
            12,
            True,
            "plain",
        ),
        "forced_eos": Request(
            user,
            [bias(t77=20.0), {"kind": "forced_eos", "max_length": len(user) + 4, "eos_token_ids": [eos]}],
            12,
            True,
            "plain",
        ),
        "length_decay": Request(
            user,
            [
                eos_bias(10.0, t77=20.0),
                {
                    "kind": "exponential_decay_length_penalty",
                    "start_index": 3,
                    "decay_factor": 3.0,
                    "eos_token_ids": [eos],
                },
            ],
            12,
            True,
            "plain",
        ),
        "suppress_at_begin": Request(
            user,
            [bias(t77=20.0, t78=18.0), {"kind": "suppress_tokens_at_begin", "token_ids": [77]}],
            12,
            True,
            "plain",
        ),
        # 6 thinking tokens (4 + 50%), then </think> once; newlines and </think> banned.
        "thinking_budget_hard": Request(
            thinking,
            [
                bias(t77=20.0),
                {"kind": "ban_tokens", "token_ids": [nl, think_end]},
                {"kind": "thinking_budget", "max_thinking_tokens": 4, "overflow_percentage": 0.5},
            ],
            12,
            True,
            "plain_think",
        ),
        # Every token a newline: the budget (3) closes at the first newline past it.
        "thinking_budget_newline": Request(
            thinking,
            [bias(**{f"t{nl}": 80.0}), {"kind": "thinking_budget", "max_thinking_tokens": 3}],
            12,
            True,
            "plain_think",
        ),
        # Both ids above the threshold: XTC removes the more likely one at every step.
        "xtc": Request(
            user,
            [bias(t77=20.0, t78=19.5), {"kind": "xtc", "probability": 1.0, "threshold": 0.1}],
            12,
            True,
            "plain",
        ),
        # p(78) ~ 0.16 is the target: adaptive-p makes it the most likely at every step.
        "adaptive_p": Request(
            user,
            [bias(t77=12.0, t78=11.0, t79=10.0), {"kind": "adaptive_p", "target": 0.16}],
            12,
            True,
            "plain",
        ),
        # logits-processor-zoo's kinds. EOS is the argmax from the first step: the phrase is
        # written before it, all of it (hard forcing).
        "force_last_phrase": Request(
            user,
            [eos_bias(20.0), {"kind": "force_last_phrase", "phrase": forced, "eos_token_id": eos}],
            12,
            True,
            "plain",
        ),
        # No time allowed: the end token is forced at once.
        "max_time": Request(
            user, [{"kind": "max_time", "max_time": 0.0, "boost_token": eos}], 12, True, "plain"
        ),
        # 77 is the argmax: the phrase is written when it would be, then the model goes on.
        "trigger_phrase": Request(
            user,
            [
                bias(t77=20.0),
                {"kind": "trigger_phrase", "phrase": forced, "trigger_token_phrase": 77, "trigger_count": 1},
            ],
            12,
            True,
            "plain",
        ),
        # " world" would win every step but spells a banned string: "Hello" does.
        "ban_strings": Request(
            user,
            [bias(t2058=60.0, t19923=50.0), {"kind": "ban_strings", "strings": ["world"]}],
            12,
            True,
            "plain",
        ),
        # The zoo's kinds that weigh the model's own picks; prevent_hallucination's count of
        # unsure steps is not in the ids, so it holds only if a request left out of a call
        # (SGLang's prefill of joining requests) keeps its state.
        "zoo_on_model": Request(
            other,
            [
                {"kind": "cite_from_prompt", "boost_factor": 1.0, "eos_token_id": eos},
                {"kind": "gen_length", "boost_factor": 0.05, "p": 2, "boost_token": eos},
                {"kind": "prevent_hallucination", "minp": 0.4, "tolerate": 3, "phrase": forced},
            ],
            24,
            False,
            "plain_other",
        ),
        "multiple_choice": Request(
            user, [{"kind": "multiple_choice", "choices": [500, 600, 700]}], 12, False, "plain"
        ),
        # The model's own picks.
        "temperatures": Request(
            user,
            [
                {"kind": "temperature", "temperature": 0.5},
                {"kind": "dynamic_temperature", "temperature": 1.0, "range": 0.5},
                {"kind": "smoothing", "factor": 0.3},
            ],
            12,
            False,
            "plain",
        ),
        "truncations": Request(
            user,
            [
                {"kind": "top_k", "k": 50},
                {"kind": "top_p", "p": 0.9},
                {"kind": "min_p", "p": 0.05},
                {"kind": "typical_p", "mass": 0.9},
            ],
            12,
            False,
            "plain",
        ),
        "truncations_llamacpp_webui": Request(
            user,
            [
                {"kind": "epsilon_cutoff", "epsilon": 0.0003},
                {"kind": "eta_cutoff", "epsilon": 0.0003},
                {"kind": "top_n_sigma", "n": 1.0},
                {"kind": "top_a", "a": 0.2},
                {"kind": "p_less"},
                {"kind": "tail_free", "z": 0.95},
            ],
            12,
            False,
            "plain",
        ),
        "mirostat": Request(user, [{"kind": "mirostat", "version": 2, "tau": 5.0}], 12, False, "plain"),
        # Negative frequency and presence penalties make the model repeat itself; the others
        # then break the repeats.
        "penalties_on_model": Request(
            other,
            [
                {"kind": "frequency_penalty", "penalty": -1.0},
                {"kind": "presence_penalty", "penalty": -1.0},
                {"kind": "repetition_penalty", "penalty": 1.3, "window": 16},
                {"kind": "no_repeat_ngram", "n": 3},
                {"kind": "dry", "multiplier": 0.8},
            ],
            24,
            False,
            "plain_other",
        ),
        "grammar_json_schema": Request(
            user, [{"kind": "grammar", "json_schema": schema}], 12, False, "plain"
        ),
        "json_object": Request(user, [{"kind": "json_object"}], 12, False, "plain"),
        "bitmask": Request(
            user,
            [{"kind": "bitmask"}],
            12,
            False,
            "plain",
            note="the mask comes from the caller at each step",
        ),
        "plain": Request(user, None, 12, False, "plain"),
        "plain_other": Request(other, None, 24, False, "plain_other"),
        "plain_think": Request(thinking, None, 12, False, "plain_think"),
    }
    return {
        name: Request(
            **{**r.__dict__, "kinds": sorted({s["kind"] for s in r.specs or []}, key=_order(r.specs))}
        )
        for name, r in rows.items()
    }


def demands(tok) -> Dict[str, Callable[[List[int]], bool]]:
    """name -> what the request's specs demand of its tokens whatever the model's scores are, as
    a predicate on the generated ids (EOS included where it ended them). The requests whose
    tokens only the model decides (and ``bitmask``, refused) have none."""
    i = _ids(tok)
    eos, nl, think_end, forced = i["eos"], i["nl"], i["think_end"], i["forced"]

    def text(tokens):
        return tok.decode([t for t in tokens if t != eos])

    def pairs(tokens):
        return list(zip(tokens, tokens[1:]))

    def contains(tokens, part):
        return any(tokens[k : k + len(part)] == part for k in range(len(tokens)))

    def json_finished(tokens):
        if tokens[-1:] != [eos]:
            return True  # cut by the length: a prefix of a document, not checked here
        try:
            value = json.loads(text(tokens))
        except ValueError:
            return False
        return set(value) == {"b", "c"} and isinstance(value["b"], bool) and value["c"] in ("x", "y")

    return {
        "forced_calls": lambda t: t == forced + [eos],
        "forced_tokens": lambda t: t == forced[:2] + [eos],
        "forced_dynamo_key": lambda t: t == forced[:2] + [eos],
        "hello_world": lambda t: t == tok.encode("Hello world!", add_special_tokens=False) + [eos],
        "bias_ban": lambda t: 4242 not in t,
        "allowed_ids": lambda t: set(t) <= {500, 600, 700},
        "bad_words": lambda t: (77, 77) not in pairs(t),
        "sequence_bias": lambda t: all(b == 78 for a, b in pairs(t) if a == 77),
        "repetition_ngram": lambda t: len(set(pairs(t))) == len(pairs(t)),
        "min_new_tokens": lambda t: eos not in t[:5],
        "min_length": lambda t: eos not in t[:3],
        "forced_eos": lambda t: len(t) == 4 and t[-1] == eos,
        "suppress_at_begin": lambda t: t[:1] != [77],
        "thinking_budget_hard": lambda t: nl not in t and think_end in t[:7],
        "thinking_budget_newline": lambda t: think_end in t,
        "xtc": lambda t: 77 not in t,
        "force_last_phrase": lambda t: t[-len(forced) - 1 :] == forced + [eos],
        "max_time": lambda t: t == [eos],
        "trigger_phrase": lambda t: contains(t, forced),
        "ban_strings": lambda t: "world" not in text(t),
        "grammar_json_schema": json_finished,
        "json_object": lambda t: text(t).lstrip().startswith("{"),
    }


def unmet_demands(tok, rows: Dict[str, dict]) -> Dict[str, list]:
    """The served requests of one record whose tokens break what their specs demand
    (:func:`demands`), with their tokens."""
    served = {name: row["tokens"] for name, row in rows.items() if "tokens" in row}
    return {
        name: served[name]
        for name, check in demands(tok).items()
        if name in served and not check(served[name])
    }


def _order(specs) -> Callable[[str], int]:
    first = {}
    for i, spec in enumerate(specs or []):
        first.setdefault(spec["kind"], i)
    return first.__getitem__


def model_digest(model_dir: str) -> str:
    """sha256 of the weights: the records must come from one model."""
    h = hashlib.sha256()
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        h.update(path.read_bytes())
    return h.hexdigest()


def short_error(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


# Tokens per request when an engine sends the requests through the device path under Triton's
# interpreter, which takes seconds a step for a row that truncates.
DEVICE_PATH_TOKENS = 4


def assert_same_prefixes(switched: Dict[str, dict], plain: Dict[str, dict]) -> None:
    """One engine's rows through the device path (``DEVICE_PATH_TOKENS`` each) against its rows
    without it: every request has the same first tokens, or the same error."""
    assert set(switched) == set(plain)
    for name, row in switched.items():
        if "error" in plain[name]:
            assert row == plain[name], name
        else:
            n = len(row["tokens"])
            assert n and row["tokens"] == plain[name]["tokens"][:n], name


def record(
    engine: str,
    model_dir: str,
    reqs: Dict[str, Request],
    rows: Dict[str, dict],
    *,
    versions: Dict[str, str],
    route: str,
    routes: Optional[Dict[str, str]] = None,
) -> dict:
    """The engine's record; written as ``<engine>.json`` into ``$LOGITS_PROCESSING_CONFORMANCE_DIR``
    when that is set. ``rows[name]`` is ``{"tokens": [...]}`` or ``{"error": "..."}``; ``routes``,
    other ways of sending specs that were tried, with what happened."""
    missing = set(reqs) - set(rows)
    assert not missing, f"{engine}: no result for {sorted(missing)}"
    out = {
        "engine": engine,
        "model": model_digest(model_dir),
        "versions": versions,
        "route": route,
        "routes": routes or {},
        "requests": {
            name: {
                "kinds": r.kinds,
                "decided": r.decided,
                "baseline": r.baseline,
                "note": r.note,
                # Each engine's venv tokenizes the requests' text itself: the ids must agree.
                "prompt": r.prompt,
            }
            for name, r in reqs.items()
        },
        "rows": {name: rows[name] for name in reqs},
    }
    directory = os.environ.get(RESULTS_ENV)
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / f"{engine}.json").write_text(json.dumps(out, indent=1) + "\n")
    return out


def versions(*distributions: str) -> Dict[str, str]:
    import importlib.metadata

    found = {}
    for name in distributions:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


def run_hf(model_dir: str) -> dict:
    """Every request through transformers' ``generate()`` with our HF adapter, one at a time."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    from logits_processing.adapters import EngineContext
    from logits_processing.adapters.hf import HFLogitsProcessor

    tok = AutoTokenizer.from_pretrained(model_dir)
    context = EngineContext(tokenizer=tok, vocab_size=VOCAB)
    model = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    rows, reqs = {}, requests(tok)
    for name, r in reqs.items():
        ids = torch.tensor([r.prompt])
        try:
            processors = [HFLogitsProcessor(r.specs, context=context)] if r.specs is not None else []
            with torch.no_grad():
                gen = model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    logits_processor=processors,
                    do_sample=False,
                    max_new_tokens=r.max_new,
                    eos_token_id=tok.eos_token_id,
                    pad_token_id=tok.eos_token_id,
                )
            rows[name] = {"tokens": gen[0, len(r.prompt) :].tolist()}
        except Exception as e:  # noqa: BLE001 - the refusal is the result
            rows[name] = {"error": short_error(e)}
    route = "`model.generate(..., logits_processor=[HFLogitsProcessor(specs, context=...)])`, one request at a time"
    return record("hf", model_dir, reqs, rows, versions=versions("transformers", "torch"), route=route)


# --- llama.cpp: the same weights as a GGUF -----------------------------------------------------

# gguf.TokenType, as convert_hf_to_gguf.py's get_vocab_base assigns them.
_NORMAL, _CONTROL, _USER_DEFINED, _UNUSED = 1, 3, 4, 5


def _looks_special(token: str) -> bool:
    """convert_hf_to_gguf.py's does_token_look_special, for the DeepSeek and ChatML forms."""
    return (token.startswith("<|") and token.endswith("|>")) or (
        token.startswith("<｜") and token.endswith("｜>")
    )


def write_gguf(model_dir: str, path: str) -> str:
    """The model in ``model_dir`` (``model.safetensors``, ``config.json``, ``tokenizer.json``) as an
    F32 GGUF of llama.cpp's ``llama`` architecture, written with the ``gguf`` package the way
    llama.cpp's ``convert_hf_to_gguf.py`` writes a Llama: the same tensors, the rows of ``q_proj``
    and ``k_proj`` permuted from transformers' rotate-half RoPE layout to llama.cpp's, the same
    hyperparameters, and the vocab (every id's token; special added tokens and those that look
    special are control tokens, other added ones user-defined, ids the tokenizer lacks
    ``[PAD<id>]``; the merges; BOS and EOS). Its pre-tokenizer is llama.cpp's ``deepseek-v3``
    (the converter's hash names this tokenizer ``joyai-llm``, whose split rules llama.cpp shares
    with ``deepseek-v3``). Needs gguf, numpy and safetensors, not torch. Returns ``path``."""
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    d = Path(model_dir)
    config = json.loads((d / "config.json").read_text())
    tokenizer = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
    tok_config = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
    n_vocab, n_head = config["vocab_size"], config["num_attention_heads"]
    n_kv = config.get("num_key_value_heads") or n_head
    head_dim = config.get("head_dim") or config["hidden_size"] // n_head
    rope = config.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default" or config.get("rope_scaling"):
        raise ValueError(f"{model_dir}: only plain RoPE is written, not {rope or config['rope_scaling']}")

    w = gguf.GGUFWriter(path, "llama")
    w.add_type("model")
    w.add_name(d.name)
    w.add_block_count(config["num_hidden_layers"])
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_freq_base(rope.get("rope_theta", config.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_vocab_size(n_vocab)
    w.add_rope_dimension_count(head_dim)

    by_id = {i: t for t, i in tokenizer["model"]["vocab"].items()}
    added = {a["id"]: a for a in tokenizer["added_tokens"]}
    by_id.update((i, a["content"]) for i, a in added.items())
    tokens, types = [], []
    for i in range(n_vocab):
        token = by_id.get(i)
        if token is None:
            token, kind = f"[PAD{i}]", _UNUSED
        elif i in added:
            kind = _CONTROL if added[i]["special"] or _looks_special(token) else _USER_DEFINED
            if kind == _USER_DEFINED:
                token = token.replace("\u2581", " ")
        else:
            kind = _NORMAL
        tokens.append(token)
        types.append(kind)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]]

    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("deepseek-v3")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(config["bos_token_id"])
    w.add_eos_token_id(config["eos_token_id"])
    w.add_add_bos_token(bool(tok_config.get("add_bos_token", False)))
    w.add_add_eos_token(bool(tok_config.get("add_eos_token", False)))

    def permute(weights, heads):
        return (
            weights.reshape(heads, 2, weights.shape[0] // heads // 2, -1)
            .swapaxes(1, 2)
            .reshape(weights.shape)
        )

    hf = load_file(str(d / "model.safetensors"))
    names = {"embed_tokens": "token_embd", "norm": "output_norm"}
    layer = {
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for name, value in hf.items():
        value = value.astype(np.float32)
        parts = name.removesuffix(".weight").split(".")
        if name == "lm_head.weight":
            out = "output"
        elif parts[1] == "layers":
            inner = ".".join(parts[3:])
            out = f"blk.{parts[2]}.{layer[inner]}"
            if inner == "self_attn.q_proj":
                value = permute(value, n_head)
            elif inner == "self_attn.k_proj":
                value = permute(value, n_kv)
        else:
            out = names[parts[1]]
        w.add_tensor(f"{out}.weight", value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# Raw logits kept per step of the requests without specs, for comparing llama.cpp's arithmetic
# with transformers' (test_conformance.py), and how far apart they may be.
TOP_LOGITS = 8
LOGIT_BOUND = 1e-4


def run_llamacpp(model_dir: str, gguf_path: str) -> dict:
    """Every request through llama-cpp-python, one at a time, on the model of ``model_dir``
    written as a GGUF (:func:`write_gguf`): the specs in a ``LlamaCppLogitsProcessor`` over
    ``context_from_llama`` (token texts from the GGUF's vocab), generated by ``Llama.generate``
    (the token loop under ``__call__`` and ``create_completion``) with ``temp=0`` (greedy) and
    stopped at EOS or the request's length as ``generate()`` is. The KV cache is kept in F32, and
    each request evaluates its whole prompt (no cached prefix), so no request's tokens depend
    on the ones before it. The requests without specs also record each step's ``TOP_LOGITS``
    highest raw logits (``top``)."""
    import llama_cpp
    import numpy as np
    from transformers import AutoTokenizer

    from logits_processing.adapters.llama_cpp import (
        LlamaCppLogitsProcessor,
        context_from_llama,
        tokenizer_json_from_gguf,
    )

    tok = AutoTokenizer.from_pretrained(model_dir)
    write_gguf(model_dir, gguf_path)
    f32 = llama_cpp.GGML_TYPE_F32
    llm = llama_cpp.Llama(
        gguf_path, n_ctx=256, n_batch=64, n_threads=2, type_k=f32, type_v=f32, seed=0, verbose=False
    )
    context = context_from_llama(llm, tokenizer=tokenizer_json_from_gguf(gguf_path))
    eos = llm.token_eos()

    def top(input_ids, scores):
        ids = np.argsort(-scores, kind="stable")[:TOP_LOGITS]
        steps.append([[int(i), float(scores[i])] for i in ids])
        return scores

    rows, reqs = {}, requests(tok)
    for name, r in reqs.items():
        steps: list = []
        try:
            procs = [LlamaCppLogitsProcessor(r.specs, context=context)] if r.specs is not None else [top]
        except Exception as e:  # noqa: BLE001 - the refusal is the result
            rows[name] = {"error": short_error(e)}
            continue
        llm.reset()
        out = []
        for token in llm.generate(
            r.prompt, temp=0.0, repeat_penalty=1.0, logits_processor=llama_cpp.LogitsProcessorList(procs)
        ):
            out.append(int(token))
            if token == eos or len(out) == r.max_new:
                break
        rows[name] = {"tokens": out, **({"top": steps} if r.specs is None else {})}
    route = (
        "`Llama.generate(prompt_ids, temp=0, logits_processor=LogitsProcessorList([LlamaCppLogitsProcessor(specs, "
        "context=...)]))` (the loop under `__call__` and `create_completion`), one request at a time, on the same "
        "weights written as an F32 GGUF"
    )
    return record(
        "llamacpp", model_dir, reqs, rows, versions=versions("llama_cpp_python", "gguf"), route=route
    )


# --- comparing the records and rendering the table -------------------------------------------


def load(directory: str) -> Dict[str, dict]:
    """The records found in ``directory``, by engine."""
    return {
        engine: json.loads((Path(directory) / f"{engine}.json").read_text())
        for engine in ENGINES
        if (Path(directory) / f"{engine}.json").exists()
    }


def tokens(records: Dict[str, dict], engine: str, name: str) -> Optional[list]:
    return records[engine]["rows"][name].get("tokens")


def plain_agrees(records: Dict[str, dict], baseline: str) -> bool:
    """Every engine that served the request without specs ``baseline`` gave the same tokens."""
    outputs = [tokens(records, e, baseline) for e in records]
    return len({json.dumps(o) for o in outputs if o is not None}) <= 1


def verdict(records: Dict[str, dict], name: str, engine: str) -> str:
    """What ``engine`` did with request ``name``, against HF's tokens: ``same``, ``refused: ...``,
    ``differs``, or ``differs, as its plain output does`` (a request the model decides, whose
    plain baseline differs from HF's on this engine too)."""
    row = records[engine]["rows"][name]
    if "error" in row:
        return "refused: " + row["error"]
    reference = tokens(records, "hf", name)
    if reference is None:
        return "served (HF refused)"
    if row["tokens"] == reference:
        return "same"
    meta = records["hf"]["requests"][name]
    baseline = meta["baseline"]
    if (
        name != baseline
        and not meta["decided"]
        and tokens(records, engine, baseline) != tokens(records, "hf", baseline)
    ):
        return "differs, as its plain output does"
    return "differs"


_RUN_IDS = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b|\b[0-9a-f]{24,}\b")


def _cell(text: str) -> str:
    """Table-safe text, request ids (which change every run) replaced by ``<id>``."""
    return _RUN_IDS.sub("<id>", text).replace("|", "\\|").replace("\n", " ")


def table(records: Dict[str, dict]) -> str:
    """The markdown page, from the records alone."""
    engines = [e for e in ENGINES if e in records]
    others = [e for e in engines if e != "hf"]
    lines = [
        "# The same requests on every engine",
        "",
        "<!-- Generated by python/tools/gen_conformance_table.py from the records that",
        "     scripts/test-engines.sh makes; python/tests/test_conformance.py fails when this page",
        "     differs from what the engines did. -->",
        "",
        "One set of requests (`python/tests/conformance.py`: prompts as token ids, greedy decoding,",
        "a spec list each, rows without specs among them) sent through every engine that",
        "`scripts/test-engines.sh` runs, on one model (the tiny random-weight Llama over the DeepSeek",
        "tokenizer; the records carry its weights' sha256 and must agree). Each engine's tokens are",
        "compared with those of transformers' `generate()` running our HF adapter, and checked",
        "against what their specs demand whatever the model's scores (`conformance.demands`: forced",
        "ids, bans, allowed sets, lengths, a JSON document's keys ...).",
        "",
        "llama.cpp runs the same weights written as an F32 GGUF (`conformance.write_gguf`: tensors",
        "and vocab as llama.cpp's `convert_hf_to_gguf.py` writes them), its KV cache in F32. At every",
        f"step of the requests without specs its {TOP_LOGITS} highest raw logits must be transformers'",
        f"within {LOGIT_BOUND:g} and the top two further apart than twice the gap, so greedy decoding",
        "cannot part on these prompts (test_conformance.py).",
        "",
        "| engine | versions | how the specs travel |",
        "| --- | --- | --- |",
    ]
    for e in engines:
        v = ", ".join(f"{k} {records[e]['versions'][k]}" for k in sorted(records[e]["versions"]))
        lines.append(f"| {ENGINE_NAMES[e]} | {v} | {_cell(records[e]['route'])} |")
    lines += [
        "",
        "TensorRT-LLM is not among them: it has no CPU build to run here ([trtllm.md](trtllm.md)).",
        "",
        "A request is *decided* when its specs fix every token whatever the model's own scores are",
        "(forced sequences, strong biases, bans; penalties and lengths on biased ids): every engine",
        "must give HF's tokens for it. The others follow the model's argmax, so their tokens depend",
        "on each engine's arithmetic: they must agree wherever the engines' plain outputs of the same",
        "prompt (`plain`, `plain_other`, `plain_think`) agree, and where those differ the cell says",
        "so. `same`: HF's tokens; `refused`: the engine refused the request, with its message.",
        "",
        "| request | kinds | decided | HF tokens | " + " | ".join(ENGINE_NAMES[e] for e in others) + " |",
        "| --- | --- | --- | --- | " + " | ".join("---" for _ in others) + " |",
    ]
    for name, meta in records["hf"]["requests"].items():
        hf = records["hf"]["rows"][name]
        hf_cell = str(len(hf["tokens"])) if "tokens" in hf else "refused: " + hf["error"]
        kinds = ", ".join(f"`{k}`" for k in meta["kinds"]) or "none"
        if meta["note"]:
            kinds += f" ({meta['note']})"
        cells = [verdict(records, name, e) for e in others]
        lines.append(
            f"| `{name}` | {kinds} | {'yes' if meta['decided'] else 'no'} | {_cell(hf_cell)} | "
            + " | ".join(_cell(c) for c in cells)
            + " |"
        )
    baselines = sorted({meta["baseline"] for meta in records["hf"]["requests"].values()})
    lines += [
        "",
        "The engines' plain outputs (no specs): "
        + "; ".join(f"`{b}` {'agree' if plain_agrees(records, b) else 'differ'}" for b in baselines)
        + ".",
    ]
    routes = [(e, route, outcome) for e in engines for route, outcome in records[e]["routes"].items()]
    if routes:
        lines += ["", "Other ways of sending specs that were tried:", ""]
        lines += [f"- {ENGINE_NAMES[e]}, {route}: {_cell(outcome)}" for e, route, outcome in routes]
    return "\n".join(lines) + "\n"
