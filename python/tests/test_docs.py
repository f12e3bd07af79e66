"""The documentation's examples run: every public docstring (Rust and Python), and every code block of
README.md and docs/ (doc_blocks.py says how each kind of block is checked; the engines' blocks run in
their venvs, test_docs_engines.py)."""

from __future__ import annotations

import doctest
import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from doc_blocks import ROOT, all_blocks

import logits_processing
import logits_processing.convert
import logits_processing.examples
import logits_processing.thinking


def documented():
    seen = {}
    for module in (logits_processing, logits_processing.convert, logits_processing.examples, logits_processing.thinking):
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


def _python_pages():
    found = {}
    for block in all_blocks():
        if block.lang == "python" and block.no_run is None and block.engine is None:
            found.setdefault(block.page, []).append(block)
    return sorted(found.items())


@pytest.mark.parametrize("page, blocks", _python_pages(), ids=lambda v: v if isinstance(v, str) else "")
def test_markdown_python_examples_run(page, blocks):
    """A page's Python blocks run in order in one namespace, as a reader pastes them."""
    namespace: dict = {"__name__": "__main__"}
    for block in blocks:
        try:
            exec(compile(block.code, block.name, "exec"), namespace)
        except Exception as e:  # pragma: no cover - the message is the point
            raise AssertionError(f"{block.name} failed: {e!r}\n{block.code}") from e


RUNS = {"python", "sh", "bash", "json", "rust", "text"}
ENGINES = {"vllm", "sglang"}


def _doctest_pages() -> set[str]:
    """The pages a crate includes as doc tests (`#[doc = include_str!("../../../README.md")]`)."""
    found = set()
    for source in (ROOT / "crates").rglob("*.rs"):
        for path in re.findall(r'#\[doc = include_str!\("([^"]+\.md)"\)\]', source.read_text()):
            found.add(str((source.parent / path).resolve().relative_to(ROOT)))
    return found


def test_every_block_is_run_or_marked():
    doctests = _doctest_pages()
    assert "README.md" in doctests
    problems = []
    for block in all_blocks():
        if block.no_run is not None:
            if not block.no_run:
                problems.append(f"{block.name}: no-run without a reason")
        elif block.lang not in RUNS:
            problems.append(f"{block.name}: ```{block.lang}``` is neither run nor marked no-run")
        elif block.engine is not None and (block.lang != "python" or block.engine not in ENGINES):
            problems.append(f"{block.name}: engine={block.engine} runs Python blocks of {sorted(ENGINES)}")
        elif block.lang == "rust" and block.page not in doctests:
            problems.append(f"{block.name}: a Rust block on a page no crate runs as a doc test")
        if block.page in doctests and ";" in block.words:
            problems.append(f"{block.name}: rustdoc reads this info string too, and warns on ';'")
    assert not problems, "\n".join(problems)


def _blocks_of(*langs):
    return [b for b in all_blocks() if b.lang in langs and b.no_run is None]


@pytest.mark.parametrize("block", _blocks_of("sh", "bash"), ids=lambda b: b.name)
def test_shell_blocks_run(block, tmp_path):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{block.name} failed:\n{block.code}\n{done.stdout[-2000:]}{done.stderr[-4000:]}"


def _specs_in(value):
    if isinstance(value, dict):
        if "kind" in value:
            yield value
        else:
            for v in value.values():
                yield from _specs_in(v)
    elif isinstance(value, list):
        for v in value:
            yield from _specs_in(v)


@pytest.mark.parametrize("block", _blocks_of("json"), ids=lambda b: b.name)
def test_json_blocks_parse_and_their_specs_are_admitted(block):
    value = json.loads(block.code)
    for spec in _specs_in(value):
        logits_processing.validate_specs(spec, context=logits_processing.EngineContext.structure_only())
