"""A Qwen3 ``tokenizer.json`` built offline from the BPE ranks the ``dashscope`` wheel ships.

    python python/benchmarks/qwen_tokenizer.py   # prints the tokenizer.json's path

No Qwen ``tokenizer.json`` is on the package index, but Alibaba's ``dashscope`` wheel (Apache-2.0)
ships ``dashscope/resources/qwen.tiktoken``: the 151,643 byte-level BPE ranks Qwen2, 2.5 and 3
share. pip downloads the pinned wheel (``--no-deps``, into the cache, never installed), and
transformers' ``TikTokenConverter`` turns the ranks into a ``tokenizers`` BPE (merges derived from
the ranks) with the Qwen2 split pattern and the byte-level pre-tokenizer and decoder. On top go
what Qwen3's own ``tokenizer.json`` declares: an NFC normalizer, ``ignore_merges`` off, and its 26
added tokens at ids 151,643-151,668 (``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``, ...,
``<think>``, ``</think>``; the first 14 special). The result lives in
``~/.cache/logits-processing/qwen3-tokenizer/`` and is built once (about half a minute).

Qwen3 models' logits are 151,936 wide (``QWEN_LOGITS``), padded beyond the 151,669 tokens.
"""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

DASHSCOPE = "dashscope==2.0.2"
RANKS_MEMBER = "dashscope/resources/qwen.tiktoken"
RANKS_SHA256 = "b2b1b8dfb5cc5f024bafc373121c6aba3f66f9a5a0269e243470a1de16a33186"

# Qwen2's pre-tokenizer split (digits one at a time), as in dashscope's qwen_tokenizer.py and
# Qwen3's tokenizer.json.
PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
BPE_TOKENS = 151_643
# Qwen3's added tokens in id order from BPE_TOKENS, and whether its tokenizer.json marks each special.
ADDED = [
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
    ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True),
    ("<tool_call>", False), ("</tool_call>", False), ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False), ("<tool_response>", False),
    ("</tool_response>", False), ("<think>", False), ("</think>", False),
]  # fmt: skip
ENDOFTEXT, IM_END = 151_643, 151_645
QWEN_LOGITS = 151_936

CACHE = (
    Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "logits-processing" / "qwen3-tokenizer"
)


class TokenizerUnavailable(RuntimeError):
    """The dashscope wheel could not be downloaded (offline) or is not the one expected."""


def _ranks(into: Path) -> Path:
    """``qwen.tiktoken`` out of the pinned dashscope wheel, checked by its hash."""
    path = into / "qwen.tiktoken"
    if path.exists():
        return path
    with tempfile.TemporaryDirectory() as tmp:
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", tmp, DASHSCOPE]
        done = subprocess.run(pip, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("dashscope-*.whl"))
        if done.returncode != 0 or not wheels:
            raise TokenizerUnavailable(f"pip download {DASHSCOPE} failed: {done.stderr.strip()[-500:]}")
        data = zipfile.ZipFile(wheels[0]).read(RANKS_MEMBER)
    if hashlib.sha256(data).hexdigest() != RANKS_SHA256:
        raise TokenizerUnavailable(f"{RANKS_MEMBER} in {DASHSCOPE} is not the file expected")
    into.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _convert(ranks: Path):
    from tokenizers import AddedToken, normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    class QwenRanks(TikTokenConverter):
        @staticmethod
        def load_tiktoken_bpe(path):
            # tiktoken's own loader reads the same "base64 rank" lines; this spares the dependency.
            lines = Path(path).read_bytes().splitlines()
            return {
                base64.b64decode(token): int(rank) for token, rank in (line.split() for line in lines if line)
            }

    tokenizer = QwenRanks(vocab_file=str(ranks), pattern=PATTERN).converted()
    assert tokenizer.get_vocab_size() == BPE_TOKENS, tokenizer.get_vocab_size()
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.model.ignore_merges = False
    added = [AddedToken(text, special=special, normalized=False) for text, special in ADDED]
    tokenizer.add_tokens(added)
    for offset, (text, _) in enumerate(ADDED):
        assert tokenizer.token_to_id(text) == BPE_TOKENS + offset, text
    return tokenizer


def qwen_tokenizer_json(cache: Path = CACHE) -> Path:
    """The path of the Qwen3 ``tokenizer.json``, built on first use. Raises ``TokenizerUnavailable``
    when the dashscope wheel cannot be had."""
    path = cache / "tokenizer.json"
    if not path.exists():
        tokenizer = _convert(_ranks(cache))
        tmp = path.with_suffix(".tmp")
        tokenizer.save(str(tmp))
        tmp.replace(path)  # whole or absent, for a concurrent reader
    return path


if __name__ == "__main__":
    print(qwen_tokenizer_json())
