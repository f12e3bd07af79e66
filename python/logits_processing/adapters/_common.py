"""What every engine adapter shares: the request key, the spec payload, the serving role and the
engine context (:class:`EngineContext`, built once per engine in Rust).

**Waits.** Every adapter object counts, in its ``device_reads`` attribute, the reads it has made
from the device to the host (a ``.cpu()``, ``.tolist()`` or ``.item()`` of a device tensor, an
event waited on), each one wait for the device on a GPU, counted where it is made, in the
device branch (which ``LOGITS_PROCESSING_DEVICE=interpret`` runs on host tensors). Rows whose
specs read no history (:func:`logits_processing.reads_history`) never make one; rows that do
read only their ids new since their last step, in at most one read a step. The device path's
own copies (the host round trip, docs/cuda.md) are not the adapter's and not counted here.

Nothing here imports an engine, torch or transformers.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Callable, Mapping, Optional, Sequence, Tuple, TypedDict

from .. import _lib

logger = logging.getLogger("logits_processing.adapters")


def takes_device_path(tensor: Any) -> bool:
    """Whether a step on `tensor` takes the device path, and the adapter its device branch: a
    tensor on a device, or any tensor under ``LOGITS_PROCESSING_DEVICE=interpret`` (the setting
    that sends host tensors down the device path, the Triton kernels run by Triton's interpreter:
    how the tests run the device branches without a GPU)."""
    return tensor.device.type != "cpu" or os.environ.get("LOGITS_PROCESSING_DEVICE") == "interpret"

#: The key a request's specs travel under: ``SamplingParams.extra_args`` (vLLM),
#: ``sampling_params["custom_params"]`` (SGLang). Its value is a JSON text (or the decoded
#: list / object) of specs: data only, never code.
SPEC_KEY = "logits_processing"

#: The key Dynamo's own adapters read (``extra_args["dynamo_logits"]`` for vLLM,
#: ``custom_params["dynamo_logits"]`` for SGLang): a list of entries such as
#: ``{"kind": "forced_sequence", "token_ids": [...], "eos_token_id": 2}``. Accepted beside
#: :data:`SPEC_KEY` so a Dynamo frontend's requests run unchanged.
DYNAMO_SPEC_KEY = "dynamo_logits"
#: The request id Dynamo's SGLang adapter puts beside its entries.
DYNAMO_UID_KEY = "dynamo_uid"
#: Beside the specs: where the request's original prompt ends (an int). A request re-sent with
#: the tokens it has generated appended to its prompt (Dynamo's migration to another worker)
#: carries nothing else that says so; with this key its processors continue where they were
#: instead of starting over. Set it to the prompt's length when the request is first sent.
PROMPT_LEN_KEY = "logits_processing_prompt_len"

#: Serving roles that generate tokens, where processors run.
GENERATION_ROLES = frozenset({"aggregated", "decode"})
#: Every role we know. A prefill worker never runs processors.
ROLES = GENERATION_ROLES | {"prefill"}
_ROLE_ALIASES = {"agg": "aggregated", "both": "aggregated", "null": "aggregated", "none": "aggregated"}


def normalize_role(role: Any) -> str:
    """Returns ``"aggregated"``, ``"decode"`` or ``"prefill"`` for a role given as a string, an
    enum (its name or value is read, so Dynamo's ``DisaggregationMode`` works) or ``None``
    (aggregated). Anything else is a ``ValueError`` naming the role."""
    if role is None:
        return "aggregated"
    for candidate in (role, getattr(role, "value", None), getattr(role, "name", None)):
        if isinstance(candidate, str):
            name = candidate.strip().lower()
            name = _ROLE_ALIASES.get(name, name)
            if name in ROLES:
                return name
    raise ValueError(f"unknown serving role {role!r}; expected one of {sorted(ROLES)}")


def runs_processors(role: Any) -> bool:
    """True on generation roles (aggregated, decode); False on a prefill worker."""
    return normalize_role(role) in GENERATION_ROLES


def decode_specs(payload: Any) -> Any:
    """The specs in a request payload: a JSON text is parsed; a list or a dict is taken as is.

    Raises ``SpecError`` (a ``ValueError``) for text that is not JSON (or bytes that are not
    UTF-8) and ``ArgumentTypeError`` (a ``TypeError``) for anything that is not data (a Python
    callable cannot cross a process boundary)."""
    from logits_processing import ArgumentTypeError, SpecError

    if isinstance(payload, (bytes, bytearray)):
        try:
            payload = bytes(payload).decode("utf-8")
        except UnicodeDecodeError as e:
            raise SpecError(f"spec: not UTF-8 text: {e.reason} at byte {e.start}") from None
    if isinstance(payload, str):
        try:
            return json.loads(payload)
        except (ValueError, RecursionError) as e:
            raise SpecError(f"spec: not JSON: {type(e).__name__}: {e}") from None
    if isinstance(payload, Mapping):
        return dict(payload)
    if isinstance(payload, (list, tuple)):
        for i, item in enumerate(payload):
            if not isinstance(item, Mapping):
                raise ArgumentTypeError(
                    f"spec [{i}]: only JSON specs ({{'kind': ...}}) travel with a request, found "
                    f"{type(item).__name__}; run Python processors in-process (HF, TRT-LLM)"
                )
        return [dict(item) for item in payload]
    raise ArgumentTypeError(
        f"specs must be a JSON text, a spec object or a list of them, found {type(payload).__name__}"
    )


def no_caller_mask(specs: Any, engine: str = "this engine") -> Any:
    """``specs``, refused (``SpecError`` naming the spec's ``kind``) when one of them takes the
    caller's mask each step (``{"kind": "bitmask"}``): ``engine`` gives none, and every step of
    its batch would fail. A ``grammar`` spec constrains the output instead."""
    _lib._refuse_caller_mask(specs, engine)
    return specs


def check_in_process_pipeline(pipeline: Any, name: str = "pipeline", *, engine: str) -> Any:
    """A pipeline for an adapter that runs in the engine's process (HF, TRT-LLM), checked when it
    is given rather than at the first step: JSON text or bytes (decoded here), a spec dict, or a
    list of spec dicts, processor objects and callables. Raises ``SpecError`` for data that is
    not a spec or a spec that needs a mask ``engine`` does not give (see :func:`no_caller_mask`),
    and ``ArgumentTypeError`` for an entry that is none of these."""
    from logits_processing import ArgumentTypeError

    if isinstance(pipeline, (str, bytes, bytearray)):
        return no_caller_mask(decode_specs(pipeline), engine)
    entries = pipeline if isinstance(pipeline, (list, tuple)) else [pipeline]
    for i, entry in enumerate(entries):
        if not (isinstance(entry, (str, Mapping)) or callable(entry)):
            where = f"{name}[{i}]" if entries is pipeline else name
            raise ArgumentTypeError(
                f"{where} must be a spec (a dict or JSON text), a processor or a callable, found "
                f"{type(entry).__name__}"
            )
    return no_caller_mask(pipeline, engine)


def pipeline_reads_history(pipeline: Any) -> bool:
    """Whether a pipeline (specs, or in-process entries: processor objects and callables) reads
    the token history: the core decides for specs; a Python processor or callable is given the
    ids, so it does."""
    items = pipeline if isinstance(pipeline, (list, tuple)) else [pipeline]
    data = [p for p in items if isinstance(p, (str, bytes, dict))]
    if len(data) != len(items):
        return True
    return bool(_lib.reads_history(data))


def _dynamo_entries(payload: Any) -> list:
    """Dynamo's entries as our specs: a list of entries, or its ``LogitsProcessorSpec`` written
    out as ``{"entries": [...], "generation_only": ...}``; the ``generation_only`` marking is
    dropped from each entry (processors here never run on a prefill worker, whatever it says)."""
    decoded = decode_specs(payload)
    if isinstance(decoded, dict) and "entries" in decoded and "kind" not in decoded:
        extra = set(decoded) - {"entries", "generation_only"}
        if extra:
            from logits_processing import ArgumentTypeError

            raise ArgumentTypeError(f"{DYNAMO_SPEC_KEY}: unknown field(s) {sorted(extra)}")
        decoded = decode_specs(decoded["entries"])
    items = decoded if isinstance(decoded, list) else [decoded]
    return [{k: v for k, v in item.items() if k != "generation_only"} for item in items]


def request_payload(container: Any, *, dynamo: bool = True) -> Any:
    """The specs a request carries in ``container`` (vLLM's ``extra_args``, SGLang's
    ``custom_params``), or None when it did not opt in: ours under :data:`SPEC_KEY` as given
    (a JSON text, a spec object or a list), Dynamo's under :data:`DYNAMO_SPEC_KEY` as a list of
    specs (unless ``dynamo`` is False: Dynamo's own adapter is in the engine and realizes them);
    both present: ours first, then Dynamo's."""
    if not container:
        return None
    ours = container.get(SPEC_KEY)
    theirs = container.get(DYNAMO_SPEC_KEY) if dynamo else None
    if not theirs:  # Dynamo sends nothing (or clears it) when a request has no entries
        return ours
    theirs = _dynamo_entries(theirs)
    if ours is None:
        return theirs
    ours = decode_specs(ours)
    return (ours if isinstance(ours, list) else [ours]) + theirs


def original_prompt_len(container: Any, prompt_len: int) -> int:
    """Where the request's original prompt ends in a prompt of ``prompt_len`` ids: the
    :data:`PROMPT_LEN_KEY` value in ``container`` (vLLM's ``extra_args``, SGLang's
    ``custom_params``) when present, else ``prompt_len``. Raises ``ValueError`` naming the key
    for a value that is not a whole number or lies beyond the prompt."""
    value = container.get(PROMPT_LEN_KEY) if container else None
    if value is None:
        return prompt_len
    try:
        check_prompt_len(value)
        if value > prompt_len:
            raise ValueError(f"{value} is beyond the request's prompt of {prompt_len} ids")
    except ValueError as e:
        raise ValueError(f"{PROMPT_LEN_KEY}: {e}") from None
    return value


def check_prompt_len(value: Any) -> None:
    """Refuses a :data:`PROMPT_LEN_KEY` value that is not a whole number >= 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"expected a whole number >= 0, found {value!r}")


def resumed(specs: Any, original_len: int, ids_at_admission: int) -> Any:
    """The specs of a request admitted with ``ids_at_admission`` ids of which the first
    ``original_len`` are its prompt: unchanged when nothing was generated yet; else with
    forced sequences positioned by tokens, which in an uninterrupted run is the number of calls,
    so that a migrated or resumed request forces the token it was at, not its first one."""
    if ids_at_admission <= original_len:
        return specs
    return with_position(specs, "tokens")


def validate_structure(specs: Any) -> Any:
    """Checks everything about specs that does not depend on the engine (kinds, fields, types,
    values, size limits), where the engine is not known yet (a frontend, a client): ``hello_world``
    and thinking budgets without ids are accepted, as they will get the engine's ids
    (``EngineContext.structure_only()``). Returns the decoded specs; raises ``SpecError`` naming
    the field, ``TypeError`` for non-data."""
    decoded = decode_specs(specs)
    _lib.validate_specs(decoded, context=_lib.EngineContext.structure_only())
    return decoded


def encode_specs(specs: Any) -> str:
    """The JSON text carried by a request: compact, data only. Checks the structure (not the
    vocab, which only the engine knows) so a bad spec fails where it is written."""
    return json.dumps(validate_structure(specs), separators=(",", ":"))


def with_position(specs: Any, position: str) -> list:
    """The specs positioned by ``position``: with ``"tokens"``, every step that counts its calls
    counts generated tokens instead (the core's ``position_by_tokens``: forced sequences and
    ``hello_world``), so that a pipeline rebuilt from the token ids (SGLang, a resumed
    request) picks up where the request is; with ``"calls"`` (the default of every kind), as
    they are. Raises ``SpecError`` for specs that do not parse."""
    decoded = decode_specs(specs)
    if position == "tokens":
        return _lib.position_by_tokens(decoded)
    if position == "calls":
        return decoded if isinstance(decoded, list) else [decoded]
    raise ValueError(f"position must be 'calls' or 'tokens', got {position!r}")


def thinking_tokens_for(tokenizer: Any = None, model_name: Optional[str] = None):
    """The model's thinking tokens as an :class:`EngineContext` derives them (the core's rule:
    the tokenizer's single tokens, else the name table); None when neither knows."""
    if model_name is None and tokenizer is None:
        return None
    return _lib.EngineContext(tokenizer, model_name=model_name, vocab=False).thinking_tokens


#: The engine context every adapter takes (the core's, as the package exports it): explicit
#: values win, the rest come from the tokenizer and the model name, and one ``Vocab`` per
#: tokenizer object is shared by every context made from it.
EngineContext = _lib.EngineContext


class EngineKeywords(TypedDict, total=False):
    """What the in-process adapters (HF, TRT-LLM) take beside ``context=`` to build one:

    - ``tokenizer``: the model's tokenizer, for ``hello_world`` specs, the thinking tokens, token
      texts and the grammars (its ``Vocab``);
    - ``model_name``: for the thinking-token table when the tokenizer does not name them;
    - ``vocab_size``: checks token ids when the processor is built (default: the logits' width);
    - ``hello_world``: ``(ids, eos)`` instead of asking the tokenizer;
    - ``thinking_tokens``: a ``ThinkingTokenConfig`` instead of asking the tokenizer."""

    tokenizer: Any
    model_name: Optional[str]
    vocab_size: Optional[int]
    hello_world: Optional[Tuple[Sequence[int], int]]
    thinking_tokens: Any


def context_for(context: Any = None, **engine: Any) -> Any:
    """``context`` (an :class:`EngineContext` built once per engine) when given, else one built
    from ``engine`` (:class:`EngineKeywords`) by :class:`EngineContext`; both is an
    ``ArgumentTypeError`` naming the keyword, and a keyword that is none of them a ``TypeError``."""
    unknown = sorted(set(engine) - set(EngineKeywords.__annotations__))
    if unknown:
        raise TypeError(f"unexpected keyword argument {unknown[0]!r}")
    if context is None:
        return EngineContext(**engine)
    if not isinstance(context, _lib.EngineContext):
        raise _lib.ArgumentTypeError(f"context must be an EngineContext, got {type(context).__name__}")
    given = [name for name, value in engine.items() if value is not None]
    if given:
        raise _lib.ArgumentTypeError(f"give context= or {given[0]}=, not both (the context holds it)")
    return context


def rows_of(logits: Any) -> Any:
    """A ``[rows, vocab]`` view of logits shaped ``[vocab]``, ``[rows, vocab]``, ``[1, rows,
    vocab]`` (TRT-LLM's C++ runtime: batch 1, beams) or ``[rows, 1, vocab]`` (TRT-LLM's PyTorch
    backend: beams, one token); never a copy, so edits land in the engine's tensor."""
    if logits.dim() == 1:
        return logits.unsqueeze(0)
    if logits.dim() == 2:
        return logits
    if logits.dim() == 3 and logits.shape[1] == 1:
        return logits[:, 0]
    if logits.dim() == 3 and logits.shape[0] == 1:
        return logits[0]
    return logits.view(-1, logits.shape[-1])  # raises rather than copying


class KeyedBatch:
    """A ``Batch`` for engines that hand over, each call, a block whose rows are requests named by
    a key (SGLang's request id, TRT-LLM's request id and beam) rather than telling us when rows
    are added, moved or removed (as vLLM does).

    It holds the requests of the latest call, each at its row in that call: a present one is
    swapped into its new row (no data moves), a new one is built from its specs. A request absent
    from a call is dropped, so memory is bounded by the batch size however many requests pass;
    unless ``running(handle)`` says it still runs (the engine sampled other requests without it):
    then it is parked, state and all, until it comes back or stops running. A request that comes
    back after being dropped is rebuilt; pass ``position="tokens"`` so its forced sequences pick
    up from its token ids.
    """

    def __init__(
        self,
        context: EngineContext,
        *,
        position: Optional[str] = None,
        running: Optional[Callable[[Any], bool]] = None,
    ) -> None:
        self.context = context
        self.position = position
        self.running = running
        self.batch = None
        self.rows: list = []  # batch row -> key
        self.where: dict = {}  # key -> batch row
        self.parked: dict = {}  # key -> ticket of a request absent from the latest call
        self.handles: dict = {}  # key -> the engine's handle, for ``running``
        self.failed: dict = {}  # key -> why its specs were refused (kept while it stays)

    def __len__(self) -> int:
        return len(self.where) + len(self.parked)

    def __contains__(self, key: Any) -> bool:
        return key in self.where or key in self.parked

    def _still_running(self, key: Any) -> bool:
        handle = self.handles.get(key)
        if self.running is None or handle is None:
            return False
        try:
            return bool(self.running(handle))
        except Exception:  # noqa: BLE001 - a handle gone stale is a request that stopped
            return False

    def apply(self, logits: Any, requests: Sequence[Optional[tuple]]) -> list:
        """Edits ``logits`` (``[len(requests), vocab]``) in one call. ``requests[i]`` is None
        for a row to leave alone, else ``(key, specs, prompt_len, history)`` or ``(key, specs,
        prompt_len, history, handle)``, the handle being what ``running`` is asked about when the
        key is absent from a later call; ``specs`` may be a callable returning them (only called
        for a request not held yet). Returns the keys whose specs were refused in this call (each
        logged once, its row left as it was)."""
        vocab = logits.shape[-1]
        if self.batch is None or self.batch.vocab_size != vocab:
            self.batch = self.context.batch(self.context.vocab_size or vocab)
            self.rows, self.where, self.parked, self.handles = [], {}, {}, {}
        order: list = []
        present: dict = {}
        for i, r in enumerate(requests):
            key = None if r is None else r[0]
            if key in present:  # a key fills one row; later ones are left alone
                key = None
            if key is not None:
                present[key] = i
            order.append(key)
        requests = [r if k is not None else None for r, k in zip(requests, order)]
        for key in [k for k in self.where if k not in present]:
            self.parked[key] = self.batch.park(self.where.pop(key))
        for key in [k for k in self.parked if k not in present and not self._still_running(k)]:
            self.batch.discard(self.parked.pop(key))
        # A refused request is not tried again while it runs, present in this call or not.
        self.failed = {k: why for k, why in self.failed.items() if k in present or self._still_running(k)}
        self.handles = {
            k: h for k, h in self.handles.items() if k in present or k in self.parked or k in self.failed
        }
        self.rows = [k if k in self.where else None for k in self.rows]
        if len(self.rows) < len(order):
            self.rows.extend([None] * (len(order) - len(self.rows)))
        for i, key in enumerate(order):
            j = self.where.get(key) if key is not None else None
            if j is None or j == i:
                continue
            self.batch.swap(i, j)
            other = self.rows[i]
            self.rows[i], self.rows[j] = key, other
            self.where[key] = i
            if other is not None:
                self.where[other] = j
        del self.rows[len(order) :]
        for i, key in enumerate(order):
            if key in self.parked:  # its row is empty: every held request sits at its own row
                self.batch.unpark(self.parked.pop(key), i)
                self.rows[i], self.where[key] = key, i
        histories: list = [None] * len(order)
        refused = []
        for i, request in enumerate(requests):
            if request is None:
                continue
            key, specs, prompt_len, history = request[:4]
            if len(request) > 4:
                self.handles[key] = request[4]
            if key not in self.where:
                if key in self.failed:
                    continue
                try:
                    specs = specs() if callable(specs) else specs
                    if self.position is not None:
                        specs = with_position(specs, self.position)
                    self.batch.add(i, no_caller_mask(specs), prompt_len=prompt_len)
                except Exception as e:  # noqa: BLE001 - one bad request must not stop the step
                    self.failed[key] = str(e)
                    refused.append(key)
                    logger.error("logits_processing: request %s runs unprocessed: %s", key, e)
                    continue
                self.rows[i], self.where[key] = key, i
            histories[i] = history
        if self.where:
            self.batch.apply(logits, histories)
        return refused
