"""SGLang: a ``CustomLogitProcessor`` whose requests carry JSON specs, never code.

Start the server with ``--enable-custom-logit-processor`` and send, per request::

    from logits_processing.adapters.sglang import activate
    extra = activate(sampling_params, [{"kind": "hello_world"}], context=context)
    # -> sampling_params["custom_params"]["logits_processing"] = '[{"kind": ...}]'
    #    extra == {"custom_logit_processor": SGLangLogitProcessor.to_str()}

What crosses from the client to the scheduler:

- ``custom_params["logits_processing"]``: the request's specs as JSON text, data only (or
  Dynamo's entries under ``custom_params["dynamo_logits"]``). SGLang hands each row's
  ``custom_params`` (plus ``"__req__"``, a weak proxy to its ``Req``) to the processor.
- ``custom_logit_processor``: SGLang's own envelope, ``{"callable": <dill hex>}``. For this class
  the pickle holds only a reference to ``logits_processing.adapters.sglang.SGLangLogitProcessor``
  (module and name, no code object); the scheduler imports it from the installed package.

State: SGLang builds a new processor instance whenever it rebuilds a batch, so state lives in one
store per scheduler process, keyed by request id. The store holds the requests of the latest call,
each at the row it had in that call. A request absent from a call that has not finished (SGLang
samples a prefill of joining requests without the running ones; a retracted request waits) is
parked with its state: mirostat's ``mu``, ``max_time``'s clock and the like survive. One that
finished or was aborted is dropped, so memory is bounded by the requests SGLang holds; it is
rebuilt from its token ids (``origin_input_ids`` + ``output_ids``) if it ever comes back. Forced
sequences here always count generated tokens (``position: "tokens"``): the same as counting calls
in a plain run, and still right after a rebuild, a chunked prefill or a retraction.

Overlap scheduling (SGLang's default) samples a step before the previous step's token reaches
``req.output_ids``; that token is read from the scheduler's result not yet processed, whose
host copy SGLang has already started (:func:`in_flight`), so the history is exact. A spec that
fails here finishes its request with the error (:func:`finish_with_error`), which the client
receives.

Imports SGLang when this module is imported.
"""

from __future__ import annotations

import json
import logging
import pickle
import sys
from array import array
from http import HTTPStatus
from typing import Any, Dict, List, Optional, Tuple

import torch
from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor

from ._common import (
    PROMPT_LEN_KEY,
    SPEC_KEY,
    EngineContext,
    KeyedBatch,
    encode_specs,
    no_caller_mask,
    original_prompt_len,
    request_payload,
    runs_processors,
)

__all__ = ["PROMPT_LEN_KEY", "SGLangLogitProcessor", "REQUESTS", "activate", "requests_of", "SPEC_KEY"]

logger = logging.getLogger(__name__)


def activate(
    sampling_params: Dict[str, Any],
    specs: Any,
    *,
    role: Any = "aggregated",
    context: Optional[EngineContext] = None,
) -> Dict[str, Any]:
    """Puts ``specs`` on a request (a ``sampling_params`` dict) and returns the extra
    ``generate`` / ``async_generate`` keyword arguments (the ``custom_logit_processor``). On a
    prefill worker nothing is added and ``{}`` is returned. With an ``EngineContext`` (the
    client's tokenizer), ``hello_world`` and thinking-token defaults are resolved to ids here, so
    the scheduler needs no tokenizer."""
    if not runs_processors(role):
        return {}
    no_caller_mask(specs, "SGLang")
    if context is not None:
        specs = context.resolve_specs(specs)
    params = dict(sampling_params.get("custom_params") or {})
    params[SPEC_KEY] = encode_specs(specs)
    sampling_params["custom_params"] = params
    return {"custom_logit_processor": SGLangLogitProcessor.to_str()}


def requests_of(
    params_list: List[Optional[Dict[str, Any]]],
    tails: Optional[List[Optional[Tuple[int, int]]]] = None,
    *,
    reqs: Optional[Dict[Any, Any]] = None,
    history_lags: bool = False,
    speculative: Optional[str] = None,
) -> List[Optional[tuple]]:
    """The rows of one call, as ``KeyedBatch`` takes them: ``(request id, specs, prompt length,
    token ids so far, Req)``, or None for a row without specs (or one finished here with an error).

    ``tails[i]``, when given, is what the forward pass of this step says about row ``i``:
    ``(sequence length, the scheduler's pending result)`` (see :func:`in_flight`). A request
    whose history is one id short of it has that id still in flight (overlap scheduling: the
    previous step's token is appended to ``output_ids`` after this step samples) and gets it
    appended, read from the pending result. ``reqs``, when given, receives each request id's
    ``Req``. ``history_lags`` says that ``output_ids`` may
    miss the newest token and nothing tells which (no ``tails``): then every request whose specs
    read the history is finished with an error naming the settings that make it exact."""
    rows: List[Optional[tuple]] = []
    seen = set()
    for i, params in enumerate(params_list):
        try:
            # Ours under "logits_processing"; Dynamo's entries under "dynamo_logits" (its
            # "dynamo_uid" is not needed: SGLang's own request id keys the state).
            payload = request_payload(params)
            if payload is not None:
                no_caller_mask(payload, "SGLang")
        except (TypeError, ValueError) as e:
            finish_with_error(params.get("__req__"), f"bad specs: {e}", row=i)
            payload = None
        if payload is None:
            rows.append(None)
            continue
        req = params.get("__req__")
        try:
            rid = req.rid if req is not None else None
            prompt = req.origin_input_ids if req is not None else None
        except ReferenceError:  # the request is gone
            rid = None
        if rid is None:
            logger.error(
                "logits_processing: row %d carries specs but no live '__req__' "
                "(SGLang too old?); left unprocessed",
                i,
            )
            rows.append(None)
            continue
        if rid in seen:
            global _warned_duplicates
            if not _warned_duplicates:
                logger.warning(
                    "logits_processing: request %s fills several rows (n > 1 or "
                    "speculative decoding); only its first row is processed",
                    rid,
                )
                _warned_duplicates = True
            rows.append(None)
            continue
        seen.add(rid)
        if reqs is not None:
            reqs[rid] = req
        if speculative:
            finish_with_error(req, _SPECULATIVE.format(algorithm=speculative), row=i)
            rows.append(None)
            continue
        try:
            # A migrated request's prompt holds the ids it generated before.
            prompt_len = original_prompt_len(params, len(prompt))
        except ValueError as e:
            # Refused as a bad spec is: the request finishes with the error.
            prompt_len, payload = len(prompt), _refusal(e)
        history = None if history_lags else _history(req, tails[i] if tails is not None else None)
        if history is None:
            if _reads_history(payload):
                finish_with_error(req, _LAGGING, row=i)
                rows.append(None)
                continue
            history = _history(req, None)
        rows.append((rid, payload, prompt_len, history, req))
    return rows


def _running(req: Any) -> bool:
    """Whether SGLang still runs ``req`` (a weak proxy: one gone raises, and is not running)."""
    return not req.finished()


_warned_duplicates = False
_LAGGING = (
    "its specs read the token history, which SGLang's overlap scheduler hands over one token "
    "late here and which could not be completed from the scheduler's pending result; start SGLang with "
    "--disable-overlap-schedule (disable_overlap_schedule=True) or SGLANG_ENABLE_DELAY_SAMPLE=1"
)
_SPECULATIVE = (
    "speculative decoding is on ({algorithm}): SGLang's EAGLE and n-gram verification never calls "
    "custom logit processors (the specs would silently stop after the first token) and its other "
    "drafters call them on every draft row without saying which draft it is; serve the model "
    "without --speculative-algorithm to use specs"
)


def _needs_token_texts(payload: Any) -> bool:
    """Whether the specs of ``payload`` can need the tokenizer's token texts (grammars,
    ``ban_strings``, DRY's text breakers, ``multiple_choice``), as the core's registry says."""
    import logits_processing as lp

    if callable(payload):
        return False
    try:
        return lp.needs_token_texts(payload)
    except (TypeError, ValueError):
        return False  # refused when the batch builds it


# Request id -> whether its specs read the history, for the requests of the latest call.
_reads_history_of: Dict[Any, bool] = {}


def _some_row_reads_history(params_list: List[Optional[Dict[str, Any]]]) -> bool:
    """Whether some row's specs read the token history; each request's answer is worked out once
    (its specs decoded at its first call) and kept while it comes in calls."""
    global _reads_history_of
    known, found, answer = _reads_history_of, {}, False
    for params in params_list:
        req = params.get("__req__") if params else None
        try:
            rid = req.rid if req is not None else None
        except ReferenceError:  # the request is gone
            continue
        if rid is None:
            continue
        reads = known.get(rid)
        if reads is None:
            try:
                payload = request_payload(params)
            except (TypeError, ValueError):
                payload = None  # finished with its error by requests_of
            reads = payload is not None and _reads_history(payload)
        found[rid] = reads
        answer = answer or reads
    _reads_history_of = found
    return answer


def _refusal(error: Exception) -> Any:
    def specs():
        raise error

    return specs


def _reads_history(payload: Any) -> bool:
    import logits_processing as lp

    if callable(payload):
        return False  # a refusal: the request finishes with its error
    try:
        return lp.reads_history(payload)
    except (TypeError, ValueError):
        return False  # refused when the batch builds it


def _history(req: Any, tail: Optional[Tuple[int, Optional["_Pending"]]]) -> Any:
    """The request's ids so far. SGLang keeps them in ``array('q')``: joined with one memcpy and
    handed over as an int64 tensor over the same buffer (DLPack, no per-id conversion).

    With ``tail`` (``(sequence length, pending result)`` from this step's forward pass and the
    scheduler): the id still in flight is appended when the history is one short; None when the
    history is shorter still, or the pending result does not hold the request (nothing here can
    fill it). A history at or past the length (a chunk of a chunked prefill: its sample is
    discarded) is taken as it is."""
    prompt, output = req.origin_input_ids, req.output_ids
    if tail is not None:
        seq_len, pending = tail
        have = len(prompt) + len(output)
        if have == seq_len - 1:
            last = pending.token_of(req.rid) if pending is not None else None
            if last is None:
                return None
            output = array("q", [*output, last]) if isinstance(output, array) else [*output, last]
        elif have < seq_len - 1:
            return None
    ids = (
        prompt + output
        if len(output) and type(prompt) is type(output)
        else (prompt if not len(output) else array("q", [*prompt, *output]))
    )
    if isinstance(ids, array) and ids.typecode == "q" and len(ids):
        return torch.frombuffer(ids, dtype=torch.int64)
    return ids


def in_flight(rows: int) -> Optional[List[Tuple[int, Optional["_Pending"]]]]:
    """``(sequence length, the scheduler's pending result)`` per row of this processor's call,
    or None when called from anywhere but SGLang's sampler under ``Scheduler.run_batch`` (then
    the config decides, see :func:`history_is_current`).

    SGLang's sampler is called from ``ModelRunner.sample(..., forward_batch)`` and hands us the
    rows ``apply_custom_logit_processor`` selected; the forward batch keeps the sequence lengths
    on the host (``seq_lens_cpu``). Under overlap scheduling a request's newest token is sampled
    by the previous step, whose result waits in ``Scheduler.result_queue`` to be processed (after
    this step samples) with its tokens' copy to the host already queued behind that step
    (``copy_done``): the token is read there (:class:`_Pending`), not from this step's forward
    pass, whose read would wait for this step's whole forward pass."""
    frame = sys._getframe(2)
    info = selected = forward = None
    for _ in range(_FRAMES):
        if frame is None:
            break
        # Only these three frames' locals are read, each a frame that returns within this step
        # (reading a frame's locals snapshots them on the frame, which would keep the
        # scheduler's older batches alive on a frame that lives on).
        code = frame.f_code
        if info is None:
            if code.co_name == "apply_custom_logit_processor":
                local = frame.f_locals
                info, selected = local.get("sampling_batch_info"), local.get("rows")
        elif forward is None:
            if "forward_batch" in code.co_varnames:
                fb = frame.f_locals.get("forward_batch")
                if fb is not None and getattr(fb, "sampling_info", None) is info:
                    forward = fb
        elif code.co_name == "run_batch" and "self" in code.co_varnames:
            queue = getattr(frame.f_locals.get("self"), "result_queue", None)
            if queue is not None:
                return _tails(forward, selected, rows, queue)
        frame = frame.f_back
    return None


_FRAMES = 12


def _tails(
    fb: Any, selected: Any, rows: int, queue: Any
) -> Optional[List[Tuple[int, Optional["_Pending"]]]]:
    seq_lens = getattr(fb, "seq_lens_cpu", None)
    if selected is None or len(selected) != rows or seq_lens is None:
        # Several tokens per row (speculative decoding), or the lengths only on the device
        # (reading them would be a second wait): not this shape.
        return None
    lens = seq_lens.tolist()
    # The overlap scheduler processes every result but the latest before it schedules a batch.
    pending = _Pending(*queue[-1]) if queue else None
    return [(int(lens[b]), pending) for b in selected]


class _Pending:
    """The scheduler's latest result not yet processed (``(batch, result)`` of its
    ``result_queue``). Its tokens are read at the first request that needs one, once: a wait on
    ``result.copy_done`` (the event SGLang records after queueing their copy to the host), that
    is for the previous step, never this one (:attr:`SGLangLogitProcessor.device_reads` counts
    it). A step that needs none reads nothing."""

    def __init__(self, batch: Any, result: Any) -> None:
        self.batch, self.result = batch, result
        self.tokens: Optional[Dict[Any, int]] = None

    def token_of(self, rid: Any) -> Optional[int]:
        if self.tokens is None:
            done = getattr(self.result, "copy_done", None)
            if done is not None:
                done.synchronize()
            ids = self.result.next_token_ids.tolist()
            SGLangLogitProcessor.device_reads += 1
            reqs = self.batch.reqs
            # One token a request (not a speculative step's several): else none is known.
            self.tokens = {r.rid: int(t) for r, t in zip(reqs, ids)} if len(ids) == len(reqs) else {}
        return self.tokens.get(rid)


def history_is_current() -> Optional[bool]:
    """Whether ``req.output_ids`` holds every sampled token when the sampler runs, by this
    scheduler's settings: True with overlap scheduling off or sampling delayed
    (``SGLANG_ENABLE_DELAY_SAMPLE``), False with SGLang's default overlap scheduler, None
    outside a scheduler process."""
    try:
        from sglang.srt.environ import envs
        from sglang.srt.runtime_context import get_server_args

        args = get_server_args()
        if args is None:
            return None
        return bool(args.disable_overlap_schedule) or bool(envs.SGLANG_ENABLE_DELAY_SAMPLE.get())
    except Exception:  # noqa: BLE001 - not in a scheduler (tests), or another SGLang
        return None


def speculative_algorithm() -> Optional[str]:
    """The name of this scheduler's speculative algorithm (``--speculative-algorithm``), or None
    when speculative decoding is off or outside a scheduler process."""
    try:
        from sglang.srt.runtime_context import get_server_args

        args = get_server_args()
        algorithm = getattr(args, "speculative_algorithm", None) if args is not None else None
    except Exception:  # noqa: BLE001 - not in a scheduler (tests), or another SGLang
        return None
    return str(algorithm) if algorithm else None


def finish_with_error(req: Any, message: str, *, row: Optional[int] = None) -> None:
    """Finishes ``req`` with an error its client receives (SGLang's ``FINISH_ABORT``, status
    400, as its own grammar errors do), and logs it. Without a live ``Req`` only the log says."""
    try:
        rid = req.rid
    except (AttributeError, ReferenceError):
        logger.error("logits_processing: row %s: %s; left unprocessed", row, message)
        return
    logger.error("logits_processing: request %s finished with an error: %s", rid, message)
    try:
        from sglang.srt.managers.schedule_batch import FINISH_ABORT

        req.to_finish = FINISH_ABORT(
            f"logits_processing: {message}", HTTPStatus.BAD_REQUEST, "BadRequestError"
        )
    except (ImportError, ReferenceError):
        pass


#: The state of this process (SGLang's scheduler is one thread per process): the requests of the
#: latest call, each at its row, and those it left out that SGLang still runs.
REQUESTS = KeyedBatch(EngineContext(), position="tokens", running=_running)


def use_tokenizer(tokenizer: Any) -> None:
    """Gives this scheduler process the model's tokenizer (a transformers fast tokenizer, a
    ``tokenizers.Tokenizer``, a ``tokenizer.json`` path or a ``Vocab``), for the specs that
    need token texts (:func:`logits_processing.needs_token_texts`: grammars, ``ban_strings``, ...):
    SGLang hands custom logit processors none. The processor loads the server's own by itself
    (:func:`use_scheduler_tokenizer`); this sets one by hand."""
    REQUESTS.context = EngineContext(tokenizer)
    REQUESTS.batch = None  # the next call builds its batch with it


def use_scheduler_tokenizer() -> bool:
    """Loads the tokenizer this SGLang server serves (its ``tokenizer_path``) into this scheduler
    process for the specs that need token texts (grammars, ``ban_strings``, DRY's text breakers,
    ``multiple_choice``: :func:`logits_processing.needs_token_texts`); done by the processor when
    the first such request arrives, so no one has to reach the scheduler process. Returns whether it loaded;
    when it cannot (no server configuration here, a tokenizer whose token texts cannot be read),
    those specs are refused and their requests finish with that error."""
    try:
        from sglang.srt.runtime_context import get_server_args
        from transformers import AutoTokenizer

        args = get_server_args()
        tokenizer = AutoTokenizer.from_pretrained(
            args.tokenizer_path or args.model_path,
            trust_remote_code=bool(getattr(args, "trust_remote_code", False)),
            revision=getattr(args, "revision", None),
        )
        context = EngineContext(tokenizer=tokenizer, model_name=args.model_path)
    except Exception as e:  # noqa: BLE001 - the grammar specs are refused with the reason
        logger.error("logits_processing: the server's tokenizer could not be loaded for the specs that need token texts: %s", e)
        return False
    if context.vocab is None:
        logger.error(
            "logits_processing: the server's tokenizer's token texts cannot be read; specs that need them are refused"
        )
        return False
    REQUESTS.context = context
    REQUESTS.batch = None  # the next call builds its batch with it
    return True


_tokenizer_tried = False


class SGLangLogitProcessor(CustomLogitProcessor):
    """Runs each opted-in request's pipeline on its row, the whole ``[rows, vocab]`` block in one
    call into Rust. Rows without specs are left as they were."""

    #: Reads from the device (waits, see ``adapters._common``) in this scheduler process (SGLang
    #: makes a new instance per batch, so the count is the class's): one a step whose history
    #: readers have a token in flight (the pending result's tokens, :func:`in_flight`), none for
    #: a step of history-free rows.
    device_reads = 0

    def __call__(self, logits: torch.Tensor, custom_param_list: Optional[List[Dict[str, Any]]] = None):
        if not custom_param_list:
            return logits
        reqs: Dict[Any, Any] = {}
        # Only a step with a row that reads its history looks for the token in flight.
        tails = in_flight(len(custom_param_list)) if _some_row_reads_history(custom_param_list) else None
        stale = tails is None and history_is_current() is False
        rows = requests_of(
            custom_param_list, tails, reqs=reqs, history_lags=stale, speculative=speculative_algorithm()
        )
        global _tokenizer_tried
        if (
            not _tokenizer_tried
            and REQUESTS.context.vocab is None
            and any(r is not None and r[0] not in REQUESTS and _needs_token_texts(r[1]) for r in rows)
        ):
            _tokenizer_tried = True  # once: a tokenizer that failed to load fails again
            use_scheduler_tokenizer()
        refused = REQUESTS.apply(logits, rows)
        for rid in refused:
            finish_with_error(reqs.get(rid), REQUESTS.failed.get(rid, "refused"))
        return logits

    @classmethod
    def to_str(cls) -> str:
        """SGLang's envelope, made with the standard pickle, which always pickles a class by
        reference (module and name): the payload holds no code whatever dill's settings."""
        return json.dumps({"callable": pickle.dumps(cls, protocol=4).hex()})

    @staticmethod
    def describe_payload(serialized: str) -> List[str]:
        """The globals SGLang's envelope makes the scheduler import (for audits and tests): a
        payload that carries data only names importable classes and holds no code."""
        import pickletools

        data = bytes.fromhex(json.loads(serialized)["callable"])
        names, strings = [], []
        for op, arg, _ in pickletools.genops(data):
            if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE"):
                strings.append(arg)
            elif op.name in ("GLOBAL", "INST"):
                names.append(arg.replace(" ", "."))
            elif op.name == "STACK_GLOBAL":
                names.append(".".join(strings[-2:]))
        return names
