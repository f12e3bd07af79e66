"""Differential tests against llama.cpp's own samplers (src/llama-sampler.cpp), called through
ctypes on the same rows: top-n-sigma, dynamic temperature (temp_ext), XTC at probability 1, the
penalties with a window (penalty_last_n), mirostat v1 and v2 (the kept set at each step, and so
`mu` after each, along llama.cpp's own sampled tokens), DRY (without breakers, and with text
breakers resolved by llama.cpp through the Qwen2 vocab its source ships and by us through the same
BPE; llama.cpp's token-id breakers are reachable only through a C++ test entry point, and the Rust
tests check them against a transcription of llama.cpp's code), and adaptive-p
(the transformed logits at each step, so its moving average, along llama.cpp's own samples).

The library is built once by scripts/llamacpp.sh into ~/.cache/logits-processing/llamacpp (or
named by LLAMACPP_LIB); without it these tests are skipped, saying so.

Our documented conventions, which these tests hold us to: only finite logits are candidates (so
each comparison gives llama.cpp the finite entries of the row only, and a separate test checks
that -inf entries change nothing for us); NaN counts nowhere (we match llama.cpp on the row with
its NaN left out); ties are kept whole (rows with ties are compared where llama.cpp's choice
does not matter, and the tie rule is checked on its own).
"""

from __future__ import annotations

import ctypes
import glob
import os

import numpy as np
import pytest
import torch

from logits_processing import Processor


def _find_library():
    named = os.environ.get("LLAMACPP_LIB")
    if named:
        return named if os.path.exists(named) else None
    built = sorted(
        glob.glob(os.path.expanduser("~/.cache/logits-processing/llamacpp/build-*/bin/libllama.so"))
    )
    return built[-1] if built else None


LIB_PATH = _find_library()
pytestmark = pytest.mark.skipif(
    LIB_PATH is None,
    reason="llama.cpp's libllama.so is not built: run scripts/llamacpp.sh (or set LLAMACPP_LIB)",
)


class TokenData(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int32), ("logit", ctypes.c_float), ("p", ctypes.c_float)]


class TokenDataArray(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.POINTER(TokenData)),
        ("size", ctypes.c_size_t),
        ("selected", ctypes.c_int64),
        ("sorted", ctypes.c_bool),
    ]


class ModelParams(ctypes.Structure):
    """llama.h's ``llama_model_params`` (passed by value)."""

    _fields_ = [
        ("devices", ctypes.c_void_p),
        ("tensor_buft_overrides", ctypes.c_void_p),
        ("n_gpu_layers", ctypes.c_int32),
        ("split_mode", ctypes.c_int),
        ("load_mode", ctypes.c_int),
        ("lazy_mode", ctypes.c_int),
        ("main_gpu", ctypes.c_int32),
        ("tensor_split", ctypes.c_void_p),
        ("progress_callback", ctypes.c_void_p),
        ("progress_callback_user_data", ctypes.c_void_p),
        ("kv_overrides", ctypes.c_void_p),
        ("vocab_only", ctypes.c_bool),
        ("check_tensors", ctypes.c_bool),
        ("use_extra_bufts", ctypes.c_bool),
        ("no_host", ctypes.c_bool),
        ("no_alloc", ctypes.c_bool),
        ("load_mtp", ctypes.c_bool),
    ]


_lib = None


def lib():
    global _lib
    if _lib is None:
        _lib = ctypes.CDLL(LIB_PATH)
        sampler = ctypes.c_void_p
        signatures = {
            "llama_sampler_init_top_n_sigma": ([ctypes.c_float], sampler),
            "llama_sampler_init_top_k": ([ctypes.c_int32], sampler),
            "llama_sampler_init_top_p": ([ctypes.c_float, ctypes.c_size_t], sampler),
            "llama_sampler_init_min_p": ([ctypes.c_float, ctypes.c_size_t], sampler),
            "llama_sampler_init_typical": ([ctypes.c_float, ctypes.c_size_t], sampler),
            "llama_sampler_init_temp_ext": ([ctypes.c_float] * 3, sampler),
            "llama_sampler_init_xtc": (
                [ctypes.c_float, ctypes.c_float, ctypes.c_size_t, ctypes.c_uint32],
                sampler,
            ),
            "llama_sampler_init_penalties": (
                [ctypes.c_int32, ctypes.c_int32, ctypes.c_float, ctypes.c_float, ctypes.c_float],
                sampler,
            ),
            "llama_sampler_init_dry": (
                [
                    ctypes.c_void_p,
                    ctypes.c_float,
                    ctypes.c_float,
                    ctypes.c_int32,
                    ctypes.c_int32,
                    ctypes.c_void_p,
                    ctypes.c_size_t,
                ],
                sampler,
            ),
            "llama_sampler_init_mirostat": (
                [ctypes.c_int32, ctypes.c_uint32, ctypes.c_float, ctypes.c_float, ctypes.c_int32],
                sampler,
            ),
            "llama_sampler_init_mirostat_v2": (
                [ctypes.c_uint32, ctypes.c_float, ctypes.c_float],
                sampler,
            ),
            "llama_sampler_init_adaptive_p": (
                [ctypes.c_float, ctypes.c_float, ctypes.c_uint32],
                sampler,
            ),
            "llama_model_load_from_file": ([ctypes.c_char_p, ModelParams], ctypes.c_void_p),
            "llama_model_default_params": ([], ModelParams),
            "llama_model_get_vocab": ([ctypes.c_void_p], ctypes.c_void_p),
            "llama_vocab_n_tokens": ([ctypes.c_void_p], ctypes.c_int32),
            "llama_sampler_apply": ([sampler, ctypes.POINTER(TokenDataArray)], None),
            "llama_sampler_accept": ([sampler, ctypes.c_int32], None),
            "llama_sampler_free": ([sampler], None),
        }
        for name, (args, result) in signatures.items():
            fn = getattr(_lib, name)
            fn.argtypes = args
            fn.restype = result
    return _lib


def llama_apply(sampler, row, accepted=(), candidates=None):
    """llama.cpp's sampler applied to the candidates (ids; default every id) of `row`: the logit
    of each id afterwards, -inf for the ids it dropped or never had."""
    lib_ = lib()
    ids = np.arange(len(row)) if candidates is None else np.asarray(candidates)
    data = (TokenData * len(ids))()
    for slot, i in enumerate(ids):
        data[slot].id = int(i)
        data[slot].logit = float(row[i])
        data[slot].p = 0.0
    array = TokenDataArray(ctypes.cast(data, ctypes.POINTER(TokenData)), len(ids), -1, False)
    for token in accepted:
        lib_.llama_sampler_accept(sampler, int(token))
    lib_.llama_sampler_apply(sampler, ctypes.byref(array))
    out = np.full(len(row), -np.inf, dtype=np.float32)
    for slot in range(array.size):
        out[array.data[slot].id] = array.data[slot].logit
    lib_.llama_sampler_free(sampler)
    return out


def ours(spec, row, ids=(0,)):
    logits = torch.tensor(row, dtype=torch.float32)
    Processor(spec)(list(ids), logits)
    return logits.numpy()


def rows(seed, n=24):
    """Random rows: N(0, s) at several scales, large offsets, -inf entries, ties, lengths 2 to
    5,000."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        length = int(rng.choice([2, 3, 7, 64, 500, 5000]))
        scale = float(rng.choice([0.3, 1.0, 4.0, 16.0]))
        row = rng.normal(0.0, scale, length).astype(np.float32)
        if i % 3 == 1:
            row += np.float32(rng.choice([-1e4, 300.0, 1e5]))
        if i % 4 == 2 and length > 3:
            row[rng.integers(0, length, max(1, length // 5))] = -np.inf
        if i % 5 == 3 and length > 3:
            row[rng.integers(0, length, max(2, length // 10))] = row[0]
        out.append(row)
    return out


def finite_ids(row):
    return np.flatnonzero(np.isfinite(row))


def kept(row):
    return np.isfinite(row)


# --- the "off" values and llama.cpp's extremes of top-k, top-p, min-p and typical -------------

OFF = [
    ({"kind": "top_k", "k": 0}, "llama_sampler_init_top_k", (0,)),
    ({"kind": "top_k", "k": -1}, "llama_sampler_init_top_k", (-1,)),
    ({"kind": "top_p", "p": 1.0}, "llama_sampler_init_top_p", (1.0, 1)),
    ({"kind": "min_p", "p": 0.0}, "llama_sampler_init_min_p", (0.0, 1)),
    ({"kind": "typical_p", "mass": 1.0}, "llama_sampler_init_typical", (1.0, 1)),
]


@pytest.mark.parametrize("spec, init, args", OFF, ids=[str(case[0]) for case in OFF])
def test_off_values_leave_the_row_bit_for_bit_as_llama_cpp_does(spec, init, args):
    for row in rows(7):
        got = ours(spec, row)
        assert np.array_equal(got.view(np.uint32), row.view(np.uint32)), spec
        want = llama_apply(getattr(lib(), init)(*args), row, candidates=finite_ids(row))
        assert np.array_equal(got[kept(want)], want[kept(want)]) and kept(want).sum() == kept(row).sum()


EXTREMES = [
    ({"kind": "top_p", "p": 0.0}, "llama_sampler_init_top_p", (0.0,)),
    ({"kind": "min_p", "p": 1.5}, "llama_sampler_init_min_p", (1.5,)),
    ({"kind": "min_p", "p": 40.0}, "llama_sampler_init_min_p", (40.0,)),
]


@pytest.mark.parametrize("min_keep", [1, 3])
@pytest.mark.parametrize("spec, init, args", EXTREMES, ids=[str(case[0]) for case in EXTREMES])
def test_top_p_zero_and_min_p_above_one_keep_what_llama_cpp_keeps(spec, init, args, min_keep):
    compared = 0
    for row in rows(8):
        finite = np.sort(row[np.isfinite(row)])[::-1]
        if len(finite) <= min_keep or finite[min_keep - 1] == finite[min_keep]:
            continue  # a tie at the last place: llama.cpp keeps one of them, we keep all
        got = ours({**spec, "min_tokens_to_keep": min_keep}, row)
        want = llama_apply(getattr(lib(), init)(*args, min_keep), row, candidates=finite_ids(row))
        assert np.array_equal(kept(got), kept(want)), (spec, min_keep)
        assert np.array_equal(got[kept(got)], row[kept(got)])
        compared += 1
    assert compared >= 10


# --- top-n-sigma -----------------------------------------------------------------------------


@pytest.mark.parametrize("n", [0.5, 1.0, 2.0, 3.5, -1.0])
def test_top_n_sigma_keeps_what_llama_cpp_keeps(n):
    for row in rows(1):
        got = ours({"kind": "top_n_sigma", "n": n}, row)
        want = llama_apply(lib().llama_sampler_init_top_n_sigma(n), row, candidates=finite_ids(row))
        differ = np.flatnonzero(kept(got) != kept(want))
        if len(differ):
            # Only a logit within rounding of the cut (sums in f64 here, f32 there).
            f = row[np.isfinite(row)].astype(np.float64)
            cut = f.max() - n * f.std()
            assert np.all(np.abs(row[differ] - cut) <= 1e-4 * max(1.0, abs(cut))), (n, differ)
        assert np.array_equal(got[kept(got)], row[kept(got)])


def test_top_n_sigma_ignores_nan_where_llama_cpp_keeps_everything():
    row = np.array([0.0, 1.0, 2.0, 3.0, np.nan], dtype=np.float32)
    got = ours({"kind": "top_n_sigma", "n": 1.0}, row)
    # llama.cpp's mean turns NaN and removes nothing; ours is its result without the NaN entry.
    assert np.all(np.isfinite(llama_apply(lib().llama_sampler_init_top_n_sigma(1.0), row)[:4]))
    want = llama_apply(lib().llama_sampler_init_top_n_sigma(1.0), row, candidates=[0, 1, 2, 3])
    assert np.array_equal(kept(got[:4]), kept(want[:4]))
    assert np.isnan(got[4])


# --- dynamic temperature ---------------------------------------------------------------------


@pytest.mark.parametrize("temperature, delta, exponent", [(1.0, 0.5, 1.0), (0.8, 0.3, 2.0), (1.2, 1.0, 0.5)])
def test_dynamic_temperature_divides_by_llama_cpps_temperature(temperature, delta, exponent):
    spec = {
        "kind": "dynamic_temperature",
        "temperature": temperature,
        "range": delta,
        "exponent": exponent,
    }
    for row in rows(2):
        if np.isfinite(row).sum() <= 1:
            continue
        got = ours(spec, row)
        sampler = lib().llama_sampler_init_temp_ext(temperature, delta, exponent)
        want = llama_apply(sampler, row, candidates=finite_ids(row))
        finite = np.isfinite(row) & (row != 0)
        assert np.array_equal(np.isfinite(got), np.isfinite(want))
        # The same division up to the temperature's last few bits (entropy summed in f32 there).
        t_got = row[finite] / got[finite]
        t_want = row[finite] / want[finite]
        np.testing.assert_allclose(t_got, t_want, rtol=2e-5)


def test_dynamic_temperature_zero_is_greedy_and_a_plain_temperature_without_range():
    row = np.array([0.5, 2.0, -1.0, 2.0], dtype=np.float32)
    # A one-hot-like row has entropy ~0: temperature max(0, t - delta) = 0, greedy (ties kept).
    peaked = np.array([0.0, -300.0, -300.0], dtype=np.float32)
    got = ours({"kind": "dynamic_temperature", "temperature": 0.5, "range": 1.0}, peaked)
    want = llama_apply(lib().llama_sampler_init_temp_ext(0.5, 1.0, 1.0), peaked)
    assert np.array_equal(kept(got), kept(want))
    got = ours({"kind": "dynamic_temperature", "temperature": 0.7}, row)
    want = llama_apply(lib().llama_sampler_init_temp_ext(0.7, 0.0, 1.0), row)
    assert np.array_equal(got, want)


# --- XTC -------------------------------------------------------------------------------------


@pytest.mark.parametrize("threshold", [0.0, 0.05, 0.1, 0.2, 0.5, 0.6])
@pytest.mark.parametrize("min_keep", [1, 2, 50])
def test_xtc_at_probability_one_equals_llama_cpp(threshold, min_keep):
    spec = {"kind": "xtc", "probability": 1.0, "threshold": threshold, "min_keep": min_keep}
    for seed, row in enumerate(rows(3)):
        finite = row[np.isfinite(row)]
        if len(np.unique(finite)) != len(finite):
            continue  # ties: the tie rule is checked below
        got = ours(spec, row)
        sampler = lib().llama_sampler_init_xtc(1.0, threshold, min_keep, seed)
        want = llama_apply(sampler, row, candidates=finite_ids(row))
        differ = np.flatnonzero(kept(got) != kept(want))
        if len(differ):
            # Only a token whose probability is within rounding of the threshold.
            f = finite.astype(np.float64)
            p = np.exp(row[differ].astype(np.float64) - f.max()) / np.exp(f - f.max()).sum()
            assert np.all(np.abs(p - threshold) < 1e-6), (threshold, p)
        assert np.array_equal(got[kept(got)], row[kept(got)])


def test_xtc_keeps_a_tie_at_the_last_place_whole():
    row = np.array([3.0, 2.0, 2.0, -4.0], dtype=np.float32)
    got = ours({"kind": "xtc", "probability": 1.0, "threshold": 0.1}, row)
    assert kept(got).tolist() == [False, True, True, True]
    # llama.cpp keeps one of the two tied tokens and drops the other.
    want = llama_apply(lib().llama_sampler_init_xtc(1.0, 0.1, 1, 0), row)
    assert kept(want).sum() == 2


# --- penalties with a window -----------------------------------------------------------------


@pytest.mark.parametrize("window", [1, 3, 16, 64])
@pytest.mark.parametrize(
    "repeat, freq, present",
    # Beyond OpenAI's -2..2 too, as llama.cpp accepts. (One penalty at a time: llama.cpp subtracts
    # frequency and presence as one sum, we as two biases, which can round apart by an ulp.)
    [(1.3, 0.0, 0.0), (1.0, 0.4, 0.0), (1.0, 0.0, 0.7), (0.8, 0.0, 0.0), (1.0, 3.0, 0.0),
     (1.0, 0.0, -2.5), (1.0, -4.0, 0.0), (1.0, 0.0, 6.0)],
)
def test_penalties_with_a_window_equal_llama_cpps_last_n(window, repeat, freq, present):
    rng = np.random.default_rng(window)
    vocab = 50
    history = rng.integers(0, vocab, 120).tolist()
    specs = []
    if repeat != 1.0:
        specs.append({"kind": "repetition_penalty", "penalty": repeat, "window": window})
    if freq:
        specs.append({"kind": "frequency_penalty", "penalty": freq, "window": window})
    if present:
        specs.append({"kind": "presence_penalty", "penalty": present, "window": window})
    processor = Processor(specs, prompt_len=0)  # llama.cpp counts every accepted id
    for step in range(0, len(history), 7):
        row = rng.normal(0, 3, vocab).astype(np.float32)
        row[::9] = 0.0
        logits = torch.tensor(row)
        processor(history[:step], logits)
        sampler = lib().llama_sampler_init_penalties(vocab, window, repeat, freq, present)
        want = llama_apply(sampler, row, accepted=history[:step])
        assert np.array_equal(logits.numpy(), want), step


def test_penalties_with_a_window_after_a_resume_equal_the_uninterrupted_run():
    rng = np.random.default_rng(5)
    history = rng.integers(0, 30, 80).tolist()
    spec = [
        {"kind": "repetition_penalty", "penalty": 1.5, "window": 8},
        {"kind": "frequency_penalty", "penalty": 0.3, "window": 8},
    ]
    running = Processor(spec, prompt_len=0)
    for step in range(1, len(history)):
        row = torch.tensor(rng.normal(0, 2, 30).astype(np.float32))
        resumed = row.clone()
        running(history[:step], row)
        Processor(spec, prompt_len=0)(history[:step], resumed)
        assert torch.equal(row, resumed)


# --- DRY -------------------------------------------------------------------------------------


@pytest.mark.parametrize("allowed_length", [0, 1, 2, 4])
@pytest.mark.parametrize("last_n", [8, 64, 1000])
@pytest.mark.parametrize("multiplier, base", [(0.8, 1.75), (2.0, 1.1), (0.5, 3.0)])
def test_dry_equals_llama_cpp_at_every_step(allowed_length, last_n, multiplier, base):
    rng = np.random.default_rng(allowed_length * 1000 + last_n)
    vocab = 12
    # Repetitive text: phrases copied from earlier, with noise.
    history = rng.integers(0, vocab, 10).tolist()
    while len(history) < 300:
        if rng.random() < 0.6:
            start = int(rng.integers(0, len(history)))
            history += history[start : start + int(rng.integers(1, 12))]
        else:
            history.append(int(rng.integers(0, vocab)))
    spec = {
        "kind": "dry",
        "multiplier": multiplier,
        "base": base,
        "allowed_length": allowed_length,
        "penalty_last_n": last_n,
        "sequence_breaker_ids": [],
    }
    processor = Processor(spec)
    for step in range(1, len(history), 3):
        row = rng.normal(0, 3, vocab).astype(np.float32)
        logits = torch.tensor(row)
        processor(history[:step], logits)
        sampler = lib().llama_sampler_init_dry(None, multiplier, base, allowed_length, last_n, None, 0)
        want = llama_apply(sampler, row, accepted=history[:step])
        assert np.array_equal(logits.numpy(), want), step


QWEN2_VOCAB = os.path.join(os.path.dirname(os.path.dirname(LIB_PATH or "")), "ggml-vocab-qwen2.gguf")


@pytest.fixture(scope="module")
def qwen():
    """(llama.cpp's Qwen2 vocab, our EngineContext over the same BPE, its tokenizers.Tokenizer)."""
    import importlib.util
    from pathlib import Path

    if not os.path.exists(QWEN2_VOCAB):
        pytest.skip(f"{QWEN2_VOCAB} is missing: run scripts/llamacpp.sh")
    tokenizers = pytest.importorskip("tokenizers")
    spec = importlib.util.spec_from_file_location(
        "qwen_tokenizer", Path(__file__).resolve().parents[1] / "benchmarks" / "qwen_tokenizer.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        path = str(module.qwen_tokenizer_json())
    except Exception as e:  # noqa: BLE001 - no package index here
        pytest.skip(f"no Qwen tokenizer: {e}")
    params = lib().llama_model_default_params()
    params.vocab_only = True
    model = lib().llama_model_load_from_file(QWEN2_VOCAB.encode(), params)
    assert model, "llama.cpp could not read its own Qwen2 vocab"
    from logits_processing import EngineContext

    return lib().llama_model_get_vocab(model), EngineContext(path), tokenizers.Tokenizer.from_file(path)


@pytest.mark.parametrize(
    "breakers",
    [None, ["\n", ":"], ["###", "\n\n", "assistant:"], [" the", "*"]],
    ids=["defaults", "single", "heads-and-tails", "words"],
)
def test_dry_text_breakers_equal_llama_cpps_through_its_vocab(qwen, breakers):
    vocab, context, tokenizer = qwen
    texts = ["Hello", " world", ":", "\n", " the", "**", " cat", "\"", " said", "###", "\n\n",
             " assistant", ":", " Note", " data"]
    words = [tokenizer.encode(t, add_special_tokens=False).ids for t in texts]
    rng = np.random.default_rng(len(breakers or ()))
    history = []
    while len(history) < 200:
        if len(history) > 8 and rng.random() < 0.5:
            start = int(rng.integers(0, len(history) - 4))
            history += history[start : start + int(rng.integers(2, 9))]
        else:
            history += words[int(rng.integers(0, len(words)))]
    # The regular tokens (the two vocabs' special tokens differ).
    width = 151_643
    spec = {"kind": "dry", "multiplier": 0.8, "base": 1.75, "allowed_length": 2, "penalty_last_n": -1}
    if breakers is not None:
        spec["sequence_breakers"] = breakers
    strings = breakers if breakers is not None else ["\n", ":", "\"", "*"]
    array = (ctypes.c_char_p * len(strings))(*[b.encode() for b in strings])
    penalized = broken = 0
    for step in range(20, len(history), 9):
        row = rng.normal(0, 3, width).astype(np.float32)
        logits = torch.tensor(row)
        Processor(spec, context=context)(history[:step], logits)
        sampler = lib().llama_sampler_init_dry(vocab, 0.8, 1.75, 2, len(history), array, len(strings))
        want = llama_apply(sampler, row, accepted=history[:step])
        assert np.array_equal(logits.numpy(), want), step
        penalized += int((want != row).sum())
        unbroken = ours({**spec, "sequence_breakers": [], "sequence_breaker_ids": []}, row, history[:step])
        broken += not np.array_equal(unbroken, want)
    assert penalized > 0, "the history never made a repeat to penalize"
    assert broken > 0, "the breakers never changed a step"


def test_dry_resumed_equals_the_uninterrupted_run():
    rng = np.random.default_rng(9)
    history = (rng.integers(0, 6, 40).tolist() * 3)[:100]
    spec = {"kind": "dry", "multiplier": 1.0, "penalty_last_n": -1, "sequence_breaker_ids": [[5]]}
    running = Processor(spec)
    for step in range(1, len(history)):
        row = torch.tensor(rng.normal(0, 2, 6).astype(np.float32))
        resumed = row.clone()
        running(history[:step], row)
        Processor(spec)(history[:step], resumed)
        assert torch.equal(row, resumed)


# --- mirostat --------------------------------------------------------------------------------


def llama_steps(sampler, rows_):
    """llama.cpp's sampler over `rows_` in turn (one sampler, its state carried): per step, the
    ids it kept and the id it sampled."""
    lib_ = lib()
    out = []
    for row in rows_:
        data = (TokenData * len(row))()
        for i, x in enumerate(row):
            data[i].id = i
            data[i].logit = float(x)
        array = TokenDataArray(ctypes.cast(data, ctypes.POINTER(TokenData)), len(row), -1, False)
        lib_.llama_sampler_apply(sampler, ctypes.byref(array))
        kept = sorted(array.data[i].id for i in range(array.size))
        out.append((kept, array.data[array.selected].id))
    lib_.llama_sampler_free(sampler)
    return out


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("tau, eta", [(5.0, 0.1), (3.0, 0.5), (8.0, 1.0)])
def test_mirostat_keeps_what_llama_cpp_keeps_along_its_samples(version, tau, eta):
    rng = np.random.default_rng(version * 100 + int(tau))
    vocab = 2000
    rows_ = [(rng.standard_normal(vocab) * rng.choice([1.0, 2.5, 4.0])).astype(np.float32) for _ in range(30)]
    if version == 2:
        sampler = lib().llama_sampler_init_mirostat_v2(1234, tau, eta)
        spec = {"kind": "mirostat", "version": 2, "tau": tau, "eta": eta}
    else:
        sampler = lib().llama_sampler_init_mirostat(vocab, 1234, tau, eta, 100)
        spec = {"kind": "mirostat", "version": 1, "tau": tau, "eta": eta, "n_vocab": vocab}
    steps = llama_steps(sampler, rows_)
    processor = Processor(spec)
    ids = [0]
    for step, (row, (kept, sampled)) in enumerate(zip(rows_, steps)):
        logits = torch.tensor(row)
        processor(ids, logits)
        # The kept set at this step's mu, so mu itself after every earlier step: the same as
        # llama.cpp's at each of the 30 steps on these rows (a probability within rounding of
        # the cut would part the two; none does here).
        assert np.flatnonzero(torch.isfinite(logits).numpy()).tolist() == kept, step
        ids.append(sampled)


# --- adaptive-p ------------------------------------------------------------------------------


@pytest.mark.parametrize("target, decay", [(0.5, 0.9), (0.2, 0.5), (0.05, 0.99), (0.9, 0.0)])
def test_adaptive_p_transforms_as_llama_cpp_along_its_samples(target, decay):
    rng = np.random.default_rng(int(target * 100))
    vocab = 500
    lib_ = lib()
    sampler = lib_.llama_sampler_init_adaptive_p(target, decay, 77)
    processor = Processor({"kind": "adaptive_p", "target": target, "decay": decay})
    ids = [0]
    for step in range(30):
        row = (rng.standard_normal(vocab) * rng.choice([1.0, 3.0])).astype(np.float32)
        row[rng.integers(0, vocab, 20)] = -np.inf
        data = (TokenData * vocab)()
        for i, x in enumerate(row):
            data[i].id = i
            data[i].logit = float(x)
        array = TokenDataArray(ctypes.cast(data, ctypes.POINTER(TokenData)), vocab, -1, False)
        lib_.llama_sampler_apply(sampler, ctypes.byref(array))
        want = np.full(vocab, -np.inf, dtype=np.float32)
        for i in range(array.size):
            want[array.data[i].id] = array.data[i].logit
        sampled = array.data[array.selected].id
        lib_.llama_sampler_accept(sampler, sampled)
        logits = torch.tensor(row)
        processor(ids, logits)
        got = logits.numpy()
        assert np.array_equal(np.isinf(got), np.isinf(want)), step
        finite = np.isfinite(want)
        # f32 softmax sums there, fixed point here: a few units in the last place.
        np.testing.assert_allclose(got[finite], want[finite], rtol=0, atol=2e-4, err_msg=str(step))
        ids.append(int(sampled))
    lib_.llama_sampler_free(sampler)


def test_adaptive_p_negative_target_is_off():
    row = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    assert np.array_equal(ours({"kind": "adaptive_p", "target": -1.0}, row), row)
