"""Engine adapters. Each lives in its own module and imports its engine only when that module is
imported; importing this package imports no engine.

- :mod:`logits_processing.adapters.hf`: ``HFLogitsProcessor`` for transformers ``generate()``.
- :mod:`logits_processing.adapters.vllm`: ``VLLMLogitsProcessor``, a vLLM batch-level logits
  processor for both the V1 runner and Model Runner V2 (``--logits-processors
  logits_processing.adapters.vllm:VLLMLogitsProcessor`` or the ``vllm.logits_processors`` entry
  point).
- :mod:`logits_processing.adapters.sglang`: ``SGLangLogitProcessor``, an SGLang
  ``CustomLogitProcessor`` whose requests carry JSON specs.
- :mod:`logits_processing.adapters.trtllm`: ``TRTLLMLogitsProcessor`` (per request) and
  ``TRTLLMBatchedLogitsProcessor`` for TensorRT-LLM.
- :mod:`logits_processing.adapters.llama_cpp`: ``LlamaCppLogitsProcessor`` for llama-cpp-python's
  ``logits_processor=LogitsProcessorList([...])``, its context from the ``Llama`` object.

A request opts in with a list of JSON specs under :data:`SPEC_KEY` (or Dynamo's entries under
:data:`DYNAMO_SPEC_KEY`), and with :data:`PROMPT_LEN_KEY` beside them says where its original
prompt ends, so that a request moved to another worker mid-generation continues exactly
(:func:`original_prompt_len`). Processors run only on
generation roles (aggregated, decode), never on a prefill worker (:func:`runs_processors`).
"""

from ._common import (
    DYNAMO_SPEC_KEY,
    DYNAMO_UID_KEY,
    GENERATION_ROLES,
    PROMPT_LEN_KEY,
    ROLES,
    SPEC_KEY,
    EngineContext,
    EngineKeywords,
    KeyedBatch,
    encode_specs,
    normalize_role,
    original_prompt_len,
    request_payload,
    runs_processors,
    thinking_tokens_for,
    validate_structure,
)

__all__ = [
    "DYNAMO_SPEC_KEY",
    "DYNAMO_UID_KEY",
    "GENERATION_ROLES",
    "PROMPT_LEN_KEY",
    "ROLES",
    "SPEC_KEY",
    "EngineContext",
    "EngineKeywords",
    "KeyedBatch",
    "encode_specs",
    "normalize_role",
    "original_prompt_len",
    "request_payload",
    "runs_processors",
    "thinking_tokens_for",
    "validate_structure",
]
