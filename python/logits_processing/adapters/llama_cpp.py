"""llama-cpp-python: a logits processor for ``Llama.__call__`` / ``create_completion(...,
logits_processor=LogitsProcessorList([processor]))``.

llama-cpp-python calls each processor as ``f(input_ids, scores)`` on numpy arrays (the prompt and
the tokens so far, and the next token's ``[vocab]`` float32 row) and samples from what it returns.
Importing this module imports neither llama_cpp nor torch.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional

from .. import _lib
from ._common import EngineContext, check_in_process_pipeline, context_for

__all__ = ["LlamaCppLogitsProcessor", "LlamaTokenizer", "context_from_llama", "tokenizer_json_from_gguf"]


class LlamaTokenizer:
    """A ``Llama`` object's own tokenizer, as :class:`logits_processing.EngineContext` reads a
    tokenizer (``encode(text, add_special_tokens=False)`` and ``eos_token_id``): text is encoded
    by llama.cpp itself, without BOS and without parsing special tokens, so ``hello_world`` and
    the text a spec carries get the ids the model would."""

    def __init__(self, llama: Any) -> None:
        self._llama = llama
        self.eos_token_id = int(llama.token_eos())
        self.vocab_size = int(llama.n_vocab())

    def encode(self, text: str, add_special_tokens: bool = False) -> list:
        return list(self._llama.tokenize(text.encode("utf-8"), add_bos=add_special_tokens, special=False))

    def decode(self, ids: Any) -> str:
        return self._llama.detokenize(list(ids)).decode("utf-8", errors="replace")


# llama.cpp's token types (llama_token_type): control and user-defined tokens are added tokens.
_ADDED_TOKEN_TYPES = (3, 4)


def tokenizer_json_from_gguf(gguf_path: str, out: Optional[str] = None) -> str:
    """Writes the ``tokenizer.json`` of a GGUF file's vocab (a byte-level BPE one,
    ``tokenizer.ggml.model == "gpt2"``: Llama 3, Qwen, GPT-2, DeepSeek ...) and returns its path,
    for :func:`context_from_llama`'s ``tokenizer``: the kinds that read token texts then work
    from the GGUF alone. Every id keeps its token (control and user-defined tokens as special
    added tokens), so token texts are exact; text is split by GPT-2's pre-tokenizer, which may
    split some text differently from the model's own (the ids a spec's text encodes to come from
    ``Llama.tokenize`` regardless). Needs the ``gguf`` package; reading a 150k-token vocab takes
    seconds (``out`` defaults to a file under ~/.cache/logits-processing/gguf-tokenizers, keyed on
    the GGUF's path, size and time, reused when it is there).

    Raises:
        ValueError: a vocab that is not byte-level BPE (SentencePiece's ``llama``, WordPiece).
    """
    stat = os.stat(gguf_path)
    if out is None:
        import hashlib

        key = hashlib.sha256(
            f"{os.path.abspath(gguf_path)}:{stat.st_size}:{stat.st_mtime_ns}".encode()
        ).hexdigest()
        cache = os.path.join(os.path.expanduser("~"), ".cache", "logits-processing", "gguf-tokenizers")
        out = os.path.join(cache, f"{key[:32]}.json")
        if os.path.exists(out):
            return out
        os.makedirs(cache, exist_ok=True)
    from gguf import GGUFReader

    fields = GGUFReader(gguf_path).fields

    def field(name: str) -> Any:
        return fields[name].contents() if name in fields else None

    model = field("tokenizer.ggml.model")
    if model != "gpt2":
        raise ValueError(
            f"{gguf_path}: tokenizer.ggml.model is {model!r}; only byte-level BPE ('gpt2') is converted"
        )
    tokens, types = field("tokenizer.ggml.tokens"), field("tokenizer.ggml.token_type") or []
    added = [
        {
            "id": i,
            "content": t,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, (t, kind) in enumerate(zip(tokens, types))
        if kind in _ADDED_TOKEN_TYPES
    ]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    doc = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": None,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {t: i for i, t in enumerate(tokens)},
            "merges": field("tokenizer.ggml.merges") or [],
        },
    }
    tmp = f"{out}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False)
    os.replace(tmp, out)  # whole or absent, for a reader beside this writer
    return out


def context_from_llama(llama: Any, *, tokenizer: Any = None, model_name: Optional[str] = None) -> Any:
    """The :class:`EngineContext` of a ``Llama`` object: its vocab size (``n_vocab()``), its EOS
    id and its own tokenizer (``Llama.tokenize``: ``hello_world``, the thinking tokens and the
    text specs carry get the ids the model would). Token texts (``grammar``, ``json_object``,
    ``ban_strings``, DRY's breakers) are read from a Hugging Face tokenizer (a ``Vocab``), not
    from llama.cpp's: pass ``tokenizer`` (the model's ``tokenizer.json`` path, a transformers
    fast tokenizer, a ``tokenizers.Tokenizer``, a ``Vocab``, or
    ``tokenizer_json_from_gguf(llama.model_path)``, the GGUF's own vocab) for those; it is read
    for token texts only. Without it those kinds are refused, naming the tokenizer."""
    own = LlamaTokenizer(llama)
    if model_name is None:
        model_name = (getattr(llama, "metadata", None) or {}).get("general.name")
    vocab = None
    if tokenizer is not None:
        vocab = (
            tokenizer
            if isinstance(tokenizer, _lib.Vocab)
            else _lib.Vocab(tokenizer, eos_token_id=own.eos_token_id)
        )
    return EngineContext(
        own,
        model_name=model_name,
        vocab_size=own.vocab_size,
        eos_token_id=own.eos_token_id,
        vocab=vocab,
    )


class LlamaCppLogitsProcessor:
    """Runs one ``logits_processing`` pipeline over llama-cpp-python's generation, one call into
    Rust per token. A contiguous float32 row is edited in place and returned; any other (the
    strided logit column of llama-cpp-python 0.3's candidate array, which it overwrites with
    what is returned) is copied once into a buffer kept for the next step, which is edited and
    returned.

    The first call's ids are taken as the prompt. llama-cpp-python calls once a token, with the
    previous call's ids and the token sampled after them; a call with any other ids (a new
    prompt, even one that extends the last output) starts a new generation, so one object (one
    ``LogitsProcessorList``) serves several ``__call__`` / ``create_completion`` calls in turn,
    each as a fresh processor would; not at once. Only a prompt that is exactly the previous
    call's ids and one more token reads as the same generation: :meth:`reset` starts over
    explicitly.

    An exception raised while a row is processed (by a Python processor in the pipeline, say)
    cannot reach the caller: llama-cpp-python's callback prints and drops it, and would sample
    from the unprocessed row. The processor keeps it as :attr:`error` instead and makes every
    later row of that generation allow only EOS, so the generation ends there; a new generation
    clears it.

    Args:
        pipeline: a JSON text, a spec dict, or a list of spec dicts, processor objects and
            callables ``(input_ids, logits_row) -> None``.
        llama: the ``llama_cpp.Llama`` the processor runs in; its vocab, EOS and tokenizer make
            the context (:func:`context_from_llama`).
        tokenizer: the model's Hugging Face tokenizer, for the kinds that read token texts
            (see :func:`context_from_llama`).
        context: instead of ``llama`` and ``tokenizer``, an :class:`EngineContext` built once
            (``context_from_llama(llama)``) and shared by every processor of that model.

    Example::

        from llama_cpp import Llama, LogitsProcessorList
        from logits_processing.adapters.llama_cpp import LlamaCppLogitsProcessor
        llm = Llama("model.gguf")
        proc = LlamaCppLogitsProcessor({"kind": "hello_world"}, llama=llm)
        out = llm("Say hi:", max_tokens=8, logits_processor=LogitsProcessorList([proc]))
    """

    def __init__(
        self,
        pipeline: Any,
        *,
        llama: Any = None,
        tokenizer: Any = None,
        context: Optional[_lib.EngineContext] = None,
    ) -> None:
        if context is None:
            if llama is None:
                raise _lib.ArgumentTypeError("give llama= (the Llama object) or context=")
            context = context_from_llama(llama, tokenizer=tokenizer)
        elif llama is not None or tokenizer is not None:
            raise _lib.ArgumentTypeError(
                "give context= or llama=/tokenizer=, not both (the context holds them)"
            )
        self.context = context_for(context)
        self._pipeline = check_in_process_pipeline(pipeline, engine="llama-cpp-python")
        if isinstance(self._pipeline, (str, bytes, dict)) or (
            isinstance(self._pipeline, (list, tuple)) and all(isinstance(p, dict) for p in self._pipeline)
        ):
            self.context.validate(self._pipeline)
        #: Reads from the device (waits, see ``adapters._common``): none, llama-cpp-python
        #: hands host arrays.
        self.device_reads = 0
        self.reset()

    def reset(self) -> None:
        """Forgets the current generation; the next call starts a new one."""
        self._batch = None
        self._last_ids: Optional[list] = None
        self.prompt_len: Optional[int] = None
        self._row = None
        self.error: Optional[BaseException] = None

    def _continues(self, ids: Any) -> bool:
        """Whether ``ids`` are the previous call's and the one token sampled after them:
        llama-cpp-python calls once a token, each call's ids one longer than the last."""
        import numpy as np

        last = self._last_ids
        return self._batch is not None and len(ids) == len(last) + 1 and np.array_equal(ids[:-1], last)

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import numpy as np  # llama-cpp-python's own dependency: there whenever this is called

        ids = np.asarray(input_ids)
        if not self._continues(ids):
            batch = self.context.batch(self.context.vocab_size or scores.shape[-1])
            batch.add(0, self._pipeline, prompt_len=len(ids))
            self._batch, self.prompt_len, self.error = batch, len(ids), None
        # A copy: llama-cpp-python passes a view of its own buffer, which it writes on.
        self._last_ids = ids.copy()
        if scores.dtype == np.float32 and scores.flags.c_contiguous:
            row = scores  # edited in place, no copy
        else:
            # llama-cpp-python (0.3) runs the processors as the first sampler of its chain, on
            # the logit column of its candidate array (every id, in id order): a strided view,
            # which it overwrites with what is returned. The row is copied into one buffer,
            # reused each step.
            if self._row is None or self._row.shape != scores.shape:
                self._row = np.empty(scores.shape, dtype=np.float32)
            np.copyto(self._row, scores)
            row = self._row
        if self.error is None:
            try:
                self._batch.apply(row.reshape(1, -1), [ids])
                return row
            except Exception as error:
                # Raised here, it would reach llama-cpp-python's ctypes callback, which prints
                # and drops it and samples from the row unprocessed: the generation ends instead.
                self.error = error
        eos = self.context.eos_token_ids
        if not eos:
            raise self.error
        row[:] = -np.inf
        row[eos[0]] = 0.0
        return row
