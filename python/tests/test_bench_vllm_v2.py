"""The script that drives vLLM's Model Runner V2 processor on a GPU (scripts/gpu-check.sh) runs
here too, on the CPU, through its stand-ins for vLLM's types (this venv has no vLLM): so what the
GPU machine runs is known to work up to the device."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("numpy")
SCRIPT = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "bench_vllm_v2.py")


def test_the_v2_device_script_runs_on_the_cpu():
    done = subprocess.run(
        [sys.executable, SCRIPT, "--device", "cpu", "--quick"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert "vLLM types: stand-ins" in lines[0] or "vLLM types: vLLM" in lines[0]
    assert "steps that read ids back: 0/10" in lines[1]  # history-free rows never read
    assert "steps that read ids back: 10/10" in lines[2]
