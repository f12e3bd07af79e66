"""TensorRT-LLM: the per-request logits-processor callable and the batched one.

TensorRT-LLM calls a per-request processor (``SamplingParams(logits_processor=...)``) as
``(req_id, logits, token_ids, stream_ptr, client_id)`` with ``logits`` shaped ``[beam, 1, vocab]``
(PyTorch backend, whose ``stream_ptr`` and ``client_id`` are None) or ``[1, beam, vocab]`` (C++
runtime) and ``token_ids`` one list per beam; and
a batched processor (``LLM(batched_logits_processor=...)``, opted into per request with
``SamplingParams(apply_batched_logits_processor=True)``) as
``(req_ids, logits_list, token_ids_list, stream_ptr, client_ids)`` once per step for every
opted-in request. Both edit the logits in place, on the engine's CUDA stream when it gives one.

Errors are logged with the request id and leave that request's rows as they were (the reference
swallowed them silently); the engine goes on.

This module imports only torch: TensorRT-LLM accepts any callable with these signatures, so it
does not need to be importable here. See docs/engines/trtllm.md for what was (not) run against it.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, List, Mapping, Optional, Sequence, Union

import torch

from .. import _lib
from ._common import (
    KeyedBatch,
    check_in_process_pipeline,
    context_for,
    decode_specs,
    no_caller_mask,
    rows_of,
    runs_processors,
)

__all__ = ["TRTLLMLogitsProcessor", "TRTLLMBatchedLogitsProcessor"]

logger = logging.getLogger(__name__)


def _on_stream(stream_ptr: Optional[int], tensor: torch.Tensor):
    """Runs the edit on the engine's stream: its work is ordered after the logits were written
    and before they are sampled, without a host synchronization."""
    if not stream_ptr or not tensor.is_cuda:
        return contextlib.nullcontext()
    return torch.cuda.stream(torch.cuda.ExternalStream(stream_ptr, device=tensor.device))


def _is_data(pipeline: Any) -> bool:
    if isinstance(pipeline, (str, bytes, dict)):
        return True
    return isinstance(pipeline, (list, tuple)) and all(isinstance(p, dict) for p in pipeline)


class TRTLLMLogitsProcessor:
    """One request's pipeline as TensorRT-LLM's per-request ``LogitsProcessor``: every beam of the
    request is a row of one ``logits_processing.Batch``, edited in one call.

    Args:
        pipeline: JSON text, a spec dict, or a list of spec dicts, processor objects and callables
            ``(input_ids, logits_row) -> None`` (this object lives in the engine's process, so
            Python processors are allowed here).
        prompt_len: the prompt's length, where generated ids start in ``token_ids`` (forced
            sequences positioned by ``"tokens"``). Default: the first call's length, which is
            right unless the first call already has generated tokens (a decode worker after a
            prefill worker: pass it then).
        vocab_size, tokenizer, model_name, hello_world, thinking_tokens: as
            :class:`logits_processing.adapters.hf.HFLogitsProcessor`.
        role: ``"aggregated"`` (default), ``"decode"`` or ``"prefill"``; on a prefill worker the
            processor does nothing.

    Example::

        from tensorrt_llm import SamplingParams
        from logits_processing.adapters.trtllm import TRTLLMLogitsProcessor
        params = SamplingParams(logits_processor=TRTLLMLogitsProcessor(
            [{"kind": "temperature", "temperature": 0.7}], prompt_len=len(prompt_ids)))
    """

    def __init__(
        self,
        pipeline: Any,
        *,
        prompt_len: Optional[int] = None,
        vocab_size: Optional[int] = None,
        tokenizer: Any = None,
        model_name: Optional[str] = None,
        hello_world: Any = None,
        thinking_tokens: Any = None,
        role: Any = "aggregated",
        context: Optional[_lib.EngineContext] = None,
    ) -> None:
        self.context = context_for(
            context,
            tokenizer=tokenizer,
            model_name=model_name,
            vocab_size=vocab_size,
            hello_world=hello_world,
            thinking_tokens=thinking_tokens,
        )
        self.pipeline = check_in_process_pipeline(pipeline)
        if _is_data(self.pipeline):
            self.context.validate(self.pipeline)
        self.enabled = runs_processors(role)
        self.prompt_len = prompt_len
        self._batch = None
        self._beams = 0
        # A Python step may fail half way through its row; keep a copy to put back then.
        self._backup = not _is_data(self.pipeline)

    def __call__(
        self,
        req_id: int,
        logits: torch.Tensor,
        token_ids: List[List[int]],
        stream_ptr: Optional[int],
        client_id: Optional[int],
    ) -> None:
        if not self.enabled:
            return
        backup = None
        try:
            rows = rows_of(logits)
            with _on_stream(stream_ptr, logits):
                if self._batch is None or rows.shape[0] != self._beams:
                    self._start(rows, token_ids)
                backup = rows.clone() if self._backup else None
                self._batch.apply(rows, token_ids)
        except Exception:  # noqa: BLE001 - log it, leave the row, let the engine go on
            logger.exception(
                "logits_processing: request %s (client %s) left unprocessed this step", req_id, client_id
            )
            if backup is not None:
                with _on_stream(stream_ptr, logits):
                    rows_of(logits).copy_(backup)

    def _start(self, rows: torch.Tensor, token_ids: Sequence[Sequence[int]]) -> None:
        beams, vocab = rows.shape
        prompt_len = self.prompt_len if self.prompt_len is not None else len(token_ids[0])
        batch = self.context.batch(self.context.vocab_size or vocab)
        for beam in range(beams):
            batch.add(beam, self.pipeline, prompt_len=prompt_len)
        self._batch, self._beams, self.prompt_len = batch, beams, prompt_len


SpecSource = Union[Mapping[Any, Any], Callable[[int, Optional[int]], Any]]


class TRTLLMBatchedLogitsProcessor:
    """TensorRT-LLM's batched logits processor: every opted-in request of a step (all their beams)
    in one call into Rust.

    A request's specs are found by ``specs``: a mapping from client id or request id to specs
    (the client id is tried first, then the request id: TensorRT-LLM's PyTorch backend passes
    None for every client id, so register by request id there), or a callable
    ``(req_id, client_id) -> specs or None``; requests without specs are left alone. :meth:`register` adds to the mapping. State is held for exactly the requests of the
    latest call (a request absent from a call has finished, so memory stays bounded), and
    forced sequences count generated tokens (``position: "tokens"``) from the prompt length given
    to :meth:`register`, or else the first call's length.

    The logits of a call arrive as one tensor per request. When they are consecutive slices of one
    buffer (as the runtime lays them out) they are edited there as one block; otherwise they are
    gathered into one block and written back.
    """

    def __init__(
        self,
        specs: Optional[SpecSource] = None,
        *,
        vocab_size: Optional[int] = None,
        tokenizer: Any = None,
        model_name: Optional[str] = None,
        hello_world: Any = None,
        thinking_tokens: Any = None,
        role: Any = "aggregated",
        context: Optional[_lib.EngineContext] = None,
    ) -> None:
        self.context = context_for(
            context,
            tokenizer=tokenizer,
            model_name=model_name,
            vocab_size=vocab_size,
            hello_world=hello_world,
            thinking_tokens=thinking_tokens,
        )
        self.enabled = runs_processors(role)
        self._specs: Any = {} if specs is None else specs
        self._prompt_lens: dict = {}
        self.keyed = KeyedBatch(self.context, position="tokens")
        self._warned_no_client = False

    def register(self, key: Any, specs: Any, *, prompt_len: Optional[int] = None) -> None:
        """Gives the request with this client id (or request id) its specs, checked now."""
        if not isinstance(self._specs, dict):
            raise _lib.ArgumentTypeError("register() needs the specs given as a mapping (or none)")
        self.context.validate(no_caller_mask(decode_specs(specs), "TensorRT-LLM"))
        self._specs[key] = specs
        if prompt_len is not None:
            self._prompt_lens[key] = prompt_len

    def unregister(self, key: Any) -> None:
        self._specs.pop(key, None)
        self._prompt_lens.pop(key, None)

    def _lookup(self, req_id: int, client_id: Optional[int]) -> tuple:
        if callable(self._specs):
            return self._specs(req_id, client_id), None
        for key in (client_id, req_id):
            if key is not None and key in self._specs:
                return self._specs[key], self._prompt_lens.get(key)
        if client_id is None and self._specs and not self._warned_no_client:
            # The PyTorch backend's client ids are all None: specs registered by client id are
            # never found there. Say so once rather than skip them silently.
            self._warned_no_client = True
            logger.warning(
                "logits_processing: request %s has no client id (TensorRT-LLM's PyTorch backend) "
                "and no specs registered under its request id; register specs by request id",
                req_id,
            )
        return None, None

    def __call__(
        self,
        req_ids: List[int],
        logits: List[torch.Tensor],
        token_ids: List[List[List[int]]],
        stream_ptr: Optional[int],
        client_ids: List[Optional[int]],
    ) -> None:
        if not self.enabled or not req_ids:
            return
        views = [rows_of(t) for t in logits]
        requests: list = []
        for req_id, client_id, rows, beams_ids in zip(req_ids, client_ids, views, token_ids):
            specs, prompt_len = self._lookup(req_id, client_id)
            for beam in range(rows.shape[0]):
                if specs is None:
                    requests.append(None)
                    continue
                first = len(beams_ids[beam]) if prompt_len is None else prompt_len
                requests.append(((req_id, beam), specs, first, beams_ids[beam]))
        if all(r is None for r in requests):
            return
        try:
            with _on_stream(stream_ptr, views[0]):
                block, scatter = _as_block(views)
                self.keyed.apply(block, requests)  # logs any request whose specs it refuses
                if scatter:
                    for view, part in zip(views, block.split([v.shape[0] for v in views])):
                        view.copy_(part)
        except Exception:  # noqa: BLE001 - log it, leave the rows, let the engine go on
            logger.exception("logits_processing: requests %s left unprocessed this step", list(req_ids))


def _as_block(views: List[torch.Tensor]) -> tuple:
    """One ``[rows, vocab]`` tensor over all the views: the views' own buffer when they are
    consecutive slices of it (no copy), else a gathered copy (then ``True``: write it back)."""
    first = views[0]
    vocab = first.shape[-1]
    if len(views) == 1:
        return first, False
    step = first.stride(0)
    expected = first.data_ptr()
    item = first.element_size()
    same = all(
        v.device == first.device
        and v.dtype == first.dtype
        and v.stride(-1) == 1
        and (v.shape[0] == 1 or v.stride(0) == step)
        and v.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
        for v in views
    )
    if same:
        for v in views:
            if v.data_ptr() != expected:
                same = False
                break
            expected += v.shape[0] * step * item
    if same:
        rows = sum(v.shape[0] for v in views)
        return first.as_strided((rows, vocab), (step, 1)), False
    return torch.cat(views), True
