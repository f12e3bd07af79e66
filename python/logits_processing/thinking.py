"""Which token ids open and close a model's thinking block.

The same names as the reference's ``dynamo.logits_processing.thinking_tokens`` (which
:mod:`logits_processing.thinking_tokens` mirrors): :class:`ThinkingTokenConfig`, the table
``THINKING_TOKEN_CONFIGS``, :func:`get_thinking_token_config` and
:func:`register_thinking_token_config`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Optional

from . import _lib

__all__ = [
    "THINKING_TOKEN_CONFIGS",
    "ThinkingTokenConfig",
    "get_thinking_token_config",
    "register_thinking_token_config",
]

logger = logging.getLogger(__name__)


@dataclass
class ThinkingTokenConfig:
    """The ids of ``<think>``, ``</think>`` and a newline for one model.

    Start or end 0 means "not configured": a thinking budget built from it does nothing.

    Args:
        start_token_id (int): The id of ``<think>``.
        end_token_id (int): The id of ``</think>``.
        newline_token_id (int): The id of a line end.

    Example:
        >>> from logits_processing import ThinkingTokenConfig
        >>> ThinkingTokenConfig(151667, 151668, 198) == ThinkingTokenConfig(151667, 151668, 198)
        True
    """

    start_token_id: int
    end_token_id: int
    newline_token_id: int


class _ConfigTable(dict):
    """The model-name table, a plain dict as in the reference (code that writes
    ``THINKING_TOKEN_CONFIGS[key] = config`` keeps working); a write is also registered in the
    core's table, which the Rust side reads."""

    def __setitem__(self, key: str, config: ThinkingTokenConfig) -> None:
        if not isinstance(config, ThinkingTokenConfig):
            raise TypeError(f"THINKING_TOKEN_CONFIGS[{key!r}] must be a ThinkingTokenConfig, found {type(config).__name__}")
        _lib.register_thinking_token_ids(
            key, int(config.start_token_id), int(config.end_token_id), int(config.newline_token_id)
        )
        super().__setitem__(key, config)


#: The table, matched in order by case-insensitive substring of the model name: the
#: reference's four entries (``deepseek``, ``qwen3``, ``glm4``, ``glm-4``), read from the core,
#: which holds the table and does the matching.
THINKING_TOKEN_CONFIGS: "dict[str, ThinkingTokenConfig]" = _ConfigTable(
    {key: ThinkingTokenConfig(*ids) for key, ids in _lib.thinking_token_table()}
)


def get_thinking_token_config(model_name: str, tokenizer: Optional[Any] = None) -> ThinkingTokenConfig:
    """The thinking token ids of `model_name`.

    The core's one rule, which every engine adapter uses too: with a tokenizer whose
    ``"<think>"``, ``"</think>"`` and ``"\\n"`` each encode to exactly one token, those ids (the
    tokenizer is what the model was trained with; the reference looks at the table first, and
    DeepSeek's ids differ between its tokenizer versions); else ``THINKING_TOKEN_CONFIGS``, a
    case-insensitive substring of the name, first match in order (``deepseek``, ``qwen3``,
    ``glm4``, ``glm-4``, then keys added with :func:`register_thinking_token_config`); else a
    warning and ``ThinkingTokenConfig(0, 0, 10)``, which disables the budget. Markers that
    encode to several pieces are never used (the reference takes the first piece, which budgets
    the wrong token).

    Args:
        model_name (str): The model's name or path, e.g. ``"Qwen/Qwen3-8B"``.
        tokenizer: Optional; anything with ``encode(text, add_special_tokens=False)`` (a
            transformers tokenizer or a ``tokenizers.Tokenizer``).

    Returns:
        ThinkingTokenConfig: The ids (the table's own object when the table matched, as in the
        reference).

    Example:
        >>> from logits_processing import get_thinking_token_config
        >>> get_thinking_token_config("Qwen/Qwen3-8B")
        ThinkingTokenConfig(start_token_id=151667, end_token_id=151668, newline_token_id=198)
    """
    ids, key = _lib.thinking_token_ids(model_name, tokenizer)
    config = THINKING_TOKEN_CONFIGS.get(key) if key is not None else None
    if config is not None:
        return config  # the table's own object, as the reference returns it
    if ids[0] == 0 or ids[1] == 0:
        logger.warning(
            "%s: no single-token <think> / </think> ids known; the thinking budget is disabled",
            model_name,
        )
    return ThinkingTokenConfig(*ids)


def register_thinking_token_config(model_key: str, config: ThinkingTokenConfig) -> None:
    """Adds ``model_key.lower()`` to ``THINKING_TOKEN_CONFIGS``, or replaces its entry (keeping
    its place).

    Args:
        model_key (str): A substring of the model names it applies to.
        config (ThinkingTokenConfig): Their ids.

    Example:
        >>> from logits_processing import ThinkingTokenConfig, get_thinking_token_config, register_thinking_token_config
        >>> register_thinking_token_config("My-Model", ThinkingTokenConfig(11, 12, 13))
        >>> get_thinking_token_config("org/my-model-7b").start_token_id
        11
    """
    THINKING_TOKEN_CONFIGS[model_key.lower()] = config
