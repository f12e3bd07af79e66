"""Every processor kind through ``Batch``, against transformers' processor on the same tensor, or,
for the kinds transformers lacks (frequency and presence penalties, allowed ids), against a plain
implementation written here.

Inputs: the Qwen3 vocab (151,936) and small ones, float32 / float16 / bfloat16 rows, histories
with repeats (and ids outside the vocab, which both sides must skip), ``min_tokens_to_keep`` > 1.

What "the same" means, kind by kind:
- penalties, bans, lengths, forced EOS, suppression, n-grams, bad words: bit-identical rows, in
  every dtype (transformers' arithmetic is an f32 division, multiplication or addition rounded
  once to the row's type, which the core computes the same way).
- sequence bias and the exponential decay penalty: bit-identical on float32 rows. On float16 and
  bfloat16 rows transformers rounds the bias (the penalty ``|x| * c``) to the row's type before
  adding it, the core adds it in f32 and rounds once: an edited logit may differ by one unit in
  the last place of the bias plus one of the result (in the row's type; more than one unit of the
  result where the addition cancels), and no other logit may differ.
- truncation (top-k, top-p, min-p, typical, epsilon, eta): the kept values are bit-identical and
  removed ones ``-inf``; top-k's kept set is identical. The rules that compare probabilities may
  decide a token differently only where the decision depends on rounding or on transformers'
  sort: a token whose statistic (probability, mass above it, ...) lies within the row type's
  rounding of the threshold (transformers computes the softmax and its sums in the row's type:
  relative 2^-11 in float16, 2^-8 in bfloat16), or a token tied with the boundary token
  (transformers keeps whichever of the tied tokens its sort puts first, the core keeps all). Each
  test checks every differing token against that rule, with the statistic computed in float64.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import TORCH_DTYPES

from logits_processing import Batch

hf = pytest.importorskip("transformers.generation.logits_process")

BIG = 151_936
VOCABS = [BIG, 11, 300]
ROWS = 3
NINF = float("-inf")


def logits_for(vocab: int, dtype: torch.dtype, seed: int, rows: int = ROWS) -> torch.Tensor:
    """Rows shaped like a model's: a normal tail and a few likely tokens (finite values only)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, vocab, generator=g) * 2.5 - 2.0
    peaks = max(1, min(32, vocab // 4))
    for r in range(rows):
        idx = torch.randint(0, vocab, (peaks,), generator=g)
        x[r, idx] = 6.0 + torch.rand(peaks, generator=g) * 8.0
    return x.to(dtype)


def ids_for(vocab: int, length: int, seed: int, rows: int = ROWS) -> torch.Tensor:
    """Histories with many repeats, and now and then an id just past the vocab."""
    g = torch.Generator().manual_seed(seed + 1000)
    pool = torch.randint(0, vocab, (rows, 6), generator=g)
    pick = torch.randint(0, 6, (rows, length), generator=g)
    ids = torch.gather(pool, 1, pick)
    fresh = torch.randint(0, vocab, (rows, length), generator=g)
    ids = torch.where(torch.rand(rows, length, generator=g) < 0.3, fresh, ids)
    outside = torch.rand(rows, length, generator=g) < 0.03
    return torch.where(outside, torch.full_like(ids, vocab + 2), ids)


def ours(specs, logits: torch.Tensor, ids: torch.Tensor, prompt_len: int = 0) -> torch.Tensor:
    batch = Batch(logits.shape[-1])
    for row in range(logits.shape[0]):
        batch.add(row, specs, prompt_len=prompt_len)
    out = logits.clone()
    batch.apply(out, [row.tolist() for row in ids])
    return out


def bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int32 if x.dtype == torch.float32 else torch.int16)


def assert_bit_identical(got: torch.Tensor, want: torch.Tensor, what: str = "") -> None:
    differ = (bits(got) != bits(want)).nonzero()
    assert differ.numel() == 0, f"{what}: {differ.shape[0]} logits differ, first {differ[:5].tolist()}"


MANTISSA_BITS = {torch.float32: 23, torch.float16: 10, torch.bfloat16: 7}


def ulp(x: torch.Tensor) -> torch.Tensor:
    """One unit in the last place of each value, in its own type, as float64."""
    a = x.double().abs()
    return torch.where(a > 0, torch.exp2(torch.floor(torch.log2(a)) - MANTISSA_BITS[x.dtype]), 0.0)


def assert_within_bias_rounding(got, want, before, touched, what=""):
    """Bit-identical except at the `touched` tokens, where transformers adds a bias rounded to the
    row's type and the core adds it unrounded: there the two may differ by one unit in the last
    place of the bias (transformers' rounding of it) plus one of the result (each side's)."""
    others = torch.ones_like(got, dtype=torch.bool)
    others[:, touched] = False
    assert_bit_identical(got[others], want[others], what)
    g, w = got[:, touched].double(), want[:, touched].double()
    bias = w - before[:, touched].double()
    tolerance = ulp(bias.to(got.dtype)) + ulp(want[:, touched])
    ok = (torch.isinf(g) & (g == w)) | ((g - w).abs() <= tolerance)
    assert bool(ok.all()), f"{what}: {g[~ok].tolist()} vs {w[~ok].tolist()}"


def params(vocabs=VOCABS, dtypes=TORCH_DTYPES, seeds=(0, 1)):
    return pytest.mark.parametrize(
        "vocab,dtype,seed",
        [(v, d, s) for v in vocabs for d in dtypes for s in seeds],
        ids=lambda p: str(p).replace("torch.", ""),
    )


# --- penalties, bans, lengths: bit for bit ----------------------------------------------------


@params()
@pytest.mark.parametrize("penalty", [1.3, 0.7])
@pytest.mark.parametrize("scope", ["all", "output", "prompt"])
def test_repetition_penalty(vocab, dtype, seed, penalty, scope):
    logits, ids, prompt_len = logits_for(vocab, dtype, seed), ids_for(vocab, 40, seed), 15
    got = ours({"kind": "repetition_penalty", "penalty": penalty, "scope": scope}, logits, ids, prompt_len)
    if scope == "all":
        want = hf.RepetitionPenaltyLogitsProcessor(penalty)(ids, logits.clone())
    elif scope == "output":
        want = hf.RepetitionPenaltyLogitsProcessor(penalty, prompt_ignore_length=prompt_len)(
            ids, logits.clone()
        )
    else:  # the prompt's ids alone: transformers' processor handed the prompt
        want = hf.RepetitionPenaltyLogitsProcessor(penalty)(ids[:, :prompt_len], logits.clone())
    assert_bit_identical(got, want, scope)
    assert not torch.equal(got, logits), "the penalty changed nothing: the test would not see a bug"


def openai_penalty(logits, ids, prompt_len, penalty, count_each):
    """OpenAI / vLLM: logit - penalty * count (frequency) or - penalty (presence), in f32, over the
    ids past the prompt that are inside the vocab."""
    vocab = logits.shape[-1]
    out = logits.float().clone()
    for r in range(ids.shape[0]):
        generated = ids[r, prompt_len:]
        counts = torch.bincount(generated[generated < vocab], minlength=vocab).float()
        if not count_each:
            counts = (counts > 0).float()
        out[r] -= torch.tensor(penalty, dtype=torch.float32) * counts
    return out.to(logits.dtype)


@params()
@pytest.mark.parametrize("kind,count_each", [("frequency_penalty", True), ("presence_penalty", False)])
@pytest.mark.parametrize("penalty", [0.6, -1.3])
def test_frequency_and_presence_penalties(vocab, dtype, seed, kind, count_each, penalty):
    logits, ids, prompt_len = logits_for(vocab, dtype, seed), ids_for(vocab, 40, seed), 12
    got = ours({"kind": kind, "penalty": penalty}, logits, ids, prompt_len)
    want = openai_penalty(logits, ids, prompt_len, penalty, count_each)
    assert_bit_identical(got, want, kind)
    assert not torch.equal(got, logits)


@params()
@pytest.mark.parametrize("n", [1, 2, 3])
def test_no_repeat_ngram(vocab, dtype, seed, n):
    logits, ids = logits_for(vocab, dtype, seed), ids_for(min(vocab, 5), 60, seed)
    got = ours({"kind": "no_repeat_ngram", "n": n}, logits, ids)
    want = hf.NoRepeatNGramLogitsProcessor(n)(ids, logits.clone())
    assert_bit_identical(got, want)
    assert bool(torch.isinf(got).any())


def some_sequences(vocab, seed, count=6):
    g = torch.Generator().manual_seed(seed + 7)
    small = min(vocab, 5)  # histories draw from few ids, so multi-token sequences do match
    out = []
    for i in range(count):
        length = 1 + i % 3
        out.append(torch.randint(0, small, (length,), generator=g).tolist())
    out.append([vocab - 1])
    return out


def canonical_zeros(x):
    # transformers adds a zero bias to every logit, turning -0.0 into 0.0; the core leaves
    # untouched logits alone. The inputs here hold no -0.0, but an edit may produce one.
    return torch.where(x == 0, torch.zeros_like(x), x)


@params()
def test_bad_words(vocab, dtype, seed):
    logits, ids = logits_for(vocab, dtype, seed), ids_for(min(vocab, 5), 30, seed)
    sequences = some_sequences(vocab, seed)
    got = ours({"kind": "bad_words", "sequences": sequences}, logits, ids)
    want = hf.NoBadWordsLogitsProcessor(sequences)(ids, logits.clone())
    assert_bit_identical(canonical_zeros(got), canonical_zeros(want))


@params()
def test_sequence_bias(vocab, dtype, seed):
    logits, ids = logits_for(vocab, dtype, seed), ids_for(min(vocab, 5), 30, seed)
    g = torch.Generator().manual_seed(seed)
    sequences = some_sequences(vocab, seed) + some_sequences(vocab, seed + 1)
    biases = [[s, float(torch.randn(1, generator=g)) * 3] for s in sequences]
    got = ours({"kind": "sequence_bias", "biases": biases}, logits, ids)
    want = hf.SequenceBiasLogitsProcessor(sequence_bias=biases)(ids, logits.clone())
    got, want = canonical_zeros(got), canonical_zeros(want)
    if dtype == torch.float32:
        assert_bit_identical(got, want)
    else:
        touched = sorted({s[-1] for s in sequences})
        assert_within_bias_rounding(got, want, canonical_zeros(logits), touched)
    assert not torch.equal(got, logits)


@params()
def test_allowed_token_ids(vocab, dtype, seed):
    logits, ids = logits_for(vocab, dtype, seed), ids_for(vocab, 5, seed)
    allowed = sorted({0, vocab - 1, vocab // 2, vocab // 3})
    got = ours({"kind": "allowed_token_ids", "token_ids": allowed}, logits, ids)
    want = torch.full_like(logits, NINF)
    want[:, allowed] = logits[:, allowed]
    assert_bit_identical(got, want)


@params(seeds=(0,))
@pytest.mark.parametrize("length", [3, 9, 10, 11])
def test_min_length_and_min_new_tokens(vocab, dtype, seed, length):
    logits, ids = logits_for(vocab, dtype, seed), ids_for(vocab, length, seed)
    eos = [1, vocab - 1]
    got = ours({"kind": "min_length", "min_length": 10, "eos_token_ids": eos}, logits, ids)
    want = hf.MinLengthLogitsProcessor(10, eos)(ids, logits.clone())
    assert_bit_identical(got, want, "min_length")
    got = ours(
        {"kind": "min_new_tokens", "min_new_tokens": 4, "eos_token_ids": eos}, logits, ids, prompt_len=6
    )
    want = hf.MinNewTokensLengthLogitsProcessor(6, 4, eos)(ids, logits.clone())
    assert_bit_identical(got, want, "min_new_tokens")


@params()
@pytest.mark.parametrize("factor", [1.3, 0.8])
@pytest.mark.parametrize("length", [8, 9, 25])
def test_exponential_decay_length_penalty(vocab, dtype, seed, factor, length):
    logits, ids = logits_for(vocab, dtype, seed), ids_for(vocab, length, seed)
    eos = [0, vocab - 1]
    # Logits of both signs at the EOS ids.
    logits[0, eos] = torch.tensor([-3.7, 2.9]).to(dtype)
    spec = {
        "kind": "exponential_decay_length_penalty",
        "start_index": 3,
        "decay_factor": factor,
        "eos_token_ids": eos,
    }
    got = ours(spec, logits, ids, prompt_len=5)
    want = hf.ExponentialDecayLengthPenalty((3, factor), eos, 5)(ids, logits.clone())
    if dtype == torch.float32:
        assert_bit_identical(got, want)
    else:
        assert_within_bias_rounding(got, want, logits, eos)
    if length > 8:
        assert not torch.equal(got, logits)


@params(seeds=(0,))
@pytest.mark.parametrize("eos", [[2], [2, 5, 2]])
@pytest.mark.parametrize("length", [6, 7, 8])
def test_forced_eos(vocab, dtype, seed, eos, length):
    logits, ids = logits_for(vocab, dtype, seed), ids_for(vocab, length, seed)
    got = ours({"kind": "forced_eos", "max_length": 8, "eos_token_ids": eos}, logits, ids)
    want = hf.ForcedEOSTokenLogitsProcessor(8, eos)(ids, logits.clone())
    assert_bit_identical(got, want)


@params(seeds=(0,))
@pytest.mark.parametrize("length", [1, 2, 5])
def test_forced_bos(vocab, dtype, seed, length):
    logits, ids = logits_for(vocab, dtype, seed), ids_for(vocab, length, seed).clamp(max=vocab - 1)
    bos = vocab // 2
    got = ours({"kind": "forced_bos", "bos_token_id": bos}, logits, ids)
    want = hf.ForcedBOSTokenLogitsProcessor(bos)(ids, logits.clone())
    assert_bit_identical(got, want)
    assert torch.equal(got, logits) == (length != 1)


@params(seeds=(0,))
@pytest.mark.parametrize("length", [4, 5, 6])
def test_suppress_tokens_at_begin(vocab, dtype, seed, length):
    logits, ids = logits_for(vocab, dtype, seed), ids_for(vocab, length, seed)
    tokens = [0, 3, vocab - 1]
    got = ours({"kind": "suppress_tokens_at_begin", "token_ids": tokens}, logits, ids, prompt_len=5)
    want = hf.SuppressTokensAtBeginLogitsProcessor(tokens, 5)(ids, logits.clone())
    assert_bit_identical(got, want)


# --- truncation: kept sets, with the boundary rule --------------------------------------------

# How far from the threshold, relative, a statistic computed by transformers in the row's type
# may land: a few roundings of a value in [0, 1] (softmax outputs, their sums).
ROUNDING = {torch.float32: 2e-5, torch.float16: 4 * 2.0**-11, torch.bfloat16: 4 * 2.0**-8}


def probabilities(row: torch.Tensor) -> np.ndarray:
    x = row.double().numpy()
    p = np.exp(x - x.max())
    return p / p.sum()


def check_truncation(got, want, logits, ambiguous, what):
    """Kept values bit-identical, removed ones -inf, and the kept sets equal but for tokens
    `ambiguous(row_index, token)` allows."""
    for r in range(logits.shape[0]):
        kept_got = ~torch.isinf(got[r]) | torch.isinf(logits[r])
        kept_want = ~torch.isinf(want[r]) | torch.isinf(logits[r])
        assert_bit_identical(got[r][kept_got], logits[r][kept_got], f"{what}: kept values")
        assert bool(torch.isinf(got[r][~kept_got]).all())
        differ = (kept_got != kept_want).nonzero().flatten().tolist()
        allowed = ambiguous(r)
        bad = [t for t in differ if not allowed(t)]
        assert not bad, (
            f"{what}, row {r}: {len(bad)} tokens decided differently away from the boundary: "
            f"{bad[:5]} (ours keeps {int(kept_got.sum())}, transformers {int(kept_want.sum())})"
        )


def ties_with(values: np.ndarray, k: int):
    """Tokens tied with the k-th largest value (min_tokens_to_keep's boundary)."""
    kth = np.sort(values)[::-1][min(k, len(values)) - 1]
    return lambda t: values[t] == kth


def truncation_params():
    return pytest.mark.parametrize(
        "vocab,dtype,seed,min_keep",
        [(v, d, s, m) for v in VOCABS for d in TORCH_DTYPES for s in (0, 1) for m in (1, 3)],
        ids=lambda p: str(p).replace("torch.", ""),
    )


@truncation_params()
@pytest.mark.parametrize("k", [1, 5, 50, 200_000])
def test_top_k(vocab, dtype, seed, min_keep, k):
    logits, ids = logits_for(vocab, dtype, seed), ids_for(vocab, 4, seed)
    got = ours({"kind": "top_k", "k": k, "min_tokens_to_keep": min_keep}, logits, ids)
    want = hf.TopKLogitsWarper(top_k=k, min_tokens_to_keep=min_keep)(ids, logits.clone())
    # Both keep every value tied with the k-th: no sort order is involved.
    assert_bit_identical(got, want)


@truncation_params()
@pytest.mark.parametrize("p", [0.3, 0.9, 0.999])
def test_top_p(vocab, dtype, seed, min_keep, p):
    logits, ids = logits_for(vocab, dtype, seed), ids_for(vocab, 4, seed)
    got = ours({"kind": "top_p", "p": p, "min_tokens_to_keep": min_keep}, logits, ids)
    want = hf.TopPLogitsWarper(top_p=p, min_tokens_to_keep=min_keep)(ids, logits.clone())

    def ambiguous(r):
        values = logits[r].double().numpy()
        probs = probabilities(logits[r])
        order = np.argsort(-values, kind="stable")
        sorted_values, sorted_probs = values[order], probs[order]
        # Mass strictly above each value, and the mass of its tie group.
        distinct, first = np.unique(-sorted_values, return_index=True)
        cumulative = np.concatenate([[0.0], np.cumsum(sorted_probs)])
        above = dict(zip(-distinct, cumulative[first]))
        group = dict(zip(-distinct, np.diff(np.append(cumulative[first], cumulative[-1]))))
        tol = ROUNDING[dtype]
        kth = ties_with(values, min_keep)

        def allowed(t):
            a, g = above[values[t]], group[values[t]]
            # Kept by one side, removed by the other: the threshold within the tie group's mass
            # (sort order) or within rounding of the mass above the token.
            return a - tol <= p <= a + g - probs[t] + tol or kth(t)

        return allowed

    check_truncation(got, want, logits, ambiguous, f"top_p {p}")


def probability_rule(kind, param, threshold_of, hf_warper):
    def run(vocab, dtype, seed, min_keep):
        logits, ids = logits_for(vocab, dtype, seed), ids_for(vocab, 4, seed)
        got = ours({"kind": kind, param[0]: param[1], "min_tokens_to_keep": min_keep}, logits, ids)
        want = hf_warper(min_keep)(ids, logits.clone())

        def ambiguous(r):
            values = logits[r].double().numpy()
            probs = probabilities(logits[r])
            threshold = threshold_of(probs)
            tol = ROUNDING[dtype] * 3
            kth = ties_with(values, min_keep)
            return lambda t: abs(probs[t] - threshold) <= tol * threshold or kth(t)

        check_truncation(got, want, logits, ambiguous, kind)

    return run


def entropy(probs):
    nz = probs[probs > 0]
    return float(-(nz * np.log(nz)).sum())


@truncation_params()
@pytest.mark.parametrize("p", [0.0, 0.05, 0.5])
def test_min_p(vocab, dtype, seed, min_keep, p):
    probability_rule(
        "min_p",
        ("p", p),
        lambda probs: p * probs.max(),
        lambda m: hf.MinPLogitsWarper(min_p=p, min_tokens_to_keep=m),
    )(vocab, dtype, seed, min_keep)


@truncation_params()
@pytest.mark.parametrize("epsilon", [3e-4, 0.02])
def test_epsilon_cutoff(vocab, dtype, seed, min_keep, epsilon):
    probability_rule(
        "epsilon_cutoff",
        ("epsilon", epsilon),
        lambda probs: epsilon,
        lambda m: hf.EpsilonLogitsWarper(epsilon=epsilon, min_tokens_to_keep=m),
    )(vocab, dtype, seed, min_keep)


@truncation_params()
@pytest.mark.parametrize("epsilon", [3e-4, 0.02])
def test_eta_cutoff(vocab, dtype, seed, min_keep, epsilon):
    probability_rule(
        "eta_cutoff",
        ("epsilon", epsilon),
        lambda probs: min(epsilon, math.sqrt(epsilon) * math.exp(-entropy(probs))),
        lambda m: hf.EtaLogitsWarper(epsilon=epsilon, min_tokens_to_keep=m),
    )(vocab, dtype, seed, min_keep)


@truncation_params()
@pytest.mark.parametrize("mass", [0.2, 0.9])
def test_typical_p(vocab, dtype, seed, min_keep, mass):
    logits, ids = logits_for(vocab, dtype, seed), ids_for(vocab, 4, seed)
    got = ours({"kind": "typical_p", "mass": mass, "min_tokens_to_keep": min_keep}, logits, ids)
    want = hf.TypicalLogitsWarper(mass=mass, min_tokens_to_keep=min_keep)(ids, logits.clone())

    def ambiguous(r):
        probs = probabilities(logits[r])
        with np.errstate(divide="ignore"):
            shifted = np.abs(-np.log(probs) - entropy(probs))
        order = np.argsort(shifted, kind="stable")
        cumulative = np.cumsum(probs[order])
        last = min(int((cumulative < mass).sum()), len(order) - 1)
        cut = shifted[order[last]]
        tol = ROUNDING[dtype] * 4
        # The cut's score and the mass at it, each within rounding; or min_tokens_to_keep's
        # boundary in the score order.
        near_mass = np.abs(cumulative - mass) <= tol
        near_scores = shifted[order[near_mass]] if near_mass.any() else np.array([cut])
        lo, hi = min(near_scores.min(), cut), max(near_scores.max(), cut)
        kth_score = shifted[order[min(min_keep, len(order)) - 1]]
        return lambda t: lo * (1 - tol) - tol <= shifted[t] <= hi * (1 + tol) + tol or shifted[t] == kth_score

    check_truncation(got, want, logits, ambiguous, f"typical {mass}")
