"""`inf_nan_remove` against transformers' `InfNanRemoveLogitsProcessor` (`remove_invalid_values`)
on random rows with NaN and infinities, in every row type the batch takes: bit for bit."""

from __future__ import annotations

import pytest
import torch

from logits_processing import Batch, Processor

hf = pytest.importorskip("transformers.generation.logits_process")


def rows(seed: int, vocab: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(5, vocab, generator=g) * 4
    special = torch.tensor([float("nan"), float("inf"), float("-inf")])
    where = torch.rand(5, vocab, generator=g)
    pick = torch.randint(0, 3, (5, vocab), generator=g)
    x = torch.where(where < 0.2, special[pick], x)
    x[1] = float("-inf")  # every token banned
    x[2] = float("nan")
    x[3, : vocab // 2] = float("inf")
    return x.to(dtype)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("vocab", [3, 1000, 151936])
def test_equals_transformers_bit_for_bit(dtype, vocab):
    x = rows(vocab, vocab, dtype)
    want = hf.InfNanRemoveLogitsProcessor()(None, x.clone())
    batch = Batch(vocab)
    for row in range(x.shape[0]):
        batch.add(row, [{"kind": "inf_nan_remove"}])
    got = x.clone()
    batch.apply(got, [[0]] * x.shape[0])
    assert torch.equal(bits(got), bits(want))
    assert got.isfinite().all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_after_bans_and_a_forced_eos_as_generate_chains_them(dtype):
    """forced_eos, then remove_invalid_values (generate()'s order): the EOS at 0 and every other
    logit at finfo.min; bans before it end at finfo.min too."""
    vocab, eos = 50, 7
    x = rows(5, vocab, dtype)[0]
    ids = torch.zeros((1, 9), dtype=torch.long)
    forced = hf.ForcedEOSTokenLogitsProcessor(10, eos)(ids, x[None].clone())
    want = hf.InfNanRemoveLogitsProcessor()(ids, forced)[0]
    got = x.clone()
    Processor([{"kind": "forced_eos", "max_length": 10, "eos_token_ids": [eos]}, {"kind": "inf_nan_remove"}])(
        ids[0].tolist(), got
    )
    assert torch.equal(bits(got), bits(want))

    banned = hf.NoBadWordsLogitsProcessor([[3], [4]], eos_token_id=eos)(ids, x[None].clone())
    want = hf.InfNanRemoveLogitsProcessor()(ids, banned)[0]
    got = x.clone()
    Processor([{"kind": "ban_tokens", "token_ids": [3, 4]}, {"kind": "inf_nan_remove"}])(ids[0].tolist(), got)
    # transformers adds -inf to a banned logit (NaN stays NaN, then 0.0); the ban sets -inf.
    same = ~x.isnan()
    same[[3, 4]] = True
    assert torch.equal(bits(got)[same], bits(want)[same])
    assert got[3] == torch.finfo(dtype).min


def test_the_canonical_order_puts_it_after_the_forced_eos():
    from logits_processing import canonical_order

    specs = [
        {"kind": "temperature", "temperature": 0.5},
        {"kind": "inf_nan_remove"},
        {"kind": "forced_eos", "max_length": 4, "eos_token_ids": [1]},
        {"kind": "ban_tokens", "token_ids": [2]},
    ]
    kinds = [s["kind"] for s in canonical_order(specs)]
    assert kinds == ["ban_tokens", "forced_eos", "inf_nan_remove", "temperature"]


def test_fields_are_refused():
    with pytest.raises(Exception, match="unknown field"):
        Processor({"kind": "inf_nan_remove", "value": 0})
