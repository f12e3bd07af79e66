"""``repetition_detection`` against vLLM's own ``check_sequence_repetition`` (the check its
scheduler's ``check_stop`` makes after each generated token): on random and constructed
outputs, step by step, our kind forces EOS at exactly the steps where vLLM's check ends the
request, for vLLM's ``RepetitionDetectionParams``.

Runs in the vLLM venv (scripts/engine-venv.sh vllm); skipped where vLLM does not import."""

import random

import numpy as np
import pytest

utils = pytest.importorskip("vllm.v1.core.sched.utils")
from vllm.sampling_params import RepetitionDetectionParams  # noqa: E402

from logits_processing import Processor  # noqa: E402

EOS = 0
V = 16
PROMPT = [5, 6, 5, 6, 5, 6, 5, 6]  # a repetitive prompt: only generated ids count


def forced_eos(row):
    return np.isfinite(row).sum() == 1 and np.isfinite(row[EOS])


PARAMS = [(8, 1, 3), (4, 2, 2), (1, 0, 5), (6, 3, 2), (16, 1, 4), (0, 0, 0)]


@pytest.mark.parametrize("max_size,min_size,min_count", PARAMS)
def test_the_kind_fires_where_vllms_check_does(max_size, min_size, min_count):
    params = RepetitionDetectionParams(
        max_pattern_size=max_size, min_pattern_size=min_size, min_count=min_count)
    spec = {"kind": "repetition_detection", "max_pattern_size": max_size,
            "min_pattern_size": min_size, "min_count": min_count, "eos_token_ids": [EOS]}
    rng = random.Random(max_size * 100 + min_count)
    fired = 0
    for case in range(60):
        # Random ids over a small alphabet, with patterns repeated into them.
        output = []
        while len(output) < 80:
            if rng.random() < 0.3:
                pattern = [rng.randrange(1, 4 if case % 2 else V) for _ in range(rng.randrange(1, 7))]
                output += pattern * rng.randrange(1, 5)
            else:
                output.append(rng.randrange(1, V))
        processor = Processor([spec], prompt_len=len(PROMPT))
        for t in range(len(output) + 1):
            row = np.zeros(V, dtype=np.float32)
            processor(PROMPT + output[:t], row)
            want = utils.check_sequence_repetition(output[:t], params)
            assert forced_eos(row) == want, (case, t, output[:t])
            fired += want
    assert fired > 0 or max_size == 0


def test_from_vllm_carries_the_params_of_a_sampling_params():
    from vllm import SamplingParams

    from logits_processing.convert import from_vllm

    params = SamplingParams(repetition_detection=RepetitionDetectionParams(
        max_pattern_size=6, min_pattern_size=2, min_count=3))
    assert from_vllm(params, eos_token_ids=[EOS]).specs == [
        {"kind": "repetition_detection", "max_pattern_size": 6, "min_pattern_size": 2, "min_count": 3,
         "eos_token_ids": [EOS]}]
