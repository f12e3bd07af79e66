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

Two engine settings decide what can be exact, and TensorRT-LLM does not tell its processors
either, so both processors take them under TensorRT-LLM's own names, with its defaults:

- ``disable_overlap_scheduler`` (default False: the PyTorch backend's overlap scheduler is on).
  The overlap scheduler calls processors before the previous step's token reaches ``token_ids``,
  and nothing a processor is given holds that token; specs that read the history (grammars,
  penalties, forced sequences, thinking budgets: :func:`logits_processing.reads_history`) would
  run one step late, so they are refused when the processor is made (or the request
  registered). History-free specs (temperature, biases, bans, truncation) are exact either way.
  The C++ runtime has no overlap scheduler: pass ``disable_overlap_scheduler=True`` there.
- ``speculative_config`` (default None). Under speculative decoding TensorRT-LLM calls
  processors once per request without saying which of its rows is which draft, so every spec
  is refused.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, List, Mapping, Optional, Sequence, Union, Unpack

import torch

from .. import _lib
from ._common import (
    EngineKeywords,
    KeyedBatch,
    check_in_process_pipeline,
    context_for,
    no_caller_mask,
    pipeline_reads_history,
    rows_of,
    runs_processors,
)

__all__ = ["TRTLLMLogitsProcessor", "TRTLLMBatchedLogitsProcessor"]

logger = logging.getLogger(__name__)

OVERLAP_REFUSED = (
    "these specs read the token history, and TensorRT-LLM's overlap scheduler (its default) calls "
    "logits processors before the previous step's token is in token_ids, so they would run one "
    "step late; start the engine with LLM(..., disable_overlap_scheduler=True) and pass "
    "disable_overlap_scheduler=True to this processor too (the C++ runtime has no overlap "
    "scheduler: pass it there as well)"
)
SPECULATIVE_REFUSED = (
    "speculative decoding is on (speculative_config), and TensorRT-LLM calls logits processors "
    "once per request without telling its draft rows apart, so no spec can be applied exactly; "
    "serve the model without speculative_config to use specs"
)


def check_settings(pipeline: Any, *, disable_overlap_scheduler: bool, speculative_config: Any) -> None:
    """Refuses, with :class:`logits_processing.SpecError` naming the engine setting, specs that
    these settings would make inexact (see the module's notes)."""
    if speculative_config is not None:
        raise _lib.SpecError(SPECULATIVE_REFUSED)
    if not disable_overlap_scheduler and pipeline_reads_history(pipeline):
        raise _lib.SpecError(OVERLAP_REFUSED)


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
        prompt_len: the prompt's length, where generated ids start in ``token_ids`` (grammars,
            penalties of the output, forced sequences positioned by ``"tokens"``, ...), for
            every request this object serves. Default: each request's first call's length,
            which is right unless the first call already has generated tokens (a decode worker
            after a prefill worker: pass it then).
        context: a :class:`logits_processing.EngineContext` shared by every processor of the
            model, or instead the keywords of :class:`~logits_processing.adapters.EngineKeywords`
            (``tokenizer``, ``vocab_size``, ...) to build one.
        role: ``"aggregated"`` (default), ``"decode"`` or ``"prefill"``; on a prefill worker the
            processor does nothing.
        disable_overlap_scheduler, speculative_config: the engine's settings of these names (see
            the module's notes); specs they would make inexact raise ``SpecError`` here.

    One object may serve several requests (one ``SamplingParams`` given to many prompts): each
    request id has its own state, started at its first call, so every request gives what a fresh
    processor gives. The engine calls every live request once a step, so a request called again
    starts a new round of calls; the state of a request missing from two whole rounds (it has
    finished) is dropped, so memory stays bounded. :meth:`reset` drops all.

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
        role: Any = "aggregated",
        context: Optional[_lib.EngineContext] = None,
        disable_overlap_scheduler: bool = False,
        speculative_config: Any = None,
        **engine: Unpack[EngineKeywords],
    ) -> None:
        self.context = context_for(context, **engine)
        self.pipeline = check_in_process_pipeline(pipeline, engine="TensorRT-LLM")
        if _is_data(self.pipeline):
            self.context.validate(self.pipeline)
        check_settings(
            self.pipeline,
            disable_overlap_scheduler=disable_overlap_scheduler,
            speculative_config=speculative_config,
        )
        self._reads = pipeline_reads_history(self.pipeline)
        self.enabled = runs_processors(role)
        self.prompt_len = prompt_len
        # Per request id: [batch (None once refused), beams, the round of calls that last used it,
        # the length of its last call's ids].
        self._requests: dict = {}
        self._round, self._called = 0, set()
        # A Python step may fail half way through its row; keep a copy to put back then.
        self._backup = not _is_data(self.pipeline)
        #: Reads from the device (waits, see ``adapters._common``): none, ``token_ids`` are host
        #: lists and the edit is queued on the engine's stream.
        self.device_reads = 0

    def reset(self) -> None:
        """Forgets every request's state; each starts again at its next call."""
        self._requests.clear()
        self._round, self._called = 0, set()

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
                if req_id in self._called:
                    self._next_round()
                self._called.add(req_id)
                state = self._requests.get(req_id)
                if state is None or rows.shape[0] != state[1]:
                    state = self._requests[req_id] = [self._start(rows, token_ids), rows.shape[0], 0, -1]
                state[2] = self._round
                have = len(token_ids[0]) if token_ids else 0
                if self._reads and have == state[3]:
                    # Called again with no new id: the ids are a step stale (an overlap scheduler
                    # the settings did not say); the request is left alone from here on.
                    state[0] = None
                    logger.error(
                        "logits_processing: request %s runs unprocessed from here: %s",
                        req_id,
                        OVERLAP_REFUSED,
                    )
                state[3] = have
                if state[0] is None:
                    return
                backup = rows.clone() if self._backup else None
                state[0].apply(rows, token_ids)
        except Exception:  # noqa: BLE001 - log it, leave the row, let the engine go on
            logger.exception(
                "logits_processing: request %s (client %s) left unprocessed this step", req_id, client_id
            )
            if backup is not None:
                with _on_stream(stream_ptr, logits):
                    rows_of(logits).copy_(backup)

    def _start(self, rows: torch.Tensor, token_ids: Sequence[Sequence[int]]) -> _lib.Batch:
        beams, vocab = rows.shape
        prompt_len = self.prompt_len if self.prompt_len is not None else len(token_ids[0])
        batch = self.context.batch(self.context.vocab_size or vocab)
        for beam in range(beams):
            batch.add(beam, self.pipeline, prompt_len=prompt_len)
        return batch

    def _next_round(self) -> None:
        """A request was called again: a new step. Drops the requests missing from the last two
        rounds (finished: live ones are called every step)."""
        self._round += 1
        self._called.clear()
        for req_id in [r for r, state in self._requests.items() if state[2] < self._round - 2]:
            del self._requests[req_id]


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

    ``disable_overlap_scheduler`` and ``speculative_config`` are the engine's settings (see the
    module's notes): specs they would make inexact raise ``SpecError`` when given (constructor,
    :meth:`register`); those a callable returns are refused at the request's first call, its
    rows then left as they were for its whole life (logged once), never processed a step late.
    """

    def __init__(
        self,
        specs: Optional[SpecSource] = None,
        *,
        role: Any = "aggregated",
        context: Optional[_lib.EngineContext] = None,
        disable_overlap_scheduler: bool = False,
        speculative_config: Any = None,
        **engine: Unpack[EngineKeywords],
    ) -> None:
        self.context = context_for(context, **engine)
        self.enabled = runs_processors(role)
        self._settings = dict(
            disable_overlap_scheduler=disable_overlap_scheduler, speculative_config=speculative_config
        )
        self._refused: dict = {}  # request id -> why its specs (from a callable) were refused
        if specs is not None and not callable(specs):
            for one in specs.values():
                check_settings(no_caller_mask(one, "TensorRT-LLM"), **self._settings)
        self._specs: Any = {} if specs is None else specs
        self._prompt_lens: dict = {}
        self.keyed = KeyedBatch(self.context, position="tokens")
        self._warned_no_client = False
        #: Reads from the device (waits, see ``adapters._common``): none, as per request.
        self.device_reads = 0

    def register(self, key: Any, specs: Any, *, prompt_len: Optional[int] = None) -> None:
        """Gives the request with this client id (or request id) its specs, checked now."""
        if not isinstance(self._specs, dict):
            raise _lib.ArgumentTypeError("register() needs the specs given as a mapping (or none)")
        self.context.validate(no_caller_mask(specs, "TensorRT-LLM"))
        check_settings(specs, **self._settings)
        self._specs[key] = specs
        if prompt_len is not None:
            self._prompt_lens[key] = prompt_len

    def unregister(self, key: Any) -> None:
        self._specs.pop(key, None)
        self._prompt_lens.pop(key, None)

    def _lookup(self, req_id: int, client_id: Optional[int]) -> tuple:
        if callable(self._specs):
            if req_id in self._refused:
                return None, None
            specs = self._specs(req_id, client_id)
            if specs is not None:
                try:
                    check_settings(specs, **self._settings)
                except _lib.SpecError as e:
                    self._refused[req_id] = str(e)
                    logger.error("logits_processing: request %s runs unprocessed: %s", req_id, e)
                    return None, None
            return specs, None
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
        if self._refused:  # only requests still running stay refused (memory stays bounded)
            live = set(req_ids)
            self._refused = {r: why for r, why in self._refused.items() if r in live}
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
