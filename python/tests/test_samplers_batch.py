"""The samplers of llama.cpp and text-generation-webui through a Batch: each row as the same spec
alone in a Processor gives it, step after step (mirostat's mu and DRY's matches carried in the
batch's rows), and a row moved keeps its state."""

from __future__ import annotations

import numpy as np
import torch

from logits_processing import Batch, Processor

VOCAB = 300

SPECS = [
    {"kind": "top_n_sigma", "n": 1.0},
    {"kind": "top_a", "a": 0.2},
    {"kind": "p_less"},
    {"kind": "tail_free", "z": 0.9},
    {"kind": "xtc", "probability": 0.5, "threshold": 0.05, "seed": 3},
    {"kind": "dynamic_temperature", "temperature": 0.9, "range": 0.4},
    {"kind": "smoothing", "factor": 0.4, "curve": 1.5},
    [
        {"kind": "repetition_penalty", "penalty": 1.3, "window": 16},
        {"kind": "dry", "multiplier": 0.8, "penalty_last_n": 64, "sequence_breaker_ids": [[7]]},
        {"kind": "mirostat", "version": 2, "tau": 4.0, "eta": 0.3},
    ],
    {"kind": "mirostat", "version": 1, "tau": 5.0, "n_vocab": VOCAB},
    [{"kind": "min_p", "p": 0.02}, {"kind": "adaptive_p", "target": 0.3, "decay": 0.8}],
]


def test_every_row_equals_its_spec_alone_step_after_step():
    rng = np.random.default_rng(0)
    batch = Batch(VOCAB)
    alone = []
    for row, spec in enumerate(SPECS):
        batch.add(row, spec)
        alone.append(Processor(spec))
    ids = [[1, 2, 3] for _ in SPECS]
    moved = 0
    for step in range(25):
        block = torch.tensor(rng.normal(0, 3, (len(SPECS), VOCAB)).astype(np.float32))
        expected = block.clone()
        before = block.clone()
        batch.apply(block, ids)
        for row, processor in enumerate(alone):
            processor(ids[row], expected[row])
        assert torch.equal(block, expected), step
        # mirostat's mu moves: a fresh processor (mu at 2 tau) keeps another set at some step.
        fresh = before[7].clone()
        Processor(SPECS[7])(ids[7], fresh)
        moved += not torch.equal(fresh, block[7])
        for row in range(len(SPECS)):
            finite = torch.isfinite(block[row])
            candidates = torch.nonzero(finite).flatten().tolist()
            # The engine samples among the kept tokens; repeats feed DRY and the penalties.
            ids[row].append(int(rng.choice(candidates[:5])))
    assert moved > 0
    # A moved row keeps its state (mirostat's mu, DRY's matches).
    batch.move(6, 20)
    block = torch.tensor(rng.normal(0, 3, (21, VOCAB)).astype(np.float32))
    expected = block[20].clone()
    batch.apply(block, [ids[r] if r < len(SPECS) and r != 6 else None for r in range(20)] + [ids[6]])
    alone[6](ids[6], expected)
    assert torch.equal(block[20], expected)
