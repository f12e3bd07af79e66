"""`synthid_watermark` against transformers' `SynthIDTextWatermarkLogitsProcessor` over several
steps of a batch: the rows left alone (a repeated context, the skipped first calls) and the
`finfo.min` of a zero probability bit for bit, the others within the f32 rounding of torch's
softmax and log (their sums are f64 here, f32 in torch's order): `2e-6` relative plus `1e-6`
absolute in f32, a unit in the last place of the row's type (plus `1e-6`) in f16 and bf16."""

from __future__ import annotations

import pytest
import torch

from logits_processing import Batch, Processor

hf = pytest.importorskip("transformers.generation.logits_process")

KEYS = {
    "nine": [654, 400, 836, 123, 340, 443, 597, 160, 57],
    "one": [7],
    "large": [2**62 + 5, -(2**63), 12345678901234, -1, 0],
}


def run_both(vocab, keys, ngram_len, skip, steps, dtype=torch.float32, history=1024, seed=0, table=2**16, batch=3):
    g = torch.Generator().manual_seed(vocab + ngram_len + len(keys))
    prompt_len = 4
    input_ids = torch.randint(0, vocab, (batch, prompt_len), generator=g)
    theirs = hf.SynthIDTextWatermarkLogitsProcessor(
        ngram_len=ngram_len,
        keys=keys,
        sampling_table_size=table,
        sampling_table_seed=seed,
        context_history_size=history,
        device=torch.device("cpu"),
        skip_first_ngram_calls=skip,
    )
    spec = {
        "kind": "synthid_watermark",
        "ngram_len": ngram_len,
        "keys": keys,
        "sampling_table_size": table,
        "sampling_table_seed": seed,
        "context_history_size": history,
        "skip_first_ngram_calls": skip,
    }
    ours = Batch(vocab)
    for row in range(batch):
        ours.add(row, [spec], prompt_len=prompt_len)
    results = []
    for _ in range(steps):
        scores = (torch.randn(batch, vocab, generator=g) * 3).to(dtype)
        scores[0, : vocab // 3] = float("-inf")  # banned tokens
        want = theirs(input_ids, scores.clone())
        got = scores.clone()
        ours.apply(got, input_ids.tolist())
        results.append((scores, want, got, conditioning(theirs, scores)))
        # Few distinct ids, so contexts repeat.
        nxt = torch.randint(0, 3, (batch, 1), generator=g)
        input_ids = torch.cat([input_ids, nxt], dim=1)
    return results


def conditioning(theirs, scores):
    """Per token, how much the f32 rounding of the masses moves its result: the sum over depths of
    `1 / (1 + g - mass)` (a mass near 1 makes `1 - mass` lose its digits, in torch as here), from
    transformers' own g-values for the context of the call just made, with f64 masses."""
    vocab = scores.shape[1]
    indices = torch.arange(vocab)[None].expand(scores.shape[0], -1)
    keys, _ = theirs._compute_keys(theirs.state.context, indices)
    g = theirs.sample_g_values(keys).double()
    probs = torch.softmax(scores.double(), dim=1)
    total = torch.zeros_like(probs)
    least = torch.ones_like(probs) * 2
    for d in range(g.shape[2]):
        mass = (g[:, :, d] * probs).sum(dim=1, keepdim=True)
        factor = 1 + g[:, :, d] - mass
        total += 1 / factor.clamp_min(1e-30)
        least = torch.minimum(least, factor)
        probs = probs * factor
    return total, least


def compare(scores, want, got, cond):
    """Rows transformers left alone are ours exactly; the others within the tolerance above, with
    `finfo.min` at the same places. Returns the largest difference seen."""
    dtype = scores.dtype
    worst = 0.0
    for r in range(scores.shape[0]):
        if torch.equal(want[r], scores[r]):
            assert torch.equal(got[r], scores[r])
            continue
        low = torch.finfo(dtype).min
        eps = 2**-23 if dtype == torch.float32 else torch.finfo(dtype).eps
        # Where a depth's mass is within rounding of 1 (`1 - mass` below 64 units of the type
        # near 1), the factor is the rounding of two f32 sums in different orders: torch's
        # `1 - mass` may be 0 (finfo.min) where ours is not, or the reverse. Those tokens only
        # are left out.
        total, least = cond
        settled = least[r] > 16 * eps
        assert torch.equal((want[r] == low) & settled, (got[r] == low) & settled)
        keep = (want[r] != low) & (got[r] != low) & settled
        w, o = want[r][keep].double(), got[r][keep].double()
        tol = 16 * eps * w.abs() + 1e-6 + 4 * eps * total[r][keep]
        # Most tokens are compared.
        assert int(keep.sum()) >= 0.5 * int((want[r] != low).sum()), (int(keep.sum()), int((want[r] != low).sum()))
        assert bool(((w - o).abs() <= tol).all()), f"off by {float((w - o).abs().max())}"
        if w.numel():
            worst = max(worst, float((w - o).abs().max()))
    return worst


def rows_left_alone(want, scores):
    return [torch.equal(want[r], scores[r]) for r in range(want.shape[0])]


@pytest.mark.parametrize("keys", list(KEYS))
@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize("vocab", [17, 1000])
def test_equals_transformers_over_steps(keys, skip, vocab):
    alone = 0
    for scores, want, got, cond in run_both(vocab, KEYS[keys], 3, skip, 10):
        compare(scores, want, got, cond)
        for r, same in enumerate(rows_left_alone(want, scores)):
            # Exact where transformers leaves a row alone: a repeated context, a skipped call.
            assert torch.equal(got[r], scores[r]) == same
            alone += same
    # The cases happened: contexts repeat (few distinct ids), and the skipped calls.
    assert alone > 0


def test_the_full_vocab_and_every_dtype():
    for dtype in [torch.float32, torch.float16, torch.bfloat16]:
        for scores, want, got, cond in run_both(151936, KEYS["nine"], 5, False, 3, dtype=dtype, batch=2):
            compare(scores, want, got, cond)


@pytest.mark.parametrize("table,seed,history", [(1000, 7, 2), (3, 2**40 + 1, 0), (2**20, 123, 1)])
def test_tables_seeds_and_histories(table, seed, history):
    for scores, want, got, cond in run_both(64, KEYS["nine"], 2, False, 8, table=table, seed=seed, history=history):
        compare(scores, want, got, cond)
        for r, same in enumerate(rows_left_alone(want, scores)):
            assert torch.equal(got[r], scores[r]) == same


def test_a_resumed_request_marks_as_the_uninterrupted_one():
    """A processor built at step 6 from the ids plans what the one that ran from the start does."""
    spec = {"kind": "synthid_watermark", "ngram_len": 3, "keys": KEYS["nine"], "context_history_size": 4}
    g = torch.Generator().manual_seed(3)
    running = Processor([spec], prompt_len=2)
    ids = [5, 6]
    for step in range(8):
        scores = torch.randn(40, generator=g)
        a, b = scores.clone(), scores.clone()
        running(ids, a)
        Processor([spec], prompt_len=2)(ids, b)
        assert torch.equal(a, b), step
        ids.append(int(torch.randint(0, 3, (1,), generator=g)))


def test_bounds_are_refused_naming_the_field():
    from logits_processing import InvalidArgumentError, SpecError

    base = {"kind": "synthid_watermark", "ngram_len": 3, "keys": [1]}
    for field, value in [("ngram_len", 0), ("ngram_len", 257), ("keys", []), ("keys", list(range(65))),
                         ("sampling_table_size", 0), ("sampling_table_size", 2**24 + 1),
                         ("context_history_size", 2**16 + 1), ("sampling_table_seed", -1)]:
        with pytest.raises(SpecError) as e:
            Processor([{**base, field: value}], prompt_len=0)
        assert e.value.field == f"[0].{field}", (field, e.value)
    # The context is the generated ids: where the prompt ends must be given.
    with pytest.raises(InvalidArgumentError) as e:
        Processor([base])
    assert e.value.field == "prompt_len"


@pytest.mark.parametrize("keys", list(KEYS))
@pytest.mark.parametrize("ngram_len,table,seed,history", [(5, 2**16, 0, 1024), (2, 1000, 9, 3), (1, 7, 2**33, 1)])
def test_g_values_and_repetition_mask_equal_transformers_exactly(keys, ngram_len, table, seed, history):
    from logits_processing import synthid_context_repetition_mask, synthid_g_values

    theirs = hf.SynthIDTextWatermarkLogitsProcessor(
        ngram_len=ngram_len,
        keys=KEYS[keys],
        sampling_table_size=table,
        sampling_table_seed=seed,
        context_history_size=history,
        device=torch.device("cpu"),
    )
    g = torch.Generator().manual_seed(ngram_len)
    ids = torch.cat([torch.randint(0, 4, (3, 30), generator=g), torch.randint(0, 151936, (3, 30), generator=g)], dim=1)
    ids[2, :] = 0  # a context that hashes the zeros of transformers' first call
    got = synthid_g_values(ids.tolist(), ngram_len, KEYS[keys], table, seed)
    assert torch.equal(torch.tensor(got), theirs.compute_g_values(ids))
    mask = synthid_context_repetition_mask(ids.tolist(), ngram_len, history)
    assert torch.equal(torch.tensor(mask), theirs.compute_context_repetition_mask(ids))


def test_the_functions_refuse_bounds_naming_the_field():
    from logits_processing import InvalidArgumentError, synthid_context_repetition_mask, synthid_g_values

    for call, field in [
        (lambda: synthid_g_values([[1, 2]], 0, [1]), "ngram_len"),
        (lambda: synthid_g_values([[1, 2]], 2, []), "keys"),
        (lambda: synthid_g_values([[1, 2]], 2, [1], 0), "sampling_table_size"),
        (lambda: synthid_context_repetition_mask([[1, 2]], 300), "ngram_len"),
    ]:
        with pytest.raises(InvalidArgumentError) as e:
            call()
        assert e.value.field == field
    assert synthid_g_values([[1]], 2, [1]) == [[]]
