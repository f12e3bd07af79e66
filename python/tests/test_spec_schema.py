"""docs/spec.schema.json: what the registry generates, and it agrees with admission on structure.

The schema checks structure (kinds, fields, JSON types, required and unknown fields); admission
also checks values (ranges, the vocab), so: a spec admission accepts, the schema accepts; a spec
the schema refuses, admission refuses; and the structural refusals below are refused by both.
"""

from __future__ import annotations

import json
import pathlib
import re

import pytest

jsonschema = pytest.importorskip("jsonschema")

import logits_processing as lp  # noqa: E402
from logits_processing import _lib  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
PUBLISHED = ROOT / "docs" / "spec.schema.json"
CONTEXT = {"hello_world": ([4, 5], 1), "thinking_tokens": lp.ThinkingTokenConfig(1, 2, 3)}


@pytest.fixture(scope="module")
def validator():
    schema = json.loads(PUBLISHED.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def admission_error(spec) -> str | None:
    try:
        lp.validate_specs(json.dumps(spec), context=lp.EngineContext(**CONTEXT))
        return None
    except lp.SpecError as e:
        return str(e)


def admitted(spec) -> bool:
    return admission_error(spec) is None


# serde's messages: a spec refused for its structure (as opposed to a value out of range).
STRUCTURE_MESSAGES = ("missing field", "unknown field", "invalid type", "unknown variant",
                      "unknown kind", "invalid value", "invalid length", "expected", "missing")


def test_the_published_schema_is_what_the_registry_generates():
    assert PUBLISHED.read_text() == _lib.spec_schema()
    schema = json.loads(_lib.spec_schema())
    kinds = [ref["$ref"].rsplit("/", 1)[1] for ref in schema["$defs"]["spec"]["oneOf"]]
    # Every kind admission knows is in the schema: an unknown kind's message lists them all.
    with pytest.raises(lp.SpecError) as info:
        lp.validate_specs({"kind": "?"})
    known = str(info.value).split("expected one of ")[1].split(", ")
    assert kinds == known
    for kind in kinds:
        assert schema["$defs"][kind]["description"]


def doc_examples() -> list[tuple[str, object]]:
    """Every JSON spec object in the README, the docs and the kinds' own descriptions."""
    found = []
    decoder = json.JSONDecoder()
    texts = [(str(p.relative_to(ROOT)), p.read_text()) for p in
             [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]]
    texts.append(("descriptions", _lib.spec_schema().replace('\\"', '"')))
    for name, text in texts:
        for match in re.finditer(r'\{"kind"', text):
            try:
                spec, _ = decoder.raw_decode(text, match.start())
            except ValueError:
                continue  # a Python literal or a placeholder (`[..]`), not JSON
            found.append((name, spec))
    return found


EXAMPLES = doc_examples()


def test_the_docs_hold_examples():
    assert len(EXAMPLES) >= 40, len(EXAMPLES)


@pytest.mark.parametrize("where, spec", EXAMPLES, ids=[f"{w}:{json.dumps(s)[:60]}" for w, s in EXAMPLES])
def test_every_spec_example_in_the_docs_validates(validator, where, spec):
    error = admission_error(spec)
    schema_errors = [e.message for e in validator.iter_errors(spec)]
    if error is None:
        assert not schema_errors, schema_errors
    elif any(m in error for m in STRUCTURE_MESSAGES):  # an example of an error, in docs/python.md
        assert schema_errors, f"{where}: the schema accepts {spec}, refused by admission: {error}"


# Refused by admission for their structure, whatever the engine: each must fail the schema too.
STRUCTURAL = [
    {"kind": "nope"},
    {"token_ids": []},
    {"kind": 3},
    [{"kind": "temperature", "temperature": 1}, 7],
    "a string",
    {"kind": "temperature"},
    {"kind": "temperature", "temperature": "hot"},
    {"kind": "temperature", "temperature": 0.7, "typo": 1},
    {"kind": "forced_sequence", "token_ids": [1]},
    {"kind": "forced_sequence", "token_ids": "1", "eos_token_id": 2},
    {"kind": "forced_sequence", "token_ids": [1, -4], "eos_token_id": 2},
    {"kind": "forced_sequence", "token_ids": [1.5], "eos_token_id": 2},
    {"kind": "forced_sequence", "token_ids": [1], "eos_token_id": 2, "position": "steps"},
    {"kind": "forced_sequence", "token_ids": [1], "eos_token_id": 2, "eos": 3},
    {"kind": "ban_tokens"},
    {"kind": "ban_tokens", "token_ids": [None]},
    {"kind": "logit_bias", "bias": {"x": 1}},
    {"kind": "logit_bias", "bias": {"3": "up"}},
    {"kind": "logit_bias", "bias": [[3, 1.0]]},
    {"kind": "sequence_bias", "biases": [[[5], -1.0, 2]]},
    {"kind": "sequence_bias", "biases": [[5, -1.0]]},
    {"kind": "bad_words", "sequences": [1, 2]},
    {"kind": "repetition_penalty", "penalty": 1.2, "scope": "everything"},
    {"kind": "thinking_budget"},
    {"kind": "thinking_budget", "max_thinking_tokens": -1},
    {"kind": "top_k", "k": "50"},
    {"kind": "top_p", "p": 0.9, "min_tokens_to_keep": 1.5},
    {"kind": "grammar", "regex": 5},
    {"kind": "json_object", "schema": {}},
    {"kind": "bitmask", "words": []},
    {"kind": "min_length", "min_length": 3},
    {"kind": "hello_world", "position": 1},
    [{"kind": "ban_tokens", "token_ids": []}] * 65,
]


@pytest.mark.parametrize("spec", STRUCTURAL, ids=[json.dumps(s)[:60] for s in STRUCTURAL])
def test_specs_refused_for_structure_are_refused_by_the_schema(validator, spec):
    assert not admitted(spec)
    assert not validator.is_valid(spec)


def test_every_kind_opens_its_description_with_an_example_admission_accepts(validator, deepseek_tokenizer_json):
    """The command line's bench runs these; a new kind's doc comment opens with one too. A kind
    that needs the engine's tokenizer is refused without one, and admitted with one."""
    from logits_processing.cli import _example, kinds_table

    engine = lp.EngineContext(str(deepseek_tokenizer_json))
    for kind in kinds_table(json.loads(_lib.spec_schema())):
        spec = _example(kind["description"])
        assert spec is not None and spec["kind"] == kind["kind"], kind
        assert validator.is_valid(spec), spec
        error = admission_error(spec)
        if error is not None:
            assert "tokenizer" in error, error
            engine.validate(spec)
