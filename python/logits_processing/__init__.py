"""Logits processors for LLM decoding, backed by Rust.

A drop-in for NVIDIA Dynamo's ``dynamo.logits_processing``: the same names, arguments and
results, edited in place with no copy (torch tensors and numpy arrays, float32 / float16 /
bfloat16, through DLPack), plus a :class:`Batch` that edits a whole ``[rows, vocab]`` block per
decode step in one call with the GIL released.

The reference's submodules are here under the same names: ``.base``, ``.thinking_budget``,
``.thinking_tokens``, ``.examples`` (``.forced_sequence``, ``.hello_world``, ``.temperature``).

``import logits_processing`` imports neither torch nor numpy.
"""

from . import _lib
from ._lib import (
    ArgumentTypeError,
    Batch,
    BusyError,
    DeviceError,
    DTypeError,
    EngineContext,
    InvalidArgumentError,
    LogitsProcessingError,
    Processor,
    ProcessorError,
    ReadOnlyError,
    ShapeError,
    SpecError,
    TokenizerError,
    TokenOutOfVocabError,
    Vocab,
    canonical_order,
    kind_info,
    kinds,
    needs_prompt_len,
    needs_token_texts,
    position_by_tokens,
    reads_history,
    resolve_specs,
    synthid_context_repetition_mask,
    synthid_g_values,
    validate_specs,
)
from .base import BaseLogitsProcessor
from .thinking_budget import ThinkingBudgetLogitsProcessor
from .thinking_tokens import (
    ThinkingTokenConfig,
    get_thinking_token_config,
    register_thinking_token_config,
)
from .watermark import WatermarkDetectorOutput, detect_watermark

__version__: str = _lib.__version__

__all__ = [
    "ArgumentTypeError",
    "BaseLogitsProcessor",
    "Batch",
    "BusyError",
    "DTypeError",
    "DeviceError",
    "EngineContext",
    "InvalidArgumentError",
    "LogitsProcessingError",
    "Processor",
    "ProcessorError",
    "ReadOnlyError",
    "ShapeError",
    "SpecError",
    "ThinkingBudgetLogitsProcessor",
    "ThinkingTokenConfig",
    "TokenOutOfVocabError",
    "TokenizerError",
    "Vocab",
    "WatermarkDetectorOutput",
    "__version__",
    "canonical_order",
    "detect_watermark",
    "get_thinking_token_config",
    "kinds",
    "position_by_tokens",
    "kind_info",
    "needs_prompt_len",
    "needs_token_texts",
    "reads_history",
    "register_thinking_token_config",
    "resolve_specs",
    "synthid_context_repetition_mask",
    "synthid_g_values",
    "validate_specs",
]
