"""The processor protocol every engine adapter calls."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:  # torch is never imported at run time by this package
    import torch


@runtime_checkable
class BaseLogitsProcessor(Protocol):
    """A logits processor: anything with ``__call__(input_ids, logits) -> None``.

    The same protocol as the reference's ``dynamo.logits_processing.BaseLogitsProcessor``. Engines
    call it once per request per decode step with the request's ids so far and the row of raw
    next-token scores, and it edits the row in place.

    Args:
        input_ids: The token ids generated so far (a sequence of ints).
        logits: The raw scores for the next token, a 1-D tensor of shape ``(vocab_size,)``,
            edited in place.

    Example:
        >>> from logits_processing import BaseLogitsProcessor
        >>> from logits_processing.examples import TemperatureProcessor
        >>> class BanFirst:
        ...     def __call__(self, input_ids, logits):
        ...         logits[0] = float("-inf")
        >>> isinstance(BanFirst(), BaseLogitsProcessor), isinstance(TemperatureProcessor(), BaseLogitsProcessor)
        (True, True)
    """

    def __call__(self, input_ids: Sequence[int], logits: torch.Tensor | Any) -> None: ...
