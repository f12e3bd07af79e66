"""The thinking-token table and lookup under the reference's module name
(``dynamo.logits_processing.thinking_tokens``): the same names, the same objects as
:mod:`logits_processing.thinking`."""

from .thinking import (
    THINKING_TOKEN_CONFIGS,
    ThinkingTokenConfig,
    get_thinking_token_config,
    register_thinking_token_config,
)

__all__ = [
    "THINKING_TOKEN_CONFIGS",
    "ThinkingTokenConfig",
    "get_thinking_token_config",
    "register_thinking_token_config",
]
