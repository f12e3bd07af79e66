"""``HelloWorldLogitsProcessor``, under the reference's module name
(``dynamo.logits_processing.examples.hello_world``)."""

from __future__ import annotations

import operator
import os
from typing import Any, List, Optional, Tuple, Union

from .. import _lib
from .forced_sequence import ForcedSequenceLogitsProcessor

__all__ = ["RESPONSE", "HelloWorldLogitsProcessor", "hello_world_ids"]

RESPONSE = "Hello world!"
_NO_EOS = "Tokenizer has no eos_token_id; HelloWorldLogitsProcessor requires one."


def hello_world_ids(tokenizer: Any, eos_token_id: Optional[int] = None) -> Tuple[List[int], int]:
    """The ids of ``"Hello world!"`` (no special tokens) and the EOS id, from a tokenizer.

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
    """
    if isinstance(tokenizer, (str, os.PathLike)):
        ids, eos = _lib.hello_world_ids_from_file(os.fspath(tokenizer), eos_token_id)
        return list(ids), eos
    if not callable(getattr(tokenizer, "encode", None)):
        raise _lib.ArgumentTypeError(
            "tokenizer must be a tokenizer (with encode(text, add_special_tokens=False)) or the path "
            f"of a tokenizer.json, got {type(tokenizer).__name__}"
        )
    try:
        encoded = tokenizer.encode(RESPONSE, add_special_tokens=False)
    except Exception as e:  # the tokenizer's own failure, as ours; KeyboardInterrupt passes
        raise _lib.TokenizerError(f"tokenizer.encode({RESPONSE!r}) raised {type(e).__name__}") from e
    ids = getattr(encoded, "ids", encoded)  # tokenizers.Encoding has .ids
    eos = eos_token_id if eos_token_id is not None else getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        raise _lib.InvalidArgumentError(_NO_EOS)
    return _checked_ids(ids), _checked_eos(eos)


def _checked_ids(ids: Any) -> List[int]:
    """What ``encode`` returned, as token ids, or a TokenizerError saying what it was."""
    try:
        return [operator.index(i) for i in ids]
    except Exception as e:
        raise _lib.TokenizerError(
            f"tokenizer.encode({RESPONSE!r}) returned {type(ids).__name__}, not a list of token ids"
        ) from e


def _checked_eos(eos: Any) -> int:
    try:
        return operator.index(eos)
    except TypeError as e:
        raise _lib.ArgumentTypeError(f"eos_token_id must be an integer token id, got {type(eos).__name__}") from e


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
