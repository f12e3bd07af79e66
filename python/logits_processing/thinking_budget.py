"""``ThinkingBudgetLogitsProcessor``, under the reference's module name
(``dynamo.logits_processing.thinking_budget``), with the reference's ``_get_thinking_state``
helper (its own tests call it)."""

from __future__ import annotations

from typing import Sequence, Tuple

from ._lib import ThinkingBudgetLogitsProcessor

__all__ = ["ThinkingBudgetLogitsProcessor"]


def _get_thinking_state(self: ThinkingBudgetLogitsProcessor, input_ids: Sequence[int]) -> Tuple[bool, int]:
    """``(in_thinking_mode, thinking_tokens_generated)`` from ``input_ids``, as the reference
    computes it: the last ``<think>``, not closed by a ``</think>`` after it, and the number of
    ids after it. (The processor itself keeps this incrementally; this helper rescans.)"""
    start, end = self.thinking_start_token_id, self.thinking_end_token_id
    ids = [int(i) for i in input_ids]
    for i in range(len(ids) - 1, -1, -1):
        if ids[i] == start:
            if end in ids[i + 1 :]:
                return False, 0
            return True, len(ids) - i - 1
    return False, 0


# A method of the class as in the reference (it is a Rust class; the helper is Python).
ThinkingBudgetLogitsProcessor._get_thinking_state = _get_thinking_state
