"""p_less against p-less sampling's published definition (arXiv 2509.23234), written out here in
numpy in f64: keep the tokens whose probability is at least sum_i p_i^2 (normalized, p-less-norm:
at least (n sum_i p_i^2 - 1) / (n - 1) over the n finite tokens), then the min_keep most likely;
and against the authors' torch functions (``p_less_decode``, ``p_less_norm_decode``'s masks,
restated here) on rows no earlier step cut, where n is the vocab size."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from logits_processing import Processor


def p_less(row: np.ndarray, min_keep: int = 1, normalized: bool = False) -> np.ndarray:
    """The kept mask of the paper's rule, in f64."""
    x = row.astype(np.float64)
    finite = np.isfinite(x)
    q = np.where(finite, np.exp(x - x[finite].max()), 0.0)
    p = q / q.sum()
    n = finite.sum()
    threshold = (p * p).sum()
    if normalized:
        threshold = (n * threshold - 1) / (n - 1) if n > 1 else 0.0
    keep = p >= threshold
    keep[np.argsort(-x, kind="stable")[:min_keep]] = True
    return keep & finite


def ours(row: np.ndarray, min_keep: int = 1, normalized: bool = False) -> np.ndarray:
    out = torch.from_numpy(row.copy())
    Processor({"kind": "p_less", "min_tokens_to_keep": min_keep, "normalized": normalized})([0], out)
    kept = out.isfinite().numpy()
    # Kept logits are left as they were.
    assert np.array_equal(out.numpy()[kept], row[kept])
    return kept


@pytest.mark.parametrize("normalized", [False, True])
@pytest.mark.parametrize("min_keep", [1, 2, 5])
def test_equals_the_definition_on_random_rows(min_keep, normalized):
    rng = np.random.default_rng(3)
    for length in (2, 7, 100, 5000, 32001):
        for scale in (0.3, 2.0, 8.0):
            row = (rng.standard_normal(length) * scale).astype(np.float32)
            row[rng.random(length) < 0.1] = -np.inf
            row[0] = 1.0  # at least one finite logit
            differ = (ours(row, min_keep, normalized) != p_less(row, min_keep, normalized)).sum()
            # Our fixed-point softmax against f64: at most a token at the threshold.
            assert differ <= 1, (length, scale, differ)


@pytest.mark.parametrize("normalized", [False, True])
def test_equals_the_authors_masks_on_uncut_rows(normalized):
    """The masks of the authors' ``p_less_decode`` / ``p_less_norm_decode`` (probabilities below
    the threshold zeroed; v the vocab size), in torch's f32."""
    g = torch.Generator().manual_seed(11)
    for length in (3, 50, 4000, 151936):
        for scale in (0.5, 3.0, 10.0):
            row = torch.randn(length, generator=g) * scale
            probs = row.softmax(-1)
            p = probs.square().sum()
            if normalized:
                p = (length * p - 1.0) / (length - 1.0)
            want = ~(probs < p)
            got = torch.from_numpy(ours(row.numpy(), 1, normalized))
            assert (got != want).sum() <= 1, (length, scale)
            assert got.sum() >= 1


def test_ties_at_the_threshold_are_kept():
    # Uniform over the finite tokens: every p equals sum p^2 = 1/n.
    row = np.array([0.5, 0.5, -np.inf, 0.5, 0.5], dtype=np.float32)
    assert ours(row).tolist() == [True, True, False, True, True]
    # Two tied leaders and a tail: p = (0.4, 0.4, 0.2), sum p^2 = 0.36.
    row = np.log(np.array([2.0, 2.0, 1.0], dtype=np.float32))
    assert ours(row).tolist() == [True, True, False] == p_less(row).tolist()
    # Normalized: (3 * 0.36 - 1) / 2 = 0.04, all three kept.
    assert ours(row, normalized=True).tolist() == [True, True, True] == p_less(row, normalized=True).tolist()


def test_a_single_finite_token_is_kept():
    row = np.array([-np.inf, -np.inf, 4.0, -np.inf], dtype=np.float32)
    assert ours(row).tolist() == [False, False, True, False]


def test_a_row_without_a_finite_logit_is_left_alone():
    row = np.full(4, -np.inf, dtype=np.float32)
    assert not ours(row).any()


def test_min_tokens_to_keep_zero_is_refused_naming_the_field():
    with pytest.raises(Exception, match="min_tokens_to_keep"):
        Processor({"kind": "p_less", "min_tokens_to_keep": 0})
