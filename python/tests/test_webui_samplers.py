"""smoothing, top_a and tail_free against text-generation-webui's definitions
(modules/sampler_hijack.py), written out here in torch as the webui writes them."""

from __future__ import annotations

import pytest
import torch

from logits_processing import Processor


def webui_quadratic(scores, smoothing_factor, smoothing_curve):
    """QuadraticSamplingLogitsWarper.__call__."""
    max_logit = scores.max()
    diff = scores - max_logit
    k = (3 - smoothing_curve) / 2
    s = (smoothing_curve - 1) / 2
    return torch.where(
        scores != float("-inf"),
        -(k * smoothing_factor * diff**2) + (s * smoothing_factor * diff**3) + max_logit,
        scores,
    )


def webui_top_a(scores, top_a, min_tokens_to_keep=1):
    """TopALogitsWarper.__call__ (one row)."""
    scores = scores[None]
    sorted_logits, sorted_indices = torch.sort(scores, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    probs_max = probs[..., 0, None]
    sorted_indices_to_remove = probs < probs_max * probs_max * top_a
    if min_tokens_to_keep > 1:
        sorted_indices_to_remove[..., :min_tokens_to_keep] = 0
    indices_to_remove = sorted_indices_to_remove.scatter(1, sorted_indices, sorted_indices_to_remove)
    return scores.masked_fill(indices_to_remove, -float("inf"))[0]


def webui_tail_free(scores, tfs, min_tokens_to_keep=1):
    """TailFreeLogitsWarper.__call__ (one row)."""
    scores = scores[None]
    sorted_logits, sorted_indices = torch.sort(scores, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    d2 = probs.diff().diff().abs()
    normalized_d2 = d2 / d2.sum(dim=-1, keepdim=True)
    normalized_d2_cdf = normalized_d2.cumsum(dim=-1)
    sorted_indices_to_remove = normalized_d2_cdf > tfs
    sorted_indices_to_remove = torch.cat(
        (
            torch.zeros(scores.shape[0], 1, dtype=torch.bool, device=scores.device),
            sorted_indices_to_remove,
            torch.ones(scores.shape[0], 1, dtype=torch.bool, device=scores.device),
        ),
        dim=-1,
    )
    if min_tokens_to_keep > 1:
        sorted_indices_to_remove[..., :min_tokens_to_keep] = 0
    indices_to_remove = sorted_indices_to_remove.scatter(1, sorted_indices, sorted_indices_to_remove)
    return scores.masked_fill(indices_to_remove, -float("inf"))[0]


def rows(seed):
    g = torch.Generator().manual_seed(seed)
    for length in (3, 10, 257, 4096):
        for scale in (0.5, 2.0, 8.0):
            yield torch.randn(length, generator=g) * scale + 3.0


def ours(spec, row):
    out = row.clone()
    Processor(spec)([0], out)
    return out


@pytest.mark.parametrize("factor, curve", [(0.3, 1.0), (1.0, 1.0), (0.25, 2.5), (2.0, 0.5)])
def test_smoothing_equals_the_webui_bit_for_bit(factor, curve):
    for row in rows(1):
        row[1] = float("-inf")
        got = ours({"kind": "smoothing", "factor": factor, "curve": curve}, row)
        want = webui_quadratic(row, factor, curve)
        assert torch.equal(got, want)


@pytest.mark.parametrize("a", [0.0, 0.05, 0.2, 0.8])
@pytest.mark.parametrize("min_keep", [1, 3])
def test_top_a_equals_the_webui(a, min_keep):
    for row in rows(2):
        got = ours({"kind": "top_a", "a": a, "min_tokens_to_keep": min_keep}, row)
        want = webui_top_a(row, a, min_keep)
        # torch's f32 softmax against our fixed-point one: at most a token at the threshold.
        assert (got.isfinite() != want.isfinite()).sum() <= 1


@pytest.mark.parametrize("z", [0.3, 0.9, 0.95, 0.99])
@pytest.mark.parametrize("min_keep", [1, 2])
def test_tail_free_equals_the_webui_on_finite_rows(z, min_keep):
    for row in rows(3):
        got = ours({"kind": "tail_free", "z": z, "min_tokens_to_keep": min_keep}, row)
        want = webui_tail_free(row, z, min_keep)
        # The webui sums in f32, we in f64: at most a token at the cut.
        assert (got.isfinite() != want.isfinite()).sum() <= 1


def test_tail_free_takes_no_step_down_to_minus_infinity():
    # The webui's sort puts -inf's zero probabilities in the tail; ours leaves them out.
    row = torch.tensor([3.0, 2.0, 1.5, 1.0, 0.0, float("-inf"), float("-inf")])
    got = ours({"kind": "tail_free", "z": 0.9}, row)
    finite = row[row.isfinite()]
    want = webui_tail_free(finite, 0.9)
    assert torch.equal(got[:5].isfinite(), want.isfinite())
