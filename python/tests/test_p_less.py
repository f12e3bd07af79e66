"""p_less against p-less sampling's published definition (arXiv 2509.23234), written out here in
numpy in f64: keep the tokens whose probability is at least sum_i p_i^2, then the min_keep most
likely."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from logits_processing import Processor


def p_less(row: np.ndarray, min_keep: int = 1) -> np.ndarray:
    """The kept mask of the paper's rule, in f64."""
    x = row.astype(np.float64)
    finite = np.isfinite(x)
    q = np.where(finite, np.exp(x - x[finite].max()), 0.0)
    p = q / q.sum()
    keep = p >= (p * p).sum()
    keep[np.argsort(-x, kind="stable")[:min_keep]] = True
    return keep & finite


def ours(row: np.ndarray, min_keep: int = 1) -> np.ndarray:
    out = torch.from_numpy(row.copy())
    Processor({"kind": "p_less", "min_tokens_to_keep": min_keep})([0], out)
    kept = out.isfinite().numpy()
    # Kept logits are left as they were.
    assert np.array_equal(out.numpy()[kept], row[kept])
    return kept


@pytest.mark.parametrize("min_keep", [1, 2, 5])
def test_equals_the_definition_on_random_rows(min_keep):
    rng = np.random.default_rng(3)
    for length in (2, 7, 100, 5000, 32001):
        for scale in (0.3, 2.0, 8.0):
            row = (rng.standard_normal(length) * scale).astype(np.float32)
            row[rng.random(length) < 0.1] = -np.inf
            row[0] = 1.0  # at least one finite logit
            differ = (ours(row, min_keep) != p_less(row, min_keep)).sum()
            # Our fixed-point softmax against f64: at most a token at the threshold.
            assert differ <= 1, (length, scale, differ)


def test_ties_at_the_threshold_are_kept():
    # Uniform over the finite tokens: every p equals sum p^2 = 1/n.
    row = np.array([0.5, 0.5, -np.inf, 0.5, 0.5], dtype=np.float32)
    assert ours(row).tolist() == [True, True, False, True, True]
    # Two tied leaders and a tail: p = (0.4, 0.4, 0.2), sum p^2 = 0.36.
    row = np.log(np.array([2.0, 2.0, 1.0], dtype=np.float32))
    assert ours(row).tolist() == [True, True, False] == p_less(row).tolist()


def test_a_single_finite_token_is_kept():
    row = np.array([-np.inf, -np.inf, 4.0, -np.inf], dtype=np.float32)
    assert ours(row).tolist() == [False, False, True, False]


def test_a_row_without_a_finite_logit_is_left_alone():
    row = np.full(4, -np.inf, dtype=np.float32)
    assert not ours(row).any()


def test_min_tokens_to_keep_zero_is_refused_naming_the_field():
    with pytest.raises(Exception, match="min_tokens_to_keep"):
        Processor({"kind": "p_less", "min_tokens_to_keep": 0})
