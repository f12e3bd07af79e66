"""vLLM (v1): a batch-level logits processor driven by JSON specs in ``SamplingParams.extra_args``.

Load it by name::

    vllm serve MODEL --logits-processors logits_processing.adapters.vllm:VLLMLogitsProcessor

or install the package, whose ``vllm.logits_processors`` entry point loads it in every engine.
A request opts in with specs under ``extra_args["logits_processing"]`` (a JSON text or a list of
spec objects); requests without the key are not touched and cost nothing.

vLLM calls :meth:`VLLMLogitsProcessor.update_state` with the persistent batch's changes (rows
added, removed, moved or swapped) and :meth:`VLLMLogitsProcessor.apply` once per step with the
``[rows, vocab]`` logits; both map onto one ``logits_processing.Batch``, so each step crosses
into Rust once for the whole batch, not once per request.

Imports vLLM when this module is imported.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Optional

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from ._common import (
    SPEC_KEY,
    EngineContext,
    decode_specs,
    normalize_role,
    runs_processors,
    validate_structure,
)

__all__ = ["VLLMLogitsProcessor", "QUALIFIED_NAME", "SPEC_KEY", "activate", "request_specs"]

logger = logging.getLogger(__name__)

#: What ``--logits-processors`` takes.
QUALIFIED_NAME = "logits_processing.adapters.vllm:VLLMLogitsProcessor"
#: Overrides the serving role the worker infers from its KV-transfer config.
ROLE_ENV = "LOGITS_PROCESSING_ROLE"


def request_specs(params: Optional[SamplingParams]) -> Any:
    """The specs a request carries, or None when it did not opt in."""
    extra = getattr(params, "extra_args", None) if params is not None else None
    if not extra:
        return None
    return extra.get(SPEC_KEY)


def activate(params: SamplingParams, specs: Any, *, role: Any = "aggregated", context=None) -> SamplingParams:
    """Puts ``specs`` on a request, the frontend side: as a JSON text under
    ``params.extra_args["logits_processing"]``, merged with any other extra args. On a prefill
    worker nothing is added. With an :class:`~logits_processing.adapters.EngineContext`,
    ``hello_world`` and thinking-token defaults are resolved to ids first."""
    if not runs_processors(role):
        return params
    from ._common import encode_specs

    if context is not None:
        specs = context.resolve_specs(specs)
    params.extra_args = {**(params.extra_args or {}), SPEC_KEY: encode_specs(specs)}
    return params


def _role_from_config(vllm_config: Any) -> str:
    if os.environ.get(ROLE_ENV):
        return normalize_role(os.environ[ROLE_ENV])
    kv = getattr(vllm_config, "kv_transfer_config", None)
    kv_role = getattr(kv, "kv_role", None)
    # A pure KV producer is a prefill worker; a consumer decodes; "kv_both" may do either and
    # runs processors (set LOGITS_PROCESSING_ROLE=prefill on a prefill-only worker).
    return {"kv_producer": "prefill", "kv_consumer": "decode"}.get(kv_role, "aggregated")


def _tokenizer_of(model_config: Any) -> Any:
    name = getattr(model_config, "tokenizer", None)
    if not name:
        return None
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(
            name,
            revision=getattr(model_config, "tokenizer_revision", None),
            trust_remote_code=bool(getattr(model_config, "trust_remote_code", False)),
        )
    except Exception as e:  # noqa: BLE001 - hello_world / default thinking tokens then need ids
        logger.warning(
            "logits_processing: no tokenizer from %r (%s); hello_world specs and "
            "thinking budgets without ids will be rejected",
            name,
            e,
        )
        return None


class VLLMLogitsProcessor(LogitsProcessor):
    """vLLM v1 logits processor running each opted-in request's pipeline on its batch row.

    ``is_argmax_invariant`` is False: forced tokens and budgets change greedy picks, so vLLM
    calls it for greedy requests too. Token ids are checked against the model's vocab when a
    request joins the batch (``validate_params`` runs in the frontend, which does not know the
    model, and checks everything else); a request whose specs fail there is logged with its row
    and runs unprocessed rather than failing the whole step.
    """

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        model_config = getattr(vllm_config, "model_config", None)
        vocab = model_config.get_vocab_size()
        self.role = _role_from_config(vllm_config)
        self.enabled = runs_processors(self.role)
        tokenizer = _tokenizer_of(model_config) if self.enabled else None
        self.context = EngineContext.resolve(
            tokenizer=tokenizer, model_name=getattr(model_config, "model", None), vocab_size=vocab
        )
        self.batch = self.context.batch()
        self.device = device
        # row -> the request's ids; the Batch holds the pipelines.
        self._histories: dict[int, _History] = {}

    @classmethod
    def validate_params(cls, params: SamplingParams) -> None:
        """Rejects a request whose specs are malformed (vLLM turns the ``ValueError`` into an
        HTTP 400): unknown kind or field, wrong type, bad value, over the size limits."""
        specs = request_specs(params)
        if specs is None:
            return
        try:
            validate_structure(specs)
        except TypeError as e:
            raise ValueError(f"extra_args[{SPEC_KEY!r}]: {e}") from None
        except ValueError as e:
            raise ValueError(f"extra_args[{SPEC_KEY!r}]: {e}") from None

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: Optional[BatchUpdate]) -> None:
        if not batch_update or not self.enabled:
            return
        # vLLM's order: removed, then added, then moved.
        for row in batch_update.removed:
            self._drop(row)
        for row, params, prompt, output in batch_update.added:
            self._drop(row)
            specs = request_specs(params)
            if specs is None:
                continue
            try:
                self.batch.add(row, decode_specs(specs), prompt_len=len(prompt or ()))
            except Exception as e:  # noqa: BLE001 - one bad request must not stop the engine
                logger.error("logits_processing: request at row %d runs unprocessed: %s", row, e)
                continue
            self._histories[row] = _History(prompt, output)
        for a, b, direction in batch_update.moved:
            if direction == MoveDirectionality.SWAP:
                self.batch.swap(a, b)
                ha, hb = self._histories.pop(a, None), self._histories.pop(b, None)
                if ha is not None:
                    self._histories[b] = ha
                if hb is not None:
                    self._histories[a] = hb
            else:
                self.batch.move(a, b)
                self._histories.pop(b, None)
                moving = self._histories.pop(a, None)
                if moving is not None:
                    self._histories[b] = moving

    def _drop(self, row: int) -> None:
        if self._histories.pop(row, None) is not None:
            self.batch.remove(row)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self._histories:
            return logits
        ids: list = [None] * logits.shape[0]
        for row, history in self._histories.items():
            ids[row] = history.current()
        self.batch.apply(logits, ids)
        return logits


class _History:
    """One request's ids (prompt, then vLLM's live output list), kept in one list that grows by
    the new output ids each step: O(new ids) per step, not O(history), and the core sees ids that
    extend the previous call's (so it reads only the new ones). If the output list shrank or its
    last id changed (a preempted request resumed, a corrected placeholder), it is copied again."""

    __slots__ = ("ids", "prompt_len", "output")

    def __init__(self, prompt: Optional[list], output: list) -> None:
        self.ids = list(prompt or ())
        self.prompt_len = len(self.ids)
        self.output = output

    def current(self) -> list:
        ids, output, start = self.ids, self.output, self.prompt_len
        have = len(ids) - start
        if len(output) < have or (have and ids[-1] != output[have - 1]):
            del ids[start:]
            have = 0
        if len(output) > have:
            ids.extend(output[have:])
        return ids
