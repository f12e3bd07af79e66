"""`log_softmax` against transformers' `LogitNormalization` (``renormalize_logits``) on random f32
rows, alone and after a truncation as transformers runs it after its warpers: within an ulp of
the log-sum of torch's values, `-inf` where torch has it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from logits_processing import Batch, Processor

hf = pytest.importorskip("transformers.generation.logits_process")


def rows(seed: int, vocab: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(6, vocab, generator=g) * 3
    x[1, : vocab // 2] = float("-inf")
    x[2] = torch.round(x[2])  # ties
    x[3] = float("-inf")
    x[3, 1] = 1.5  # one finite token
    x[4] *= 1e4  # extreme
    x[5] *= 1e-3  # nearly flat
    return x


@pytest.mark.parametrize("vocab", [2, 150, 151936])
@pytest.mark.parametrize("seed", [0, 1])
def test_equals_transformers_logit_normalization(vocab, seed):
    x = rows(seed, vocab)
    want = hf.LogitNormalization()(None, x.clone())
    batch = Batch(vocab)
    for row in range(x.shape[0]):
        batch.add(row, [{"kind": "log_softmax"}])
    got = x.clone()
    batch.apply(got, [[0]] * x.shape[0])
    assert torch.equal(got.isinf(), want.isinf())
    finite = want.isfinite()
    np.testing.assert_allclose(got[finite].numpy(), want[finite].numpy(), rtol=0, atol=2e-6 * max(1.0, float(want[finite].abs().max())))


def test_after_a_truncation_as_transformers_chains_it():
    x = rows(3, 1000)[0]
    want = hf.LogitNormalization()(None, hf.TopKLogitsWarper(20)(None, x[None].clone()))[0]
    got = x.clone()
    Processor([{"kind": "top_k", "k": 20}, {"kind": "log_softmax"}])([0], got)
    assert torch.equal(got.isfinite(), want.isfinite())
    np.testing.assert_allclose(got[got.isfinite()].numpy(), want[want.isfinite()].numpy(), atol=2e-6)
    assert abs(float(got[got.isfinite()].exp().sum()) - 1.0) < 1e-5


def test_a_row_without_a_finite_logit_and_nan_are_left_alone():
    row = torch.full((4,), float("-inf"))
    Processor({"kind": "log_softmax"})([0], row)
    assert row.isneginf().all()
    row = torch.tensor([1.0, float("nan"), 1.0])
    Processor({"kind": "log_softmax"})([0], row)
    assert row[1].isnan() and torch.allclose(row[[0, 2]], torch.tensor([0.5, 0.5]).log())


def test_fields_are_refused():
    with pytest.raises(Exception, match="unknown field"):
        Processor({"kind": "log_softmax", "dim": -1})
