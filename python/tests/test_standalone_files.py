"""The test files that scripts/test-engines.sh runs in the engines' venvs run there with
``--noconftest``: a test in them that takes one of conftest.py's fixtures errors at setup, only in
those venvs. Checked here, in the main suite, from the files' syntax."""

import ast
import re
from pathlib import Path

TESTS = Path(__file__).parent
SCRIPT = TESTS.parent.parent / "scripts" / "test-engines.sh"


def standalone_files():
    text = SCRIPT.read_text()
    assert "--noconftest" in text
    names = set(re.findall(r"\btest_\w+\.py\b", text))
    # "test_engine_$engine.py": every engine's file.
    names |= {path.name for path in TESTS.glob("test_engine_*.py")}
    return sorted(TESTS / name for name in names if (TESTS / name).exists())


def fixture_names(tree):
    def is_fixture(decorator):
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        return isinstance(target, ast.Attribute) and target.attr == "fixture"

    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and any(is_fixture(d) for d in node.decorator_list)
    }


def test_engine_venv_files_take_no_conftest_fixture():
    shared = fixture_names(ast.parse((TESTS / "conftest.py").read_text()))
    files = standalone_files()
    assert any(path.name == "test_engine_sglang.py" for path in files)
    for path in files:
        tree = ast.parse(path.read_text())
        own = fixture_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and (node.name.startswith("test") or node.name in own):
                taken = {arg.arg for arg in node.args.args} & (shared - own)
                assert not taken, f"{path.name}::{node.name} takes conftest's {sorted(taken)}"
