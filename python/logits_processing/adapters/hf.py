"""Hugging Face transformers: a ``LogitsProcessor`` for ``generate(logits_processor=...)``.

Imports transformers (and torch) when this module is imported.
"""

from __future__ import annotations

import operator
from typing import Any, Optional, Sequence, Tuple, Unpack

import torch
from transformers import LogitsProcessor

from .. import _lib
from ._common import (
    EngineKeywords,
    check_in_process_pipeline,
    context_for,
    pipeline_reads_history,
    takes_device_path,
)

__all__ = ["HFLogitsProcessor", "specs_from_generation_config"]


class HFLogitsProcessor(LogitsProcessor):
    """Runs one ``logits_processing`` pipeline per batch row of ``generate()``, the whole
    ``[rows, vocab]`` block in one call into Rust per step.

    HF's contract is that a processor returns new scores and leaves its input as it was: on the
    CPU each call reads ``scores`` and writes a new tensor in one pass (``out=``); on a GPU it
    copies the scores once and edits the copy in place. Nothing else is allocated per step.
    The ids are read on the host: on a GPU only the ids new since the previous call are copied
    there, with whether the older ones are unchanged (computed on the device), in one copy a call
    (one wait; :attr:`device_reads` counts the copies), and the rest are kept from the previous
    calls. A pipeline that reads no history (:func:`logits_processing.reads_history`: every row's
    specs history-free) copies none: it never waits for the device.
    The ids HF passes are the prompt and the tokens generated so far, so the first call's length
    is taken as the prompt length (forced sequences positioned by ``"tokens"`` count from there).
    A call whose ids do not extend the previous call's (a new prompt, even a longer one, or a
    different number of rows) starts a new generation, so one object (one ``LogitsProcessorList``
    built once) serves several ``generate()`` calls in turn, each as a fresh processor would; not
    at once. :meth:`reset` starts over explicitly.

    Args:
        pipeline: the pipeline every row runs: a JSON text, a spec dict, or a list of spec dicts,
            processor objects and callables ``(input_ids, logits_row) -> None``.
        per_row: instead of ``pipeline``, one pipeline per prompt. With ``num_beams`` or
            ``num_return_sequences`` above 1, HF expands each prompt into consecutive rows; each
            of those rows gets its prompt's pipeline (a fresh copy).
        context: a :class:`logits_processing.EngineContext` built once for the model and
            shared by every processor made for it (its tokenizer is read once); or instead, the
            keywords of :class:`~logits_processing.adapters.EngineKeywords` (``tokenizer``,
            ``model_name``, ``vocab_size``, ``hello_world``, ``thinking_tokens``) to build one.

    Example::

        from logits_processing.adapters.hf import HFLogitsProcessor
        processor = HFLogitsProcessor({"kind": "hello_world"}, tokenizer=tokenizer)
        out = model.generate(**inputs, logits_processor=[processor], do_sample=False)
    """

    # transformers' continuous batching (`generate_batch`, the serving path) moves requests in
    # and out of rows; this processor holds one pipeline per fixed row and takes the prompt
    # length from its first call, so it declares itself unsupported there.
    supports_continuous_batching = False

    def __init__(
        self,
        pipeline: Any = None,
        *,
        per_row: Optional[Sequence[Any]] = None,
        context: Optional[_lib.EngineContext] = None,
        **engine: Unpack[EngineKeywords],
    ) -> None:
        if (pipeline is None) == (per_row is None):
            raise ValueError("give exactly one of pipeline (every row) and per_row (one per prompt)")
        self.context = context_for(context, **engine)
        if per_row is None:
            self._pipelines = [check_in_process_pipeline(pipeline, engine="transformers")]
        else:
            self._pipelines = [
                check_in_process_pipeline(p, f"per_row[{i}]", engine="transformers") for i, p in enumerate(per_row)
            ]
        if not self._pipelines:
            raise ValueError("per_row is empty")
        self._broadcast = per_row is None
        for p in self._pipelines:
            if _is_data(p):
                self.context.validate(p)
        self._reads = any(pipeline_reads_history(p) for p in self._pipelines)
        #: Reads from the device (waits, see ``adapters._common``): one a call when the ids are
        #: on a device and some row reads its history, else none.
        self.device_reads = 0
        self.reset()

    def reset(self) -> None:
        """Forgets the current generation; the next call starts a new one."""
        self._batch = None
        self._last_shape: Tuple[int, ...] = ()
        # The previous call's ids (where they are compared: on the host, or read on a device).
        self._last_ids: Optional[torch.Tensor] = None
        # The ids so far on the host, one row per batch row: ids on a GPU cross to the host only
        # where they are new since the last call.
        self._host_ids: Optional[torch.Tensor] = None
        self.prompt_len: Optional[int] = None

    def _continues(self, input_ids: torch.Tensor) -> bool:
        """Whether host ``input_ids`` extend the previous call's ids (same rows, longer, same
        prefix): the same generation."""
        last = self._last_ids
        return self._extends(input_ids) and torch.equal(input_ids[:, : last.shape[1]], last)

    def _extends(self, input_ids: torch.Tensor) -> bool:
        """Whether ``input_ids`` have the previous call's rows and more ids: all a pipeline that
        reads no history needs to tell a generation from the next."""
        return (
            self._batch is not None
            and input_ids.shape[0] == self._last_shape[0]
            and input_ids.shape[1] > self._last_shape[1]
        )

    def _start(self, rows: int, length: int, vocab: int) -> None:
        if self._broadcast:
            per_row = [self._pipelines[0]] * rows
        else:
            if rows % len(self._pipelines):
                raise ValueError(
                    f"generate() has {rows} rows, not a multiple of the {len(self._pipelines)} "
                    "pipelines given per_row"
                )
            expand = rows // len(self._pipelines)
            per_row = [self._pipelines[r // expand] for r in range(rows)]
        batch = self.context.batch(self.context.vocab_size or vocab)
        for row, p in enumerate(per_row):
            batch.add(row, p, prompt_len=length)
        self._batch, self.prompt_len = batch, length

    def _device_ids(self, input_ids: torch.Tensor) -> Tuple[bool, torch.Tensor]:
        """For ``input_ids`` on a device: whether they continue the generation, and the ids on the
        host. One copy (one wait) a step: whether the previous call's ids are their prefix,
        computed on the device, travels with the new ids; the ids known from earlier calls are
        kept on the host. A new generation's ids cross whole."""
        if self._extends(input_ids):
            known = self._last_ids.shape[1]
            same = torch.eq(input_ids[:, :known], self._last_ids).all().to(input_ids.dtype).reshape(1)
            packed = torch.cat([same, input_ids[:, known:].reshape(-1)]).cpu()
            self.device_reads += 1
            if bool(packed[0]):
                new = packed[1:].reshape(input_ids.shape[0], -1)
                self._host_ids = torch.cat([self._host_ids, new], dim=1)
                return True, self._host_ids
        self._host_ids = input_ids.cpu()
        self.device_reads += 1
        return False, self._host_ids

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        on_device = takes_device_path(input_ids)
        if not on_device:
            continues, host_ids = self._continues(input_ids), input_ids
        elif self._reads:
            continues, host_ids = self._device_ids(input_ids)
        else:  # no row reads its ids: none cross to the host
            continues, host_ids = self._extends(input_ids), [_NO_IDS] * input_ids.shape[0]
        if not continues:
            self._start(*input_ids.shape, scores.shape[-1])
        self._last_shape = tuple(input_ids.shape)
        # A copy: generate() makes a new tensor each step, but nothing promises it.
        self._last_ids = input_ids.clone() if self._reads or not on_device else None
        input_ids = host_ids
        processed = torch.empty_like(scores)
        if takes_device_path(scores) or processed.stride() != scores.stride():
            processed.copy_(scores)
            self._batch.apply(processed, input_ids)
        else:
            # One pass: each logit is read from `scores` and written to `processed` once.
            self._batch.apply(scores, input_ids, out=processed)
        return processed


_NO_IDS: tuple = ()


def _is_data(pipeline: Any) -> bool:
    if isinstance(pipeline, (str, bytes, dict)):
        return True
    if isinstance(pipeline, (list, tuple)):
        return all(isinstance(p, dict) for p in pipeline)
    return False


def _is_green_list(watermark: Any) -> bool:
    from transformers import WatermarkingConfig

    return isinstance(watermark, WatermarkingConfig)


def _is_synthid(watermark: Any) -> bool:
    # A SynthID Text config without its debug mode (which replaces the scores by ones first).
    from transformers import SynthIDTextWatermarkingConfig

    return isinstance(watermark, SynthIDTextWatermarkingConfig) and not watermark.debug_mode


def specs_from_generation_config(config: Any, *, prompt_len: Optional[int] = None, model: Any = None) -> list:
    """The pipeline ``generate()`` would build from a ``GenerationConfig``, as specs, in
    ``generate()``'s order: pass it to :class:`HFLogitsProcessor` (with the config's processor
    fields reset, so transformers does not build its own list too) to run them in one fused pass.

    Covered: ``sequence_bias``, ``repetition_penalty``, ``no_repeat_ngram_size``,
    ``bad_words_ids`` (one-token sequences that are an EOS id dropped, as ``generate()`` does),
    ``min_length``, ``min_new_tokens``, ``forced_eos_token_id``, ``remove_invalid_values``,
    ``exponential_decay_length_penalty``, ``suppress_tokens``, a ``SynthIDTextWatermarkingConfig``
    (``synthid_watermark``), ``renormalize_logits``, ``begin_suppress_tokens`` and, when
    ``do_sample``, ``temperature``, ``top_h``, ``top_k``, ``top_p``, ``min_p``, ``typical_p``,
    ``epsilon_cutoff``, ``eta_cutoff`` (``min_tokens_to_keep`` as ``generate()`` sets it, beams
    included), then ``watermarking_config`` (a ``WatermarkingConfig``: the kind ``watermark``, its
    vocab the model's when ``model`` is given) and ``renormalize_logits``. ``min_new_tokens`` and the exponential decay count from the prompt's length, which
    the adapter gives at admission. Fields the config leaves unset take the values ``generate()``
    gives them: the model's ``generation_config`` (with ``model``), then transformers' global
    defaults (``top_k=50`` when sampling, in transformers 5).

    Args:
        config: a ``transformers.GenerationConfig``.
        prompt_len: the prompt's length; needed only when ``forced_eos_token_id`` is set and the
            config limits the length by ``max_new_tokens`` (the limit is then
            ``prompt_len + max_new_tokens``, as ``generate()`` computes it).
        model: the model ``generate()`` will run, whose ``generation_config`` fills the fields
            ``config`` leaves unset.

    Raises:
        ArgumentTypeError: (a TypeError) ``config`` is not a ``GenerationConfig`` (a dict of its
            fields would silently read as unset: build ``GenerationConfig(**fields)``).
        InvalidArgumentError: (a ValueError) ``top_k``, ``no_repeat_ngram_size``, ``min_length``
            or ``min_new_tokens`` that is not an integer (``generate()`` refuses them too),
            naming it in ``field``.
        ValueError: a field that changes the logits and has no spec here (``guidance_scale``,
            the encoder-decoder penalties, SynthID's ``debug_mode``), naming it.

    Example::

        from transformers import GenerationConfig
        from logits_processing.adapters.hf import HFLogitsProcessor, specs_from_generation_config
        config = GenerationConfig(do_sample=True, temperature=0.7, top_p=0.9, repetition_penalty=1.1)
        processor = HFLogitsProcessor(specs_from_generation_config(config))
        out = model.generate(**inputs, logits_processor=[processor], do_sample=True)
    """
    from transformers import GenerationConfig

    if not isinstance(config, GenerationConfig):
        from logits_processing import ArgumentTypeError

        raise ArgumentTypeError(
            f"config must be a transformers GenerationConfig, found {type(config).__name__}; for a "
            "dict of its fields, pass GenerationConfig(**fields)"
        )
    config = _as_generate_resolves(config, model)

    def field(name: str, default: Any = None) -> Any:
        return getattr(config, name, default)

    def whole(name: str) -> int:
        # generate() refuses a count that is not an int (its processors check isinstance(v, int)).
        value = field(name)
        if isinstance(value, bool) or not hasattr(type(value), "__index__"):
            error = _lib.InvalidArgumentError(f"GenerationConfig.{name} must be an integer, got {value!r}")
            error.field = name
            raise error
        return operator.index(value)

    unsupported = [
        ("guidance_scale", lambda v: v is not None and v != 1),
        ("encoder_repetition_penalty", lambda v: v is not None and v != 1.0),
        ("encoder_no_repeat_ngram_size", lambda v: v is not None and v > 0),
        # The green-list and SynthID configs map onto their kinds below; not SynthID's debug mode.
        ("watermarking_config", lambda v: v is not None and not (_is_synthid(v) or _is_green_list(v))),
    ]
    for name, used in unsupported:
        if used(field(name)):
            raise ValueError(f"GenerationConfig.{name}={field(name)!r} has no logits_processing spec")

    eos = field("eos_token_id")
    eos_ids = [] if eos is None else [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]
    specs: list = []
    if field("sequence_bias") is not None:
        bias = field("sequence_bias")
        pairs = bias.items() if isinstance(bias, dict) else bias
        specs.append({"kind": "sequence_bias", "biases": [[list(ids), float(b)] for ids, b in pairs]})
    if field("repetition_penalty") is not None and field("repetition_penalty") != 1.0:
        specs.append({"kind": "repetition_penalty", "penalty": float(field("repetition_penalty"))})
    if field("no_repeat_ngram_size") is not None and field("no_repeat_ngram_size") > 0:
        specs.append({"kind": "no_repeat_ngram", "n": whole("no_repeat_ngram_size")})
    if field("bad_words_ids") is not None:
        sequences = [list(s) for s in field("bad_words_ids") if not (len(s) == 1 and s[0] in eos_ids)]
        if sequences:
            specs.append({"kind": "bad_words", "sequences": sequences})
    if eos_ids and field("min_length") is not None and field("min_length") > 0:
        specs.append({"kind": "min_length", "min_length": whole("min_length"), "eos_token_ids": eos_ids})
    if eos_ids and field("min_new_tokens") is not None and field("min_new_tokens") > 0:
        specs.append(
            {
                "kind": "min_new_tokens",
                "min_new_tokens": whole("min_new_tokens"),
                "eos_token_ids": eos_ids,
            }
        )
    if field("forced_bos_token_id") is not None:
        specs.append({"kind": "forced_bos", "bos_token_id": int(field("forced_bos_token_id"))})
    forced_eos = field("forced_eos_token_id")
    if forced_eos is not None:
        max_length = field("max_length")
        if field("max_new_tokens") is not None:
            if prompt_len is None:
                raise ValueError("forced_eos_token_id with max_new_tokens needs prompt_len")
            max_length = prompt_len + field("max_new_tokens")
        forced = [int(e) for e in (forced_eos if isinstance(forced_eos, (list, tuple)) else [forced_eos])]
        specs.append({"kind": "forced_eos", "max_length": int(max_length), "eos_token_ids": forced})
    if field("remove_invalid_values") is True:
        # InfNanRemoveLogitsProcessor: after the forced BOS and EOS, as generate() runs it.
        specs.append({"kind": "inf_nan_remove"})
    decay = field("exponential_decay_length_penalty")
    if decay is not None:
        specs.append(
            {
                "kind": "exponential_decay_length_penalty",
                "start_index": int(decay[0]),
                "decay_factor": float(decay[1]),
                "eos_token_ids": eos_ids,
            }
        )
    if field("suppress_tokens") is not None:
        specs.append({"kind": "ban_tokens", "token_ids": [int(t) for t in field("suppress_tokens")]})
    if field("begin_suppress_tokens") is not None:
        # begin_index: the prompt's length, the spec's default (generate()'s, without a forced BOS).
        specs.append(
            {
                "kind": "suppress_tokens_at_begin",
                "token_ids": [int(t) for t in field("begin_suppress_tokens")],
            }
        )
    if field("do_sample"):
        beams = field("num_beams") or 1
        keep = 1 if beams <= 1 else (len(eos_ids) + 1 if eos_ids else 2)
        if field("temperature") is not None and field("temperature") != 1.0:
            specs.append({"kind": "temperature", "temperature": float(field("temperature"))})
        if field("top_h") is not None:
            specs.append({"kind": "top_h", "top_h": float(field("top_h"))})
        if field("top_k") is not None and field("top_k") != 0:
            specs.append({"kind": "top_k", "k": whole("top_k"), "min_tokens_to_keep": keep})
        if field("top_p") is not None and field("top_p") < 1.0:
            specs.append({"kind": "top_p", "p": float(field("top_p")), "min_tokens_to_keep": keep})
        if field("min_p") is not None:
            specs.append({"kind": "min_p", "p": float(field("min_p")), "min_tokens_to_keep": keep})
        if field("typical_p") is not None and field("typical_p") < 1.0:
            specs.append({"kind": "typical_p", "mass": float(field("typical_p")), "min_tokens_to_keep": keep})
        epsilon = field("epsilon_cutoff")
        if epsilon is not None and 0.0 < epsilon < 1.0:
            specs.append({"kind": "epsilon_cutoff", "epsilon": float(epsilon), "min_tokens_to_keep": keep})
        eta = field("eta_cutoff")
        if eta is not None and 0.0 < eta < 1.0:
            specs.append({"kind": "eta_cutoff", "epsilon": float(eta), "min_tokens_to_keep": keep})
    watermark = field("watermarking_config")
    if watermark is not None:
        if _is_synthid(watermark):
            # SynthIDTextWatermarkLogitsProcessor: after every warper, before the normalization.
            specs.append(
                {
                    "kind": "synthid_watermark",
                    "ngram_len": int(watermark.ngram_len),
                    "keys": [int(k) for k in watermark.keys],
                    "sampling_table_size": int(watermark.sampling_table_size),
                    "sampling_table_seed": int(watermark.sampling_table_seed),
                    "context_history_size": int(watermark.context_history_size),
                    "skip_first_ngram_calls": bool(watermark.skip_first_ngram_calls),
                }
            )
        else:
            # After every warper, sampling or not, as generate() appends it; its vocab is the
            # model's (the spec's default is the engine's).
            spec = {
                "kind": "watermark",
                "greenlist_ratio": float(watermark.greenlist_ratio),
                "bias": float(watermark.bias),
                "hashing_key": int(watermark.hashing_key),
                "seeding_scheme": str(watermark.seeding_scheme),
                "context_width": int(watermark.context_width),
            }
            text_config = getattr(getattr(model, "config", None), "get_text_config", None)
            if text_config is not None:
                spec["vocab_size"] = int(text_config().vocab_size)
            specs.append(spec)
    if field("renormalize_logits") is True:
        # LogitNormalization: always generate()'s last processor.
        specs.append({"kind": "log_softmax"})
    return specs


def _as_generate_resolves(config: Any, model: Any) -> Any:
    """The config with its unset fields filled as ``generate()`` fills them (transformers 5:
    the model's generation config, then the global defaults; older versions keep defaults in
    the config itself)."""
    import copy

    defaults = getattr(type(config), "_get_default_generation_params", None)
    if defaults is None:
        return config
    config = copy.deepcopy(config)
    own = getattr(model, "generation_config", None)
    if own is not None:
        config.update(**own.to_dict(), defaults_only=True, allow_custom_entries=True)
    config.update(**defaults(), defaults_only=True)
    return config
