"""vLLM: batch-level logits processors driven by JSON specs in ``SamplingParams.extra_args``, for
both of vLLM's model runners.

Load it by name::

    vllm serve MODEL --logits-processors logits_processing.adapters.vllm:VLLMLogitsProcessor

or install the package, whose ``vllm.logits_processors`` entry point loads it in every engine
(both at once is fine: the second instance in an engine does nothing). :class:`VLLMLogitsProcessor`
is a subclass of both runners' interfaces, so both loaders accept it by entry point, by name and
by class; constructing it gives the processor of the runner that builds it:
:class:`VLLMV1LogitsProcessor` for the V1 runner (``(vllm_config, device, is_pin_memory)``) and
:class:`VLLMV2LogitsProcessor` for Model Runner V2 (``(vllm_config, req_states)``), the default
on GPUs since vLLM 0.32.

A request opts in with specs under ``extra_args["logits_processing"]`` (a JSON text or a list of
spec objects), or with Dynamo's entries under ``extra_args["dynamo_logits"]``; requests without
either are not touched and cost nothing. A request re-sent with its generated tokens appended to
its prompt (Dynamo's migration) says where its original prompt ended under
``extra_args["logits_processing_prompt_len"]`` and continues exactly; so does a request vLLM
resumes after preempting it.

Either runner's calls map onto one ``logits_processing.Batch``, so each step crosses into Rust
once for the whole batch, not once per request.

Imports vLLM when this module is imported.
"""

from __future__ import annotations

import logging
import os
import sys
import weakref
from typing import Any, Optional

import numpy as np
import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

try:  # Model Runner V2's interface (vLLM 0.31 and later)
    from vllm.v1.worker.gpu.sample.logits_processor import LogitsContext
    from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor as V2LogitsProcessor
except ImportError:  # an older vLLM: the V1 runner only
    LogitsContext = None
    V2LogitsProcessor = None

from .. import _lib
from ._common import (
    DYNAMO_SPEC_KEY,
    PROMPT_LEN_KEY,
    SPEC_KEY,
    EngineContext,
    KeyedBatch,
    check_prompt_len,
    no_caller_mask,
    normalize_role,
    original_prompt_len,
    request_payload,
    resumed,
    runs_processors,
    validate_structure,
)

__all__ = [
    "DYNAMO_SPEC_KEY",
    "PLACEHOLDER_ID",
    "PROMPT_LEN_KEY",
    "QUALIFIED_NAME",
    "SPEC_KEY",
    "VLLMLogitsProcessor",
    "VLLMV1LogitsProcessor",
    "VLLMV2LogitsProcessor",
    "activate",
    "request_specs",
]

logger = logging.getLogger(__name__)

#: What ``--logits-processors`` takes.
QUALIFIED_NAME = "logits_processing.adapters.vllm:VLLMLogitsProcessor"
#: Overrides the serving role the worker infers from its KV-transfer config.
ROLE_ENV = "LOGITS_PROCESSING_ROLE"
#: What a ``-1`` placeholder (an id sampled but not yet copied back, under async scheduling)
#: becomes in a row's history: an id no spec can name (ids are checked against the vocab), so it
#: counts as one generated token and never as ``<think>``, ``</think>`` or a newline.
PLACEHOLDER_ID = 2**32 - 1

#: Why a request with specs is refused on vLLM's V1 runner while the model is served with
#: ``--speculative-config``.
SPEC_DECODING_REFUSED = (
    "speculative decoding is on for this model (--speculative-config) and it runs on vLLM's V1 "
    "model runner, which itself refuses custom logits processors with it (\"Custom logits "
    "processors are not supported when speculative decoding is enabled\"); serve it on Model "
    "Runner V2 (VLLM_USE_V2_MODEL_RUNNER=1, the default on GPUs), where every draft row is "
    "processed exactly, or without --speculative-config"
)

#: The drafts a step may verify for a request where the speculative config does not say
#: (``num_speculative_tokens``): each pipeline keeps what it needs to resume from that many.
DEFAULT_SPECULATIVE_TOKENS = 16


#: Dynamo's own vLLM adapter. Dynamo's worker adds it to ``logits_processors=`` together with the
#: ``dynamo_logits`` entries it puts on requests (its ``DYNAMO_ENABLE_TEST_LOGITS_PROCESSOR``
#: hook); where it is loaded, it realizes those entries and ours leaves them alone.
DYNAMO_ADAPTER = "dynamo.vllm.logits_processing.adapter:DynamoVllmLogitsProcessor"


def request_specs(params: Optional[SamplingParams], *, dynamo: bool = True) -> Any:
    """The specs a request carries (ours under ``extra_args["logits_processing"]``, Dynamo's
    under ``extra_args["dynamo_logits"]`` unless ``dynamo`` is False), or None when it did not
    opt in."""
    extra = getattr(params, "extra_args", None) if params is not None else None
    return request_payload(extra, dynamo=dynamo)


def _dynamo_adapter_in(model_config: Any) -> bool:
    """Whether Dynamo's own vLLM adapter is among the engine's named logits processors."""
    for entry in getattr(model_config, "logits_processors", None) or ():
        name = entry if isinstance(entry, str) else f"{entry.__module__}:{entry.__qualname__}"
        if name.replace(":", ".") == DYNAMO_ADAPTER.replace(":", "."):
            return True
    return False


def _key_of(params: Optional[SamplingParams]) -> str:
    extra = getattr(params, "extra_args", None) or {}
    return SPEC_KEY if SPEC_KEY in extra else DYNAMO_SPEC_KEY


# The engines that already have a processing instance, by their vllm_config: vLLM builds one
# instance per loaded class, and the entry point plus the same class named in
# logits_processors= loads it twice; every instance after the first must leave logits alone.
_ENGINES: "dict[int, weakref.ref]" = {}

# What the frontend knows about its model (vocab, tokenizer, speculative decoding), by the
# frontend object that validates requests.
_FRONTENDS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _frontend() -> Any:
    """The vLLM frontend object validating the current request (its ``InputProcessor``), found
    on the call stack: vLLM calls ``validate_params(params)`` with the params alone, and the
    model's vocab and speculative-decoding config live on the caller. None when not called
    from one (a direct call, or a vLLM that validates elsewhere)."""
    frame = sys._getframe(2)
    for _ in range(6):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        config = getattr(owner, "vllm_config", None)
        if getattr(config, "model_config", None) is not None:
            return owner
        frame = frame.f_back
    return None


def _speculation(vllm_config: Any) -> Optional[str]:
    """Under speculative decoding, the runner that takes the draft rows (``"v1"`` or ``"v2"``);
    None without speculative decoding."""
    if getattr(vllm_config, "speculative_config", None) is None:
        return None
    return "v2" if getattr(vllm_config, "use_v2_model_runner", False) else "v1"


def _speculative_tokens(vllm_config: Any) -> int:
    """The most drafts a step verifies for a request (0 without speculative decoding)."""
    config = getattr(vllm_config, "speculative_config", None)
    if config is None:
        return 0
    return int(getattr(config, "num_speculative_tokens", None) or DEFAULT_SPECULATIVE_TOKENS)


def _frontend_context(frontend: Any) -> "tuple[EngineContext, Optional[str], bool]":
    """``(the model's EngineContext, the runner under speculative decoding or None, read Dynamo's
    key)`` for a frontend, made once."""
    try:
        known = _FRONTENDS.get(frontend)
    except TypeError:  # not weak-referenceable: no cache
        known = None
    if known is not None:
        return known
    config = frontend.vllm_config
    model_config = config.model_config
    try:
        tokenizer = frontend.tokenizer
    except Exception:  # noqa: BLE001 - skip_tokenizer_init: specs must then carry ids
        tokenizer = None
    context = EngineContext(
        tokenizer=tokenizer,
        model_name=getattr(model_config, "model", None),
        vocab_size=model_config.get_vocab_size(),
    )
    known = (
        context,
        _speculation(config),
        not _dynamo_adapter_in(model_config),
    )
    try:
        _FRONTENDS[frontend] = known
    except TypeError:
        pass
    return known


def activate(params: SamplingParams, specs: Any, *, role: Any = "aggregated", context=None) -> SamplingParams:
    """Puts ``specs`` on a request, the frontend side: as a JSON text under
    ``params.extra_args["logits_processing"]``, merged with any other extra args. On a prefill
    worker nothing is added. With an :class:`~logits_processing.EngineContext`,
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


def validate_request(params: SamplingParams) -> None:
    """Refuses a request whose specs are bad, for either runner (vLLM turns the ``ValueError`` into
    an HTTP 400 naming the field): unknown kind or field, wrong type, bad value, over the size
    limits; and, with the model known (vLLM's frontend), a token id beyond its vocab, a
    ``hello_world`` or id-less thinking budget the tokenizer cannot resolve, a grammar that does
    not compile; and, while speculative decoding is on, every spec on the V1 runner (see
    :data:`SPEC_DECODING_REFUSED`)."""
    refused = None
    try:
        frontend = _frontend()
        context, speculative, dynamo = (
            _frontend_context(frontend) if frontend is not None else (None, None, True)
        )
        specs = request_specs(params, dynamo=dynamo)
        if specs is None:
            return
        decoded = no_caller_mask(validate_structure(specs), "vLLM")
        if speculative == "v1":
            raise ValueError(SPEC_DECODING_REFUSED)
        if context is not None:
            context.validate(decoded)
        try:
            check_prompt_len((params.extra_args or {}).get(PROMPT_LEN_KEY, 0))
        except ValueError as e:
            refused = f"extra_args[{PROMPT_LEN_KEY!r}]: {e}"
    except (TypeError, ValueError) as e:
        refused = f"extra_args[{_key_of(params)!r}]: {e}"
    if refused is not None:
        # Dynamo's frontend answers a worker's refusal with "Invalid request" alone: the
        # worker's log is where an operator finds what was wrong. A SpecError is the
        # ValueError vLLM expects from this hook to refuse a request.
        logger.warning("logits_processing: request refused: %s", refused)
        raise _lib.SpecError(refused)


class _EngineSide:
    """What both runners' processors set up once per engine: the serving role, whether this
    instance is the engine's first (a second one, from the entry point plus the class named in
    ``logits_processors=``, does nothing), which request key to read, and the engine context."""

    def _start(self, vllm_config: Any, runner: str) -> None:
        model_config = getattr(vllm_config, "model_config", None)
        self.role = _role_from_config(vllm_config)
        key = (id(vllm_config), runner)
        first = _ENGINES.get(key)
        self.duplicate_of = first() if first is not None else None
        self.enabled = self.duplicate_of is None and runs_processors(self.role)
        if self.duplicate_of is not None:
            logger.info(
                "logits_processing: %s is loaded twice in this engine (entry point and "
                "logits_processors=); the second instance does nothing",
                QUALIFIED_NAME,
            )
            self.context = None
            return
        # Keeps the config alive with this instance, so its id names this engine only.
        self._vllm_config = vllm_config
        _ENGINES[key] = weakref.ref(self)
        self.speculative = _speculative_tokens(vllm_config)
        self._dynamo_key = not _dynamo_adapter_in(model_config)
        tokenizer = _tokenizer_of(model_config) if self.enabled else None
        self.context = EngineContext(
            tokenizer=tokenizer,
            model_name=getattr(model_config, "model", None),
            vocab_size=model_config.get_vocab_size(),
            speculative_tokens=self.speculative,
        )

    @classmethod
    def validate_params(cls, params: SamplingParams) -> None:
        """See :func:`validate_request`."""
        validate_request(params)


class VLLMV1LogitsProcessor(_EngineSide, LogitsProcessor):
    """vLLM's V1 runner: runs each opted-in request's pipeline on its persistent-batch row.

    ``is_argmax_invariant`` is False: forced tokens and budgets change greedy picks, so vLLM
    calls it for greedy requests too. ``needs_output_token_ids`` is True: histories must be real
    ids, not async scheduling's ``-1`` placeholders (on vLLM versions without that method
    ``update_state`` sets the persistent batch's flag itself; placeholders that still arrive
    count as tokens, see :data:`PLACEHOLDER_ID`). ``validate_params`` refuses bad specs at admission,
    token ids beyond the model's vocab included. Only the first instance in an engine processes;
    a second one (entry point plus the class named in ``logits_processors=``) does nothing.
    """

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.device = device
        self._histories: dict[int, _History] = {}
        #: Reads from the device (waits, see ``adapters._common``): none, the ids are vLLM's
        #: host lists (its persistent batch's output lists).
        self.device_reads = 0
        self._start(vllm_config, "v1")
        self.batch = self.context.batch() if self.context is not None else None
        # vLLM versions without needs_output_token_ids() keep real ids under async scheduling
        # only when a custom processor was named in logits_processors=; loaded by entry point
        # alone, rows get -1 placeholders. On those versions update_state asks the persistent
        # batch for real ids itself (see _ask_for_real_ids).
        self._ask_for_ids = self.enabled and "needs_output_token_ids" not in vars(LogitsProcessor)
        self._asked: Any = None

    def is_argmax_invariant(self) -> bool:
        return False

    def needs_output_token_ids(self) -> bool:
        """Asks vLLM (versions that have this method) for the real generated ids under async
        scheduling: forced sequences by tokens and thinking budgets read them."""
        return self.enabled

    def update_state(self, batch_update: Optional[BatchUpdate]) -> None:
        if self._ask_for_ids:
            self._ask_for_real_ids(sys._getframe(1).f_locals.get("self"))
        if not batch_update or not self.enabled:
            return
        # vLLM's order: removed, then added, then moved.
        for row in batch_update.removed:
            self._drop(row)
        for row, params, prompt, output in batch_update.added:
            self._drop(row)
            specs = request_specs(params, dynamo=self._dynamo_key)
            if specs is None:
                continue
            try:
                specs = no_caller_mask(specs, "vLLM")
                # A migrated request's prompt holds the ids it generated before; a resumed
                # one (preempted by vLLM) has them in its output already.
                prompt_len = original_prompt_len(params.extra_args, len(prompt or ()))
                specs = resumed(specs, prompt_len, len(prompt or ()) + len(output or ()))
                self.batch.add(row, specs, prompt_len=prompt_len)
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

    def _ask_for_real_ids(self, caller: Any) -> None:
        """What ``needs_output_token_ids() -> True`` does on newer vLLM, for versions without
        it: vLLM's persistent batch (``InputBatch.refresh_metadata`` is our caller) fills in
        async scheduling's placeholders before the sampler runs only while its
        ``logitsprocs_need_output_token_ids`` is set, and sets it only for processors named in
        ``logits_processors=``. Set it here, before this step's sampling metadata is built."""
        if caller is self._asked:
            return
        self._asked = caller
        if getattr(caller, "logitsprocs_need_output_token_ids", True) is False:
            caller.logitsprocs_need_output_token_ids = True
            logger.debug("logits_processing: asked vLLM's persistent batch for real output ids")
        elif not hasattr(caller, "logitsprocs_need_output_token_ids"):
            logger.warning(
                "logits_processing: cannot ask this vLLM for real output ids; under async "
                "scheduling a row's newest id may be a placeholder (counted as a token, never "
                "as </think> or a newline). Name %s in logits_processors= to be sure.",
                QUALIFIED_NAME,
            )

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
    last id changed (a preempted request resumed, a corrected placeholder), it is copied again.
    A ``-1`` placeholder is held as :data:`PLACEHOLDER_ID` until vLLM fills in the real id."""

    __slots__ = ("ids", "prompt_len", "output")

    def __init__(self, prompt: Optional[list], output: list) -> None:
        self.ids = list(prompt or ())
        self.prompt_len = len(self.ids)
        self.output = output

    def current(self) -> list:
        ids, output, start = self.ids, self.output, self.prompt_len
        have = len(ids) - start
        if len(output) < have or (have and ids[-1] != _real(output[have - 1])):
            del ids[start:]
            have = 0
        if len(output) > have:
            ids.extend(_real(t) for t in output[have:])
        return ids


def _real(token: int) -> int:
    return PLACEHOLDER_ID if token < 0 else token


class _Slot:
    """One request in a Model Runner V2 slot: its specs, where its prompt ends, and its committed
    ids read back from the device so far (only for specs that read them)."""

    __slots__ = ("key", "specs", "prompt_len", "prefill_len", "ids")

    def __init__(self, key: int, specs: Any, prompt_len: int, prefill_len: int, reads: bool) -> None:
        self.key = key
        self.specs = specs
        self.prompt_len = prompt_len
        self.prefill_len = prefill_len
        # None: the specs read no history, and the row is planned without waiting for the device.
        self.ids: Optional[list] = [] if reads else None


_NO_IDS: list = []


class VLLMV2LogitsProcessor(_EngineSide, *((V2LogitsProcessor,) if V2LogitsProcessor else ())):
    """vLLM's Model Runner V2 (the default on GPUs since vLLM 0.32): runs each opted-in request's
    pipeline on the rows of its slot, draft rows included.

    V2 hands over its request slots' on-device history (``req_states``) once, calls
    :meth:`add_request` when a request takes a slot (slots are recycled: the slot's state is
    built afresh there) and :meth:`apply` once per step (or once per chunk of requests) with that
    step's rows mapped to slots. Rows of requests without specs are not touched and cost nothing
    (``add_request`` returns False for them). A row whose request is still prefilling (its sample
    is discarded) is left alone. A request resumed after preemption (its prefill holds its earlier
    output) or re-sent with ``logits_processing_prompt_len`` continues exactly.

    **Speculative decoding.** A request owns one row per draft position: row ``j`` of a request
    is sampled after its committed ids (``all_token_ids[slot, :total_len]``) and the drafts fed at
    its rows ``1..j`` (``ctx.input_ids``). Each row gets the plan the request's pipeline makes for
    that history: the rows are planned depth by depth (every request's row 0, then every row 1,
    ...), one batch call each, so a pipeline steps through its drafts as through tokens it
    generated (a grammar's matcher advances through them). The next step's committed ids hold
    only the drafts the engine accepted: where they part from the drafts planned, each processor
    rolls back to the ids they share (a grammar's matcher rolls back; processors that keep
    counts read the ids again; those whose next step reads what the previous step's pass saw,
    mirostat's ``mu`` or a phrase trigger, resume from what their pipeline kept after each draft
    row: see ``EngineContext(speculative_tokens=)``), so a rejected draft leaves no trace. Rows
    after a ``-1`` placeholder draft (a step that starts inside the prefill) are left alone: the
    rejection sampler rejects such drafts, so those rows are never sampled.

    **Device reads.** Rows whose specs read no history (temperature, biases, bans, allowed ids,
    truncation: :func:`logits_processing.reads_history`) are planned without waiting for the
    device when the step has no draft rows. Otherwise a call copies back, in one gather and one
    wait for the step that sampled them, everything it needs: the committed ids new since each
    reading request's last step, and under speculative decoding each slot's ``total_len`` and
    the rows' local positions and drafts (:attr:`device_reads` counts these copies).
    """

    def __init__(self, vllm_config: Any, req_states: Any) -> None:
        self.req_states = req_states
        self.slots: dict[int, _Slot] = {}
        self._generation = 0
        #: Calls that copied ids back from the device (each is one gather and one wait).
        self.device_reads = 0
        self._start(vllm_config, "v2")
        self._keys: set = set()
        self.batch = (
            KeyedBatch(self.context, position="tokens", running=self._keys.__contains__)
            if self.context is not None
            else None
        )

    def add_request(self, req_idx: int, sampling_params: SamplingParams) -> bool:
        gone = self.slots.pop(req_idx, None)
        if gone is not None:
            self._keys.discard(gone.key)
        if not self.enabled:
            return False
        specs = request_specs(sampling_params, dynamo=self._dynamo_key)
        if specs is None:
            return False
        try:
            specs = no_caller_mask(specs, "vLLM")
            reads = _lib.reads_history(specs)
            prompt = int(self.req_states.prompt_len.np[req_idx])
            prompt_len = original_prompt_len(sampling_params.extra_args, prompt)
        except Exception as e:  # noqa: BLE001 - one bad request must not stop the engine
            logger.error("logits_processing: request in slot %d runs unprocessed: %s", req_idx, e)
            return False
        self._generation += 1
        prefill_len = int(self.req_states.prefill_len.np[req_idx])
        self.slots[req_idx] = _Slot(self._generation, specs, prompt_len, prefill_len, reads)
        self._keys.add(self._generation)
        return True

    def apply(self, logits: torch.Tensor, ctx: Any) -> torch.Tensor:
        if not self.slots:
            return logits
        slots = np.asarray(ctx.idx_mapping_np)
        n, rows = len(slots), logits.shape[0]
        mine = [(i, slot, self.slots[slot]) for i, slot in enumerate(slots.tolist()) if slot in self.slots]
        if not mine:
            return logits
        upper = np.asarray(ctx.seq_lens_upper_bound_np)
        drafts = rows != n
        # Without speculative decoding a request's upper bound is its row's length, and its
        # committed ids are read only when some are new; with it, only the device knows.
        exact = not (self.speculative or drafts)
        readers = [
            (i, slot, entry)
            for i, slot, entry in mine
            if entry.ids is not None
            and int(upper[i]) >= entry.prefill_len  # else a prefill chunk: left alone
            and (not exact or len(entry.ids) != int(upper[i]))
        ]
        committed = dict.fromkeys((slot for _, slot, _ in readers), None)
        local = inputs = None
        if drafts or readers:
            local, inputs = self._read(ctx, readers, upper, exact, rows if drafts else 0, committed)
        if drafts:
            starts = np.flatnonzero(np.asarray(local) == 0)
            counts = np.diff(np.append(starts, rows))
        else:
            starts = np.arange(n)
            counts = np.ones(n, dtype=np.int64)
        # Per request: how many of its rows to process (1 + its leading real drafts).
        work = []
        for i, slot, entry in mine:
            start, count = int(starts[i]), int(counts[i])
            if int(upper[i]) - (count - 1) < entry.prefill_len:  # a prefill chunk
                continue
            depth = 1
            while depth < count and inputs[start + depth] >= 0:
                depth += 1
            work.append((start, depth, entry, committed.get(slot)))
        for _, _, entry, length in work:
            if entry.ids is not None and length is not None:
                del entry.ids[length:]
        uniform = drafts and len(set(counts.tolist())) == 1 and logits.is_contiguous()
        deepest = max((depth for _, depth, _, _ in work), default=0)
        held = [(entry, len(entry.ids)) for _, depth, entry, _ in work if depth > 1 and entry.ids is not None]
        try:
            for j in range(deepest):
                members = [(start, entry) for start, depth, entry, _ in work if depth > j]
                if j:  # the history of row j: the committed ids and the drafts at rows 1..j
                    for start, entry in members:
                        if entry.ids is not None:
                            entry.ids.append(int(inputs[start + j]))
                self._apply_depth(logits, j, members, drafts, uniform, int(counts[0]))
        finally:
            for entry, length in held:  # the drafts are not committed
                del entry.ids[length:]
        return logits

    def _apply_depth(self, logits, j, members, drafts, uniform, per_request) -> None:
        """One batch call for the rows at offset ``j`` of their requests (``members``: each
        request's first row and its slot entry): in place on ``logits`` when the rows are
        evenly spaced (without drafts, or every request with as many), else on a gathered copy
        written back."""
        def request(entry):
            ids = entry.ids if entry.ids is not None else _NO_IDS
            return (entry.key, entry.specs, entry.prompt_len, ids, entry.key)

        if not drafts or uniform:
            block = logits if not drafts else logits.view(-1, per_request, logits.shape[-1])[:, j]
            requests: list = [None] * block.shape[0]
            for start, entry in members:
                requests[start // per_request if drafts else start] = request(entry)
            self.batch.apply(block, requests)
            return
        index = _on_device(np.array([start + j for start, _ in members]), logits.device)
        block = logits.index_select(0, index)
        self.batch.apply(block, [request(entry) for _, entry in members])
        logits.index_copy_(0, index, block)

    def _read(self, ctx, readers, upper, exact, rows, committed) -> "tuple[Optional[list], Optional[list]]":
        """Copies back, in one gather and one wait, the rows' local positions and fed ids (the
        first ``rows`` of each, when the step has draft rows) and each reader's committed ids
        new since its last step: read up to its upper bound (the row's length without
        speculative decoding), with its ``total_len`` beside them where that bound may be past
        it. Extends each reader's ids by its committed ones and sets ``committed[slot]`` to its
        committed length. Returns the local positions and the fed ids (None without draft
        rows). The gathers' index goes to the device without waiting (:func:`_on_device`): the
        one wait is the read back, for the step that sampled the ids."""
        tokens = self.req_states.all_token_ids.gpu
        device = tokens.device
        parts = []
        if rows:
            parts.append(ctx.expanded_local_pos[:rows].to(device=device, dtype=torch.int64))
            parts.append(ctx.input_ids[:rows].to(device=device, dtype=torch.int64))
        spans = []
        if readers:
            width = tokens.shape[1]
            stride = tokens.stride(0)
            for i, slot, entry in readers:
                spans.append((slot, entry, len(entry.ids), min(int(upper[i]), width)))
            slots = np.array([slot for slot, *_ in spans] if not exact else [], dtype=np.int64)
            index = np.concatenate(
                [np.arange(slot * stride + have, slot * stride + bound) for slot, _, have, bound in spans]
            )
            if len(slots) or len(index):
                where = _on_device(np.concatenate([slots, index]), device)
                if len(slots):
                    totals = self.req_states.total_len.gpu.index_select(0, where[: len(slots)])
                    parts.append(totals.to(torch.int64))
                if len(index):
                    parts.append(tokens.view(-1).index_select(0, where[len(slots) :]).to(torch.int64))
        values = torch.cat(parts).tolist() if parts else []
        self.device_reads += 1
        at = 0
        local = inputs = None
        if rows:
            local, inputs = values[:rows], values[rows : 2 * rows]
            at = 2 * rows
        totals = [None] * len(spans)
        if spans and not exact:
            totals = values[at : at + len(spans)]
            at += len(spans)
        for (slot, entry, have, bound), total in zip(spans, totals):
            length = bound if total is None else min(int(total), max(have, bound))
            entry.ids.extend(values[at : at + max(0, length - have)])
            at += max(0, bound - have)
            committed[slot] = length
        return local, inputs


def _on_device(values: np.ndarray, device: torch.device) -> torch.Tensor:
    """``values`` as int64 on ``device``, without waiting for it: copied from pinned memory with
    a non-blocking copy (a copy from pageable memory waits for the work queued on the device,
    the forward pass; PyTorch's pinned-memory cache keeps the block until the copy is done)."""
    host = torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64))
    if device.type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)


class VLLMLogitsProcessor(LogitsProcessor, *((V2LogitsProcessor,) if V2LogitsProcessor else ())):
    """The class to name: a subclass of both runners' interfaces, so vLLM's V1 and V2 loaders
    both accept it (by the package's entry point, by :data:`QUALIFIED_NAME` and by class).
    Constructing it gives the building runner's own processor: ``(vllm_config, device,
    is_pin_memory)`` a :class:`VLLMV1LogitsProcessor`, ``(vllm_config, req_states)`` a
    :class:`VLLMV2LogitsProcessor`."""

    def __new__(cls, vllm_config: Any, *args: Any, **kwargs: Any) -> Any:
        if "req_states" in kwargs or (len(args) == 1 and hasattr(args[0], "all_token_ids")):
            return VLLMV2LogitsProcessor(vllm_config, *args, **kwargs)
        return VLLMV1LogitsProcessor(vllm_config, *args, **kwargs)

    @classmethod
    def validate_params(cls, params: SamplingParams) -> None:
        """See :func:`validate_request`."""
        validate_request(params)
