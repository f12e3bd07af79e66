"""Which token ids open and close a model's thinking block.

The same names as the reference's ``dynamo.logits_processing.thinking_tokens`` (which
:mod:`logits_processing.thinking_tokens` mirrors): :class:`ThinkingTokenConfig`, the table
``THINKING_TOKEN_CONFIGS``, :func:`get_thinking_token_config` and
:func:`register_thinking_token_config`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, MutableMapping
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


class _ConfigTable(MutableMapping):
    """The model-name table as a view of the core's, which holds it and does the matching: every
    read asks the core, every write (``table[key] = config``, ``update``, ``setdefault``)
    registers in the core (keys lower-cased, as the core keeps them), and removal (``del``, ``pop``, ``popitem``, ``clear``) is refused with
    a ``TypeError``, the core's table having no removal (a key is replaced, keeping its place).
    A key reads back as the same object while its ids stay the same, as a dict's would."""

    def __init__(self) -> None:
        self._objects: "dict[str, ThinkingTokenConfig]" = {}

    def _table(self) -> "dict[str, tuple]":
        return dict(_lib.thinking_token_table())

    def __getitem__(self, key: str) -> ThinkingTokenConfig:
        if not isinstance(key, str):
            raise KeyError(key)
        key = key.lower()  # as the core keeps its keys
        ids = self._table()[key]
        config = self._objects.get(key)
        if config is None or (config.start_token_id, config.end_token_id, config.newline_token_id) != ids:
            config = self._objects[key] = ThinkingTokenConfig(*ids)
        return config

    def __setitem__(self, key: str, config: ThinkingTokenConfig) -> None:
        if not isinstance(config, ThinkingTokenConfig):
            raise TypeError(f"THINKING_TOKEN_CONFIGS[{key!r}] must be a ThinkingTokenConfig, found {type(config).__name__}")
        if not isinstance(key, str):
            raise TypeError(f"THINKING_TOKEN_CONFIGS keys are model-name substrings (str), found {type(key).__name__}")
        _lib.register_thinking_token_ids(
            key, int(config.start_token_id), int(config.end_token_id), int(config.newline_token_id)
        )
        self._objects[key.lower()] = config

    def __delitem__(self, key: str) -> None:
        raise TypeError(
            f"THINKING_TOKEN_CONFIGS entries cannot be removed (the core's table has no removal): "
            f"replace {key!r} with THINKING_TOKEN_CONFIGS[{key!r}] = ThinkingTokenConfig(0, 0, 10) "
            "to disable the budget for those models"
        )

    def clear(self) -> None:
        raise TypeError("THINKING_TOKEN_CONFIGS cannot be cleared (the core's table has no removal)")

    def __iter__(self) -> Iterator[str]:
        return iter([key for key, _ in _lib.thinking_token_table()])

    def __len__(self) -> int:
        return len(_lib.thinking_token_table())

    def __repr__(self) -> str:
        return repr(dict(self.items()))


#: The table, matched in order by case-insensitive substring of the model name: the
#: reference's four entries (``deepseek``, ``qwen3``, ``glm4``, ``glm-4``), then the keys added;
#: a view of the core's table (see ``_ConfigTable``).
THINKING_TOKEN_CONFIGS: "MutableMapping[str, ThinkingTokenConfig]" = _ConfigTable()


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
