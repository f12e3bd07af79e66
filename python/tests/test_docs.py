"""The documentation's examples run: every public docstring (Rust and Python), docs/python.md and the
README's Python example."""

from __future__ import annotations

import doctest
import inspect
import re
from pathlib import Path

import pytest

import logits_processing
import logits_processing.examples
import logits_processing.thinking

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "python.md"


def documented():
    seen = {}
    for module in (logits_processing, logits_processing.examples, logits_processing.thinking):
        for name in getattr(module, "__all__", dir(module)):
            obj = getattr(module, name)
            ours = (getattr(obj, "__module__", "") or "").startswith("logits_processing")
            if ours and (inspect.isclass(obj) or inspect.isroutine(obj)):
                seen.setdefault(id(obj), (f"{module.__name__}.{name}", obj))
    return sorted(seen.values(), key=lambda item: item[0])


@pytest.mark.parametrize("name, obj", documented(), ids=lambda v: v if isinstance(v, str) else "")
def test_docstring_examples(name, obj):
    finder = doctest.DocTestFinder(recurse=False)
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
    tests = finder.find(obj, name, globs={})
    for test in tests:
        runner.run(test)
    assert runner.failures == 0, f"{name}: {runner.failures} failing example(s)"
    # A function or class without an example would pass above having run nothing. The exception
    # classes are shown in docs/python.md's table and examples instead.
    if not (inspect.isclass(obj) and issubclass(obj, BaseException)):
        assert sum(len(test.examples) for test in tests) > 0, f"{name} has no runnable example"


def test_every_public_class_has_an_example():
    for name, obj in documented():
        if inspect.isclass(obj) and not issubclass(obj, BaseException):
            assert ">>>" in (obj.__doc__ or ""), f"{name} has no runnable example"


def code_blocks(text):
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


@pytest.mark.parametrize("page", [DOCS, ROOT / "README.md"], ids=lambda p: p.name)
def test_markdown_python_examples_run(page):
    blocks = code_blocks(page.read_text())
    assert blocks, f"{page.name} has no python examples"
    namespace: dict = {}
    for i, block in enumerate(blocks):
        try:
            exec(compile(block, f"{page.name}[block {i}]", "exec"), namespace)
        except Exception as e:  # pragma: no cover - the message is the point
            raise AssertionError(f"{page.name} block {i} failed: {e!r}\n{block}") from e
