"""EngineContext: one Rust object built once per engine, given to Batch, Processor,
validate_specs and resolve_specs as ``context=`` (their only way to the engine's facts); the
structure-only mode; and the adapters' use of it."""

import math
import os
import warnings

import pytest

torch = pytest.importorskip("torch")

import logits_processing as lp  # noqa: E402
from logits_processing.adapters import _common as common  # noqa: E402
from logits_processing.examples import hello_world_ids  # noqa: E402
from logits_processing.thinking_tokens import THINKING_TOKEN_CONFIGS, ThinkingTokenConfig  # noqa: E402

VOCAB = 256


class Letters:
    """A toy tokenizer: one id per byte, except the thinking markers, one token each."""

    eos_token_id = 3
    special = {"<think>": [250], "</think>": [251]}

    def encode(self, text, add_special_tokens=False):
        return self.special.get(text, [b for b in text.encode()])


def deepseek_path():
    path = os.environ.get("DEEPSEEK_TOKENIZER_JSON")
    if not path:
        pytest.skip("needs DEEPSEEK_TOKENIZER_JSON (scripts/test.sh sets it)")
    return path


def test_the_context_derives_hello_world_thinking_tokens_and_text_by_the_cores_rules():
    context = lp.EngineContext(Letters(), model_name="toy", vocab_size=VOCAB)
    assert context.hello_world == ([b for b in b"Hello world!"], 3)
    # The tokenizer's single tokens (the table knows no "toy"), newline from "\n".
    assert context.thinking_tokens == ThinkingTokenConfig(250, 251, 10)
    assert context.encode("ab") == [97, 98]
    assert context.eos_token_ids == [3] and context.vocab_size == VOCAB
    assert context.model_name == "toy" and not context.is_structure_only
    # A test double has no token texts to read: no vocab, and grammars are refused.
    assert context.vocab is None
    with pytest.raises(lp.SpecError, match="tokenizer"):
        lp.Batch(context=context).add(0, {"kind": "json_object"})


def test_explicit_values_win_and_a_context_without_a_tokenizer_knows_only_them():
    context = lp.EngineContext(
        Letters(), hello_world=([7, 8], 2), thinking_tokens=ThinkingTokenConfig(4, 5, 6), eos_token_id=9
    )
    assert context.hello_world == ([7, 8], 2) and context.eos_token_ids == [9]
    assert context.thinking_tokens == ThinkingTokenConfig(4, 5, 6)
    empty = lp.EngineContext()
    assert empty.hello_world is None and empty.thinking_tokens is None and empty.vocab_size is None
    with pytest.raises(lp.SpecError, match="text"):
        empty.encode("a")
    with pytest.raises(lp.SpecError, match="hello_world"):
        lp.validate_specs({"kind": "hello_world"}, context=empty)
    # The model name alone: the core's table.
    assert lp.EngineContext(model_name="Qwen/Qwen3-8B").thinking_tokens == ThinkingTokenConfig(151667, 151668, 198)


def test_batch_processor_validate_and_resolve_take_one_context():
    context = lp.EngineContext(Letters(), model_name="toy", vocab_size=VOCAB)
    batch = lp.Batch(context=context)
    assert batch.vocab_size == VOCAB
    batch.add(0, [{"kind": "hello_world"}, {"kind": "thinking_budget", "max_thinking_tokens": 0}])
    logits = torch.zeros(1, VOCAB)
    batch.apply(logits, [[]])
    assert int(logits[0].argmax()) == ord("H")
    row = torch.zeros(VOCAB)
    lp.Processor({"kind": "thinking_budget", "max_thinking_tokens": 1}, context=context)([250, 65, 65], row)
    assert int(row.argmax()) == 251  # past the budget: </think>
    with pytest.raises(lp.TokenOutOfVocabError) as raised:
        lp.validate_specs({"kind": "ban_tokens", "token_ids": [VOCAB]}, context=context)
    assert raised.value.field == "token_ids[0]"
    assert lp.resolve_specs({"kind": "hello_world"}, context=context) == [
        {"kind": "forced_sequence", "token_ids": list(b"Hello world!"), "eos_token_id": 3, "position": "calls"}
    ]
    assert context.batch().vocab_size == VOCAB and context.batch(VOCAB + 64).vocab_size == VOCAB + 64
    context.validate({"kind": "hello_world"})
    assert context.resolve_specs({"kind": "thinking_budget", "max_thinking_tokens": 2})[0]["end_token_id"] == 251


def test_structure_only_checks_what_does_not_depend_on_the_engine():
    structure = lp.EngineContext.structure_only()
    assert structure.is_structure_only and repr(structure) == "EngineContext.structure_only()"
    lp.validate_specs(
        [{"kind": "hello_world"}, {"kind": "thinking_budget", "max_thinking_tokens": 5}, {"kind": "json_object"}],
        context=structure,
    )
    for bad, field in [
        ({"kind": "thinking_budget", "max_thinking_tokens": -1}, "max_thinking_tokens"),
        ({"kind": "thinking_budget", "max_thinking_tokens": 1, "overflow_percentage": -1}, "overflow_percentage"),
        ({"kind": "hello_world", "position": "nowhere"}, "position"),
        ({"kind": "grammar", "regex": "("}, "regex"),
    ]:
        with pytest.raises(lp.SpecError) as raised:
            lp.validate_specs(bad, context=structure)
        assert raised.value.field == field, bad
    with pytest.raises(lp.InvalidArgumentError, match="structure_only"):
        lp.Batch(VOCAB, context=structure)
    assert common.validate_structure('{"kind": "hello_world"}') == {"kind": "hello_world"}


def test_the_engines_facts_come_only_through_a_context():
    context = lp.EngineContext(vocab_size=VOCAB, hello_world=([5], 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lp.Batch(context=context).add(0, {"kind": "hello_world"})
    # The keywords a context holds are not taken beside it or instead of it.
    for call in (
        lambda: lp.Batch(VOCAB, hello_world=([5], 3)),
        lambda: lp.Batch(VOCAB, tokenizer="tokenizer.json"),
        lambda: lp.Processor({"kind": "hello_world"}, context=context, thinking_tokens=(1, 2, 3)),
        lambda: lp.validate_specs({"kind": "ban_tokens", "token_ids": [9]}, vocab_size=4),
        lambda: lp.resolve_specs({"kind": "hello_world"}, hello_world=([5], 3)),
    ):
        with pytest.raises(TypeError, match="unexpected keyword"):
            call()
    with pytest.raises(lp.TokenOutOfVocabError):
        lp.validate_specs({"kind": "ban_tokens", "token_ids": [9]}, context=lp.EngineContext(vocab_size=4))
    with pytest.raises(lp.ArgumentTypeError) as raised:
        lp.Batch()
    assert raised.value.field == "vocab_size"
    with pytest.raises(lp.ArgumentTypeError) as raised:
        lp.Batch(VOCAB, context={"vocab_size": VOCAB})
    assert raised.value.field == "context"


def test_a_tokenizer_json_path_gives_eos_hello_world_and_grammars():
    path = deepseek_path()
    context = lp.EngineContext(path, model_name="deepseek-ai/DeepSeek-V3", vocab_size=129_280)
    ids, eos = context.hello_world
    assert (ids, eos) == tuple(hello_world_ids(path))
    assert context.eos_token_ids == [eos] and context.vocab is not None
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(path)
    assert ids == tokenizer.encode("Hello world!", add_special_tokens=False).ids
    # The same context from the tokenizers object, and from the Vocab, encodes the same.
    same = lp.EngineContext(tokenizer, eos_token_id=eos)
    assert same.hello_world == (ids, eos) and same.vocab is not None
    assert lp.EngineContext(context.vocab, eos_token_id=eos).hello_world == (ids, eos)
    with pytest.raises(lp.TokenizerError, match="more than vocab_size"):
        lp.EngineContext(path, vocab_size=1000)


def test_python_holds_no_copy_of_the_cores_tables():
    # The thinking-token table is read from the core; a write goes back to it.
    assert {k: (c.start_token_id, c.end_token_id, c.newline_token_id) for k, c in THINKING_TOKEN_CONFIGS.items()} == {
        k: ids for k, ids in lp._lib.thinking_token_table()
    }
    # The table's own object comes back when the table decided, as in the reference.
    assert lp.get_thinking_token_config("Qwen/QWEN3-8B") is THINKING_TOKEN_CONFIGS["qwen3"]
    from logits_processing.examples.hello_world import RESPONSE

    assert RESPONSE == lp._lib.HELLO_WORLD_TEXT == "Hello world!"
    # Positions are the core's to change, kind by kind.
    specs = [
        {"kind": "hello_world"},
        {"kind": "forced_sequence", "token_ids": [1], "eos_token_id": 0},
        {"kind": "temperature", "temperature": 2.0},
    ]
    assert lp.position_by_tokens(specs) == [
        {"kind": "hello_world", "position": "tokens"},
        {"kind": "forced_sequence", "token_ids": [1], "eos_token_id": 0, "position": "tokens"},
        {"kind": "temperature", "temperature": 2.0},
    ]
    assert common.with_position(specs, "tokens") == lp.position_by_tokens(specs)
    with pytest.raises(lp.SpecError):
        lp.position_by_tokens({"kind": "nope"})


def test_the_adapters_context_is_the_cores():
    assert common.EngineContext is lp.EngineContext
    context = common.EngineContext(tokenizer=Letters(), model_name="toy", vocab_size=VOCAB)
    assert context.vocab_size == VOCAB and context.hello_world[1] == 3
    context.validate(b'{"kind": "hello_world"}')
    assert context.resolve_specs('{"kind": "hello_world"}')[0]["kind"] == "forced_sequence"
    assert context.batch().vocab_size == VOCAB
    assert common.context_for(context) is context
    with pytest.raises(lp.ArgumentTypeError, match="tokenizer="):
        common.context_for(context, tokenizer=Letters())
    assert common.context_for(vocab_size=VOCAB).vocab_size == VOCAB
    with pytest.raises(TypeError, match="'vocab'"):
        common.context_for(vocab=VOCAB)  # a misspelt EngineKeywords keyword is not dropped
    assert common.thinking_tokens_for(Letters(), "toy") == ThinkingTokenConfig(250, 251, 10)


def test_a_bitmask_step_is_refused_by_a_single_row_processor():
    for spec, field in [
        ({"kind": "bitmask"}, "kind"),
        ([{"kind": "temperature", "temperature": 2.0}, {"kind": "bitmask"}], "[1].kind"),
    ]:
        with pytest.raises(lp.SpecError, match="bitmask") as raised:
            lp.Processor(spec)
        assert raised.value.field == field


@pytest.mark.parametrize(
    "spec, field",
    [
        ({"kind": "top_p", "p": float("nan")}, "p"),
        ({"kind": "temperature", "temperature": float("inf")}, "temperature"),
        ({"kind": "logit_bias", "bias": {"3": -math.inf}}, "bias.3"),
        ([{"kind": "top_k", "k": 2}, {"kind": "min_p", "p": float("nan")}], "[1].p"),
    ],
)
def test_a_nan_or_infinity_in_a_dict_spec_names_its_field(spec, field):
    with pytest.raises(lp.SpecError, match="finite") as raised:
        lp.validate_specs(spec)
    assert raised.value.field == field


def test_a_logit_bias_key_that_is_not_an_id_is_named():
    with pytest.raises(lp.SpecError) as raised:
        lp.validate_specs({"kind": "logit_bias", "bias": {"3": 1.0, "x": 2.0}})
    assert raised.value.field == 'bias["x"]'


def test_temperature_processor_refuses_none_as_it_refuses_a_string():
    from logits_processing.examples import TemperatureProcessor

    assert TemperatureProcessor().temperature == 1.0
    assert TemperatureProcessor(temperature=0.5).temperature == 0.5
    for bad in (None, "0.5"):
        with pytest.raises(lp.ArgumentTypeError) as raised:
            TemperatureProcessor(bad)
        assert raised.value.field == "temperature"
    with pytest.raises(lp.ArgumentTypeError):
        TemperatureProcessor(temperature=None)
    with pytest.raises(lp.ArgumentTypeError):
        TemperatureProcessor(0.5, 0.7)


@pytest.mark.parametrize("kind", ["list", "raises", "cuda"])
def test_bitmask_errors_name_the_bitmask(kind):
    batch = lp.Batch(64)
    batch.add(0, {"kind": "bitmask"})
    logits = torch.zeros(1, 64)

    class Broken:
        def __dlpack__(self, *args, **kwargs):
            raise RuntimeError("broken")

    if kind == "cuda":
        if not torch.cuda.is_available():
            pytest.skip("needs a GPU for a bitmask on another device")
        mask = torch.zeros(1, 2, dtype=torch.int32, device="cuda")
    else:
        mask = [[0, 0]] if kind == "list" else Broken()
    with pytest.raises(lp.LogitsProcessingError, match="bitmask"):
        batch.apply(logits, [[]], bitmask=mask)
    assert (logits == 0).all()


@pytest.mark.parametrize("field, value", [("top_k", 2.5), ("top_k", 2.0), ("no_repeat_ngram_size", 1.5)])
def test_specs_from_generation_config_refuses_what_generate_refuses(field, value):
    transformers = pytest.importorskip("transformers")
    from logits_processing.adapters.hf import specs_from_generation_config

    config = transformers.GenerationConfig(do_sample=True, top_k=3)
    setattr(config, field, value)
    with pytest.raises(lp.InvalidArgumentError, match=field) as raised:
        specs_from_generation_config(config)
    assert raised.value.field == field


@pytest.mark.parametrize(
    "spec, field",
    [
        ({"kind": "grammar", "regex": "a{1000000}"}, "regex"),
        ({"kind": "grammar", "regex": "x{1000}{1000}"}, "regex"),
        ({"kind": "grammar", "json_schema": {"type": "string", "pattern": "(a{1000}){1000}"}}, "json_schema.pattern"),
    ],
)
def test_grammar_work_past_a_steps_budget_is_refused_at_admission(spec, field):
    for context in (lp.EngineContext.structure_only(), lp.EngineContext()):
        with pytest.raises(lp.SpecError, match="limit") as raised:
            lp.validate_specs(spec, context=context)
        assert raised.value.field == field


@pytest.mark.parametrize(
    "kwargs, error, field",
    [
        ({"tokenizer": 5}, lp.ArgumentTypeError, "tokenizer"),
        ({"tokenizer": "/nonexistent/\ud800.json"}, lp.InvalidArgumentError, "tokenizer"),
        ({"vocab_size": -1}, lp.InvalidArgumentError, "vocab_size"),
        ({"vocab_size": 2**64}, lp.InvalidArgumentError, "vocab_size"),
        ({"model_name": 5}, lp.ArgumentTypeError, "model_name"),
        ({"vocab": True}, lp.InvalidArgumentError, "vocab"),
        ({"vocab": "env"}, lp.ArgumentTypeError, "vocab"),
        ({"eos_token_id": []}, lp.InvalidArgumentError, "eos_token_id"),
        ({"eos_token_id": -1}, lp.InvalidArgumentError, "eos_token_id"),
        ({"hello_world": "hi"}, lp.ArgumentTypeError, "hello_world"),
        ({"thinking_tokens": (1, 2)}, lp.ArgumentTypeError, "thinking_tokens"),
    ],
)
def test_bad_engine_context_arguments_are_ours_and_named(kwargs, error, field):
    with pytest.raises(error) as raised:
        lp.EngineContext(**kwargs)
    assert raised.value.field == field


def test_a_tokenizer_that_fails_is_a_tokenizer_error_with_its_cause():
    class Raising:
        eos_token_id = 0

        def encode(self, text, add_special_tokens=False):
            raise RuntimeError("the tokenizer's own failure")

    with pytest.raises(lp.TokenizerError) as raised:
        lp.EngineContext(Raising())
    assert isinstance(raised.value.__cause__, RuntimeError)


def test_text_breakers_past_the_id_limit_are_refused_naming_the_field_written(deepseek_tokenizer_json):
    """Common letters as DRY's breakers resolve, through a real vocab, to more breaker ids than
    the limit: the error names ``sequence_breakers``, the field the spec has (not the ids it
    resolves to)."""
    context = lp.EngineContext(str(deepseek_tokenizer_json))
    spec = {"kind": "dry", "multiplier": 1, "sequence_breakers": ["a", "e", "i", "o"]}
    with pytest.raises(lp.SpecError, match="resolve to more than") as refused:
        lp.validate_specs(spec, context=context)
    assert refused.value.field == "sequence_breakers"
