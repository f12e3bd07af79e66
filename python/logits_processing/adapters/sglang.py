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
store per scheduler process, keyed by request id. The store holds exactly the requests of the
latest call, each at the row it had in that call, so its memory is bounded by the batch size
however many requests pass; a request that leaves (finished, aborted, retracted) is dropped, and
rebuilt from its token ids (``origin_input_ids`` + ``output_ids``) if it comes back. That is why
forced sequences here always count generated tokens (``position: "tokens"``): the same as counting
calls in a plain run, and still right after a rebuild, a chunked prefill or a retraction.

Imports SGLang when this module is imported.
"""

from __future__ import annotations

import json
import logging
import pickle
from array import array
from typing import Any, Dict, List, Optional

import torch
from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor

from ._common import (
    PROMPT_LEN_KEY,
    SPEC_KEY,
    EngineContext,
    KeyedBatch,
    encode_specs,
    original_prompt_len,
    request_payload,
    runs_processors,
)

__all__ = ["PROMPT_LEN_KEY", "SGLangLogitProcessor", "STORE", "activate", "requests_of", "SPEC_KEY"]

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
    if context is not None:
        specs = context.resolve_specs(specs)
    params = dict(sampling_params.get("custom_params") or {})
    params[SPEC_KEY] = encode_specs(specs)
    sampling_params["custom_params"] = params
    return {"custom_logit_processor": SGLangLogitProcessor.to_str()}


def requests_of(params_list: List[Optional[Dict[str, Any]]]) -> List[Optional[tuple]]:
    """The rows of one call, as ``KeyedBatch`` takes them: ``(request id, specs, prompt length,
    token ids so far)``, or None for a row without specs."""
    rows: List[Optional[tuple]] = []
    seen = set()
    for i, params in enumerate(params_list):
        try:
            # Ours under "logits_processing"; Dynamo's entries under "dynamo_logits" (its
            # "dynamo_uid" is not needed: SGLang's own request id keys the state).
            payload = request_payload(params)
        except (TypeError, ValueError) as e:
            logger.error("logits_processing: row %d: bad specs, left unprocessed: %s", i, e)
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
        try:
            # A migrated request's prompt holds the ids it generated before.
            prompt_len = original_prompt_len(params, len(prompt))
        except ValueError as e:
            # Refused as a bad spec is: the row left alone, logged once while it stays.
            prompt_len, payload = len(prompt), _refusal(e)
        rows.append((rid, payload, prompt_len, _history(req)))
    return rows


_warned_duplicates = False


def _refusal(error: Exception) -> Any:
    def specs():
        raise error

    return specs


def _history(req: Any) -> Any:
    """The request's ids so far. SGLang keeps them in ``array('q')``: joined with one memcpy and
    handed over as an int64 tensor over the same buffer (DLPack, no per-id conversion)."""
    prompt, output = req.origin_input_ids, req.output_ids
    ids = (
        prompt + output
        if len(output) and type(prompt) is type(output)
        else (prompt if not len(output) else array("q", [*prompt, *output]))
    )
    if isinstance(ids, array) and ids.typecode == "q" and len(ids):
        return torch.frombuffer(ids, dtype=torch.int64)
    return ids


#: The state of this process (SGLang's scheduler is one thread per process): the requests of the
#: latest call, each at its row.
STORE = KeyedBatch(EngineContext(), position="tokens")


def use_tokenizer(tokenizer: Any) -> None:
    """Gives this scheduler process the model's tokenizer (a transformers fast tokenizer, a
    ``tokenizers.Tokenizer``, a ``tokenizer.json`` path or a ``GrammarEnv``), for ``grammar`` and
    ``json_object`` specs: SGLang hands custom logit processors none. Call it before the first
    request that carries a grammar."""
    STORE.context = EngineContext.resolve(tokenizer=tokenizer)
    STORE.batch = None  # the next call builds its batch with it


class SGLangLogitProcessor(CustomLogitProcessor):
    """Runs each opted-in request's pipeline on its row, the whole ``[rows, vocab]`` block in one
    call into Rust. Rows without specs are left as they were."""

    def __call__(self, logits: torch.Tensor, custom_param_list: Optional[List[Dict[str, Any]]] = None):
        if not custom_param_list:
            return logits
        STORE.apply(logits, requests_of(custom_param_list))
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
