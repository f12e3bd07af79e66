"""Hugging Face transformers: a ``LogitsProcessor`` for ``generate(logits_processor=...)``.

Imports transformers (and torch) when this module is imported.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from transformers import LogitsProcessor

from ._common import EngineContext

__all__ = ["HFLogitsProcessor"]


class HFLogitsProcessor(LogitsProcessor):
    """Runs one ``logits_processing`` pipeline per batch row of ``generate()``, the whole
    ``[rows, vocab]`` block in one call into Rust per step.

    HF's contract is that a processor returns new scores and leaves its input as it was, so each
    call copies the scores once and edits the copy in place; nothing else is allocated per step.
    The ids HF passes are the prompt and the tokens generated so far, so the first call's length
    is taken as the prompt length (forced sequences positioned by ``"tokens"`` count from there).
    Calling it with shorter ids, or a different number of rows, starts a new generation: the same
    object can serve several ``generate()`` calls in turn, not at once.

    Args:
        pipeline: the pipeline every row runs: a JSON text, a spec dict, or a list of spec dicts,
            processor objects and callables ``(input_ids, logits_row) -> None``.
        per_row: instead of ``pipeline``, one pipeline per prompt. With ``num_beams`` or
            ``num_return_sequences`` above 1, HF expands each prompt into consecutive rows; each
            of those rows gets its prompt's pipeline (a fresh copy).
        tokenizer: the model's tokenizer, for ``hello_world`` specs and the thinking tokens.
        model_name: the model's name, for the thinking-token table when the tokenizer does not
            name them.
        vocab_size: checks token ids when the processor is built; default: the scores' width at
            the first call.
        hello_world: ``(ids, eos)`` instead of asking the tokenizer.
        thinking_tokens: a ``ThinkingTokenConfig`` instead of asking the tokenizer.

    Example::

        from logits_processing.adapters.hf import HFLogitsProcessor
        processor = HFLogitsProcessor({"kind": "hello_world"}, tokenizer=tokenizer)
        out = model.generate(**inputs, logits_processor=[processor], do_sample=False)
    """

    # transformers' continuous batching (`generate_batch`, the serving path) moves requests in
    # and out of rows; this processor holds one pipeline per fixed row and takes the prompt
    # length from its first call, so it declares itself unsupported there.
    supports_continuous_batching = False

    def __init__(
        self,
        pipeline: Any = None,
        *,
        per_row: Optional[Sequence[Any]] = None,
        tokenizer: Any = None,
        model_name: Optional[str] = None,
        vocab_size: Optional[int] = None,
        hello_world: Any = None,
        thinking_tokens: Any = None,
    ) -> None:
        if (pipeline is None) == (per_row is None):
            raise ValueError("give exactly one of pipeline (every row) and per_row (one per prompt)")
        self.context = EngineContext.resolve(
            tokenizer=tokenizer,
            model_name=model_name,
            vocab_size=vocab_size,
            hello_world=hello_world,
            thinking_tokens=thinking_tokens,
        )
        self._pipelines = [pipeline] if per_row is None else list(per_row)
        if not self._pipelines:
            raise ValueError("per_row is empty")
        self._broadcast = per_row is None
        for p in self._pipelines:
            if _is_data(p):
                self.context.validate(p)
        self._batch = None
        self._rows = 0
        self._last_len = 0
        self.prompt_len: Optional[int] = None

    def reset(self) -> None:
        """Forgets the current generation; the next call starts a new one."""
        self._batch = None
        self._rows = 0
        self._last_len = 0
        self.prompt_len = None

    def _start(self, rows: int, length: int, vocab: int) -> None:
        if self._broadcast:
            per_row = [self._pipelines[0]] * rows
        else:
            if rows % len(self._pipelines):
                raise ValueError(
                    f"generate() has {rows} rows, not a multiple of the {len(self._pipelines)} "
                    "pipelines given per_row"
                )
            expand = rows // len(self._pipelines)
            per_row = [self._pipelines[r // expand] for r in range(rows)]
        batch = self.context.batch(self.context.vocab_size or vocab)
        for row, p in enumerate(per_row):
            batch.add(row, p, prompt_len=length)
        self._batch, self._rows, self.prompt_len = batch, rows, length

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        rows, length = input_ids.shape
        if self._batch is None or rows != self._rows or length <= self._last_len:
            self._start(rows, length, scores.shape[-1])
        self._last_len = length
        processed = torch.empty_like(scores)
        if scores.is_cuda or processed.stride() != scores.stride():
            processed.copy_(scores)
            self._batch.apply(processed, input_ids)
        else:
            # One pass: each logit is read from `scores` and written to `processed` once.
            self._batch.apply(scores, input_ids, out=processed)
        return processed


def _is_data(pipeline: Any) -> bool:
    if isinstance(pipeline, (str, bytes, dict)):
        return True
    if isinstance(pipeline, (list, tuple)):
        return all(isinstance(p, dict) for p in pipeline)
    return False
