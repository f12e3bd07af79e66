"""``HelloWorldLogitsProcessor``, under the reference's module name
(``dynamo.logits_processing.examples.hello_world``)."""

from __future__ import annotations

import os
from typing import Any, List, Optional, Tuple, Union

from .. import _lib
from .forced_sequence import ForcedSequenceLogitsProcessor

__all__ = ["RESPONSE", "HelloWorldLogitsProcessor", "hello_world_ids"]

#: The reply ``hello_world`` forces (the core's).
RESPONSE: str = _lib.HELLO_WORLD_TEXT


def hello_world_ids(tokenizer: Any, eos_token_id: Optional[int] = None) -> Tuple[List[int], int]:
    """The ids of ``"Hello world!"`` (no special tokens) and the EOS id, from a tokenizer, by
    the core's rule (what :class:`~logits_processing.EngineContext` derives).

    Args:
        tokenizer: A transformers tokenizer (anything with ``encode(text,
            add_special_tokens=False)`` and ``eos_token_id``), a ``tokenizers.Tokenizer``, or the
            path of a ``tokenizer.json``.
        eos_token_id (int | None): The EOS id; by default the tokenizer's ``eos_token_id``, or for
            a path the ``eos_token`` of the ``tokenizer_config.json`` beside it.

    Returns:
        tuple[list[int], int]: The ids and the EOS id.

    Raises:
        InvalidArgumentError: (a ValueError) when no EOS id can be found.
        TokenizerError: a tokenizer whose ``encode`` fails or does not return token ids.

    Example:
        >>> from logits_processing.examples import hello_world_ids
        >>> class Letters:  # a toy tokenizer: one id per character
        ...     eos_token_id = 0
        ...     def encode(self, text, add_special_tokens=False):
        ...         return [ord(c) for c in text]
        >>> ids, eos = hello_world_ids(Letters())
        >>> "".join(map(chr, ids)), eos
        ('Hello world!', 0)
    """
    ids, eos = _lib.hello_world_ids(tokenizer, eos_token_id)
    return list(ids), eos


class HelloWorldLogitsProcessor(ForcedSequenceLogitsProcessor):
    """Makes the model answer ``"Hello world!"``, whatever it was asked, then end.

    A forced sequence of the tokenizer's encoding of ``"Hello world!"`` (no special tokens)
    followed by its EOS id, as the reference's ``HelloWorldLogitsProcessor``; it has the same
    ``token_ids``, ``eos_id`` and ``state`` attributes.

    Args:
        tokenizer: A transformers tokenizer (anything with ``encode(text,
            add_special_tokens=False)`` and ``eos_token_id``), a ``tokenizers.Tokenizer``, or the
            path of a ``tokenizer.json``.
        eos_token_id (int | None): Keyword only. The EOS id, where the tokenizer does not say it
            (a ``tokenizers.Tokenizer``; a path without a ``tokenizer_config.json`` beside it).
        position (str), prompt_len (int): Keyword only; as for ForcedSequenceLogitsProcessor.

    Raises:
        InvalidArgumentError: (a ValueError) when the tokenizer has no EOS id.

    Example:
        >>> import torch
        >>> from logits_processing.examples import HelloWorldLogitsProcessor
        >>> class Letters:  # a toy tokenizer: one id per character
        ...     eos_token_id = 0
        ...     def encode(self, text, add_special_tokens=False):
        ...         return [ord(c) for c in text]
        >>> hello = HelloWorldLogitsProcessor(Letters())
        >>> logits = torch.zeros(128)
        >>> hello([], logits)
        >>> int(logits.argmax()) == ord("H")
        True
    """

    def __new__(
        cls,
        tokenizer: Any,
        *,
        eos_token_id: Optional[int] = None,
        position: str = "calls",
        prompt_len: int = 0,
    ) -> "HelloWorldLogitsProcessor":
        ids, eos = hello_world_ids(tokenizer, eos_token_id)
        return super().__new__(cls, ids, eos, position=position, prompt_len=prompt_len)

    def __init__(self, tokenizer: Union[Any, str, os.PathLike], **kwargs: Any) -> None:
        pass  # everything happens in __new__ (the Rust base class has no __init__)

    def __reduce__(self) -> Tuple[Any, ...]:
        # Rebuilt from its ids (the tokenizer is not kept), through the base class's constructor.
        args, kwargs = self.__getnewargs_ex__()
        return (_rebuild, (type(self), args, kwargs), self.__getstate__())


def _rebuild(cls: type, args: Tuple[Any, ...], kwargs: "dict[str, Any]") -> HelloWorldLogitsProcessor:
    return ForcedSequenceLogitsProcessor.__new__(cls, *args, **kwargs)
