"""explain: each step's numbers are the library's output on the row, and the picture draws them."""

import numpy as np
import pytest

import logits_processing as lp
from logits_processing.explain import explain, figure, synthetic_row


def _direct(specs, row):
    x = row.copy()
    lp.Processor(specs)(np.zeros(0, np.int64), x)
    e = np.exp(x.astype(np.float64) - x.max())
    return e / e.sum()


@pytest.mark.parametrize("specs", [
    [{"kind": "temperature", "temperature": 0.5}, {"kind": "top_k", "k": 3}],
    [{"kind": "top_p", "p": 0.5}],
    [{"kind": "ban_tokens", "token_ids": [0, 1, 2]}, {"kind": "min_p", "p": 0.2}],
])
@pytest.mark.parametrize("shape", ["flat", "peaked", "zipf"])
def test_steps_and_figure_come_from_the_pipeline(specs, shape, tmp_path):
    pytest.importorskip("matplotlib")
    row = synthetic_row(shape, 500)
    steps = explain(specs, row)
    assert len(steps) == len(specs) + 1
    for k, s in enumerate(steps[1:], 1):
        p = _direct(specs[:k], row)
        np.testing.assert_allclose(s.probs, p, rtol=1e-9, atol=1e-12)
        assert s.kept == int((p > 0).sum())
        nz = p[p > 0]
        assert s.entropy_bits == pytest.approx(-(nz * np.log2(nz)).sum())
    fig = figure(steps)
    fig.savefig(tmp_path / "x.png")  # draws the tick labels too
    labels = [int(t.get_text()) for t in fig.axes[0].get_yticklabels()]  # shared by the panels
    assert labels
    for ax, s in zip(fig.axes, steps):
        assert [b.get_width() for b in ax.patches] == pytest.approx([s.probs[t] for t in labels])
    assert (tmp_path / "x.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
