//! The `grammar` and `json_object` kinds over the DeepSeek tokenizer (129,280 tokens, as many as
//! the model's logits), and the caller's `bitmask` kind.
#![cfg(feature = "grammar")]

use logits_processing::spec::EngineContext;
use logits_processing::{
    parse_pipeline, Batch, BatchLayout, Error, Pipeline, StepBitmask, TokenHistory, Vocab,
};
use serde_json::{json, Value};

const VOCAB: usize = 129_280;

fn env() -> Vocab {
    let path = std::env::var("DEEPSEEK_TOKENIZER_JSON").expect(
        "DEEPSEEK_TOKENIZER_JSON names the DeepSeek tokenizer.json (scripts/test.sh sets it)",
    );
    Vocab::from_file(path, &[]).unwrap()
}

fn context(env: &Vocab) -> EngineContext {
    EngineContext {
        vocab_size: Some(VOCAB),
        vocab: Some(env.clone()),
        ..Default::default()
    }
}

fn pipeline(spec: Value, context: &EngineContext, prompt_len: usize) -> Pipeline {
    let specs = parse_pipeline(&spec.to_string()).unwrap();
    Pipeline::from_specs(&specs, context, prompt_len).unwrap()
}

/// The tokens a row's plan allows, from a row of zeros.
fn allowed(pipeline: &mut Pipeline, ids: &[u32]) -> Vec<u32> {
    allowed_in(VOCAB, pipeline, ids)
}

fn allowed_in(width: usize, pipeline: &mut Pipeline, ids: &[u32]) -> Vec<u32> {
    let mut row = vec![0.0f32; width];
    pipeline.process(&ids, &mut row).unwrap();
    (0..width as u32)
        .filter(|&t| row[t as usize] == 0.0)
        .collect()
}

/// JSON without free whitespace: random logits would otherwise spend their steps on it.
fn compact(mut schema: Value) -> Value {
    schema["x-guidance"] = json!({"whitespace_flexible": false});
    schema
}

/// A small deterministic generator (no dependency for one test's randomness).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

/// Greedy decoding over random logits through a batch: each step the row's mask is applied with
/// the rest of its pipeline, and the largest logit left is the next token. Returns the output ids
/// (without EOS) and whether EOS ended it within 200 steps.
fn generate(
    batch: &mut Batch,
    row: usize,
    prompt: &[u32],
    seed: u64,
    eos: u32,
) -> (Vec<u32>, bool) {
    let mut rng = Lcg(seed);
    let mut ids = prompt.to_vec();
    let rows = row + 1;
    for _ in 0..200 {
        let mut logits: Vec<f32> = (0..rows * VOCAB)
            .map(|_| (rng.next() % 10_000) as f32 / 1000.0)
            .collect();
        let empty: Vec<u32> = vec![];
        let histories: Vec<&dyn TokenHistory> = (0..rows)
            .map(|r| {
                if r == row {
                    &ids as &dyn TokenHistory
                } else {
                    &empty as &dyn TokenHistory
                }
            })
            .collect();
        batch
            .apply(
                &mut logits,
                BatchLayout::contiguous(rows, VOCAB),
                &histories,
            )
            .unwrap();
        let out = &logits[row * VOCAB..];
        let token = (0..VOCAB)
            .max_by(|&a, &b| out[a].total_cmp(&out[b]))
            .unwrap() as u32;
        assert!(out[token as usize].is_finite(), "the mask allowed nothing");
        if token == eos {
            return (ids[prompt.len()..].to_vec(), true);
        }
        ids.push(token);
    }
    (ids[prompt.len()..].to_vec(), false)
}

/// Whether a grammar's output is what the grammar describes (checked without llguidance).
type Accepts = fn(&str) -> bool;

fn decode(ids: &[u32]) -> String {
    let path = std::env::var("DEEPSEEK_TOKENIZER_JSON").unwrap();
    let tokenizer = logits_processing::tokenizer::load(path).unwrap();
    tokenizer.decode(ids, false).unwrap()
}

#[test]
#[ignore = "needs the DeepSeek tokenizer.json (DEEPSEEK_TOKENIZER_JSON); scripts/test.sh runs it"]
fn generated_json_parses_and_follows_the_schema() {
    let env = env();
    let context = context(&env);
    let schema = compact(json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "pattern": "^[a-z]{1,8}$"},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
            "size": {"type": "object", "properties": {"w": {"type": "number", "minimum": -10, "maximum": 1000}},
                     "required": ["w"], "additionalProperties": false}
        },
        "required": ["name", "age", "tags", "size"],
        "additionalProperties": false
    }));
    let mut batch = Batch::new(VOCAB);
    // Row 2, with a prompt: the grammar starts after it.
    let prompt = [1u32, 2, 3];
    for seed in 0..3 {
        batch
            .add(
                2,
                pipeline(
                    json!({"kind": "grammar", "json_schema": schema}),
                    &context,
                    prompt.len(),
                ),
            )
            .unwrap();
        let (output, ended) = generate(&mut batch, 2, &prompt, seed, env.eos_token_id().unwrap());
        assert!(ended, "no EOS in 200 steps: {:?}", decode(&output));
        let text = decode(&output);
        let value: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
        let name = value["name"].as_str().unwrap();
        assert!(
            (1..=8).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_lowercase()),
            "{text}"
        );
        assert!(
            (0..=150).contains(&value["age"].as_i64().unwrap()),
            "{text}"
        );
        let tags = value["tags"].as_array().unwrap();
        assert!(
            tags.len() <= 3
                && tags
                    .iter()
                    .all(|t| ["red", "green", "blue"].contains(&t.as_str().unwrap()))
        );
        let w = value["size"]["w"].as_f64().unwrap();
        assert!(
            (-10.0..=1000.0).contains(&w) && value["size"].as_object().unwrap().len() == 1,
            "{text}"
        );
        assert_eq!(value.as_object().unwrap().len(), 4, "{text}");
    }
    // Compiled once, used three times.
    assert_eq!(env.cached(), 1);
}

#[test]
#[ignore = "needs the DeepSeek tokenizer.json (DEEPSEEK_TOKENIZER_JSON); scripts/test.sh runs it"]
fn regex_lark_and_json_object_outputs_are_accepted() {
    let env = env();
    let context = context(&env);
    let lark = r#"start: "(" expr ")"
expr: NUMBER | NUMBER "+" expr
NUMBER: /[0-9]{1,3}/"#;
    let cases: [(Value, Accepts); 3] = [
        (
            json!({"kind": "grammar", "regex": "[A-Z][a-z]{2,5}-[0-9]{3}"}),
            |s| {
                let (word, digits) = s.split_once('-').unwrap();
                word.chars().next().unwrap().is_ascii_uppercase()
                    && (3..=6).contains(&word.len())
                    && digits.len() == 3
                    && digits.bytes().all(|b| b.is_ascii_digit())
            },
        ),
        (json!({"kind": "grammar", "lark": lark}), |s| {
            s.starts_with('(')
                && s.ends_with(')')
                && s[1..s.len() - 1]
                    .split('+')
                    .all(|n| (1..=3).contains(&n.len()) && n.bytes().all(|b| b.is_ascii_digit()))
        }),
        (json!({"kind": "json_object"}), |s| {
            serde_json::from_str::<Value>(s).is_ok_and(|v| v.is_object())
        }),
    ];
    for (i, (spec, accepts)) in cases.into_iter().enumerate() {
        let mut batch = Batch::new(VOCAB);
        batch.add(0, pipeline(spec.clone(), &context, 0)).unwrap();
        let (output, ended) = generate(
            &mut batch,
            0,
            &[],
            7 + i as u64,
            env.eos_token_id().unwrap(),
        );
        let text = decode(&output);
        if spec["kind"] != "json_object" {
            assert!(ended, "{spec}: no EOS in 200 steps: {text:?}");
        }
        if ended {
            assert!(accepts(&text), "{spec}: {text:?}");
        } else {
            // Free whitespace may fill 200 random steps: the output so far opens an object.
            assert!(text.trim_start().starts_with('{'), "{spec}: {text:?}");
        }
    }
}

#[test]
#[ignore = "needs the DeepSeek tokenizer.json (DEEPSEEK_TOKENIZER_JSON); scripts/test.sh runs it"]
fn compile_errors_name_the_field_and_carry_llguidance_message() {
    let env = env();
    let context = context(&env);
    let cases = [
        (
            json!([{"kind": "temperature", "temperature": 1}, {"kind": "grammar", "regex": "(unclosed"}]),
            "[1].regex",
        ),
        (
            json!({"kind": "grammar", "lark": "start: missing_rule"}),
            "lark",
        ),
        (
            json!({"kind": "grammar", "json_schema": {"type": "no-such-type"}}),
            "json_schema",
        ),
        (
            json!({"kind": "grammar", "llguidance": {"grammars": 3}}),
            "llguidance",
        ),
    ];
    for (spec, field) in cases {
        let specs = parse_pipeline(&spec.to_string()).unwrap();
        match Pipeline::from_specs(&specs, &context, 0).unwrap_err() {
            Error::InvalidSpec { field: f, message } => {
                assert_eq!(f, field, "{spec}");
                assert!(!message.is_empty());
            }
            other => panic!("{spec}: {other:?}"),
        }
    }
    // Without the tokenizer (a frontend), validation compiles the grammar on its own; realizing
    // it there is an error naming the kind.
    let specs = parse_pipeline(r#"{"kind": "json_object"}"#).unwrap();
    let bare = EngineContext {
        vocab_size: Some(VOCAB),
        ..Default::default()
    };
    specs[0].validate(&bare).unwrap();
    assert!(
        matches!(specs[0].realize(&bare, 0), Err(Error::InvalidSpec { field, .. }) if field == "kind")
    );
    for (spec, field) in [
        (r#"{"kind": "grammar", "regex": "(unclosed"}"#, "regex"),
        (r#"{"kind": "grammar", "lark": "start: nope"}"#, "lark"),
    ] {
        let specs = parse_pipeline(spec).unwrap();
        assert!(
            matches!(specs[0].validate(&bare), Err(Error::InvalidSpec { field: f, .. }) if f == field),
            "{spec}"
        );
    }
    // A tokenizer with more tokens than the logits.
    let narrow = EngineContext {
        vocab_size: Some(1000),
        ..context
    };
    assert!(
        matches!(specs[0].validate(&narrow), Err(Error::InvalidSpec { field, .. }) if field == "kind")
    );
}

#[test]
fn one_grammar_field_exactly_and_no_unknown_fields() {
    let cases = [
        (r#"{"kind": "grammar"}"#, "kind"),
        (
            r#"{"kind": "grammar", "regex": "a", "lark": "start: \"a\""}"#,
            "lark",
        ),
        (
            r#"{"kind": "grammar", "regex": "a", "schema": {}}"#,
            "schema",
        ),
        (r#"{"kind": "json_object", "strict": true}"#, "strict"),
        (r#"{"kind": "bitmask", "words": 3}"#, "words"),
    ];
    for (json, field) in cases {
        match parse_pipeline(json).unwrap_err() {
            Error::InvalidSpec { field: f, .. } => assert_eq!(f, field, "{json}"),
            other => panic!("{json}: {other:?}"),
        }
    }
}

#[test]
#[ignore = "needs the DeepSeek tokenizer.json (DEEPSEEK_TOKENIZER_JSON); scripts/test.sh runs it"]
fn a_rejected_token_leaves_only_eos_and_says_why_without_failing_other_rows() {
    let env = env();
    let context = context(&env);
    let eos = env.eos_token_id().unwrap();
    let digits = json!({"kind": "grammar", "regex": "[0-9]+"});
    let mut batch = Batch::new(VOCAB);
    batch.add(0, pipeline(digits.clone(), &context, 0)).unwrap();
    batch.add(1, pipeline(digits, &context, 0)).unwrap();
    let one = allowed(
        &mut pipeline(json!({"kind": "grammar", "regex": "[0-9]+"}), &context, 0),
        &[],
    )[0];
    // A token with a letter: not a digit string.
    let path = std::env::var("DEEPSEEK_TOKENIZER_JSON").unwrap();
    let letter = logits_processing::tokenizer::load(path)
        .unwrap()
        .token_to_id("a")
        .unwrap();
    let ids0 = vec![one, letter];
    let ids1 = vec![one];
    let mut logits = vec![0.0f32; 2 * VOCAB];
    let histories: [&dyn TokenHistory; 2] = [&ids0, &ids1];
    batch
        .apply(&mut logits, BatchLayout::contiguous(2, VOCAB), &histories)
        .unwrap();
    let kept: Vec<usize> = (0..VOCAB).filter(|&t| logits[t] == 0.0).collect();
    assert_eq!(kept, [eos as usize]);
    let reason = batch.get(0).unwrap().failures();
    assert_eq!(reason.len(), 1);
    assert!(reason[0].contains(&format!("id {letter}")), "{reason:?}");
    // The other row goes on: digits (and EOS, the grammar being complete) allowed.
    assert!((0..VOCAB).filter(|&t| logits[VOCAB + t] == 0.0).count() > 10);
    assert!(batch.get(1).unwrap().failures().is_empty());
    // Rolling the rejected token back ends the failure.
    let histories: [&dyn TokenHistory; 2] = [&ids1, &ids1];
    batch
        .apply(&mut logits, BatchLayout::contiguous(2, VOCAB), &histories)
        .unwrap();
    assert!(batch.get(0).unwrap().failures().is_empty());
}

#[test]
#[ignore = "needs the DeepSeek tokenizer.json (DEEPSEEK_TOKENIZER_JSON); scripts/test.sh runs it"]
fn rollback_and_undo_give_the_masks_of_a_fresh_matcher() {
    let env = env();
    let context = context(&env);
    let spec = json!({"kind": "grammar", "json_schema": {"type": "object", "properties": {
        "a": {"type": "array", "items": {"type": "integer"}}}, "required": ["a"]}});
    let mut running = pipeline(spec.clone(), &context, 2);
    let mut ids = vec![5u32, 6];
    let mut rng = Lcg(3);
    let mut history = vec![];
    for _ in 0..12 {
        let mask = allowed(&mut running, &ids);
        history.push((ids.clone(), mask.clone()));
        ids.push(mask[rng.next() as usize % mask.len()]);
    }
    // Back k tokens (speculative tokens rejected), then a different continuation: each mask is
    // the one a fresh matcher computes for the same ids.
    for k in [1usize, 3, 7] {
        let back = &history[history.len() - k].0;
        let mut fresh = pipeline(spec.clone(), &context, 2);
        assert_eq!(
            allowed(&mut running, back),
            allowed(&mut fresh, back),
            "back {k}"
        );
    }
    // A step planned and taken back changes nothing.
    let (ids_at, mask_at) = &history[5];
    let mut long = ids_at.clone();
    long.extend(&history[9].0[ids_at.len()..]);
    running.plan(&long).unwrap();
    running.undo();
    running.plan(ids_at).unwrap();
    running.undo();
    assert_eq!(&allowed(&mut running, ids_at), mask_at);
}

#[test]
#[ignore = "needs the DeepSeek tokenizer.json (DEEPSEEK_TOKENIZER_JSON); scripts/test.sh runs it"]
fn the_padded_vocab_past_the_tokenizer_is_masked_out() {
    let env = env();
    let padded = env.vocab_size() + 77;
    let context = EngineContext {
        vocab_size: Some(padded),
        ..context(&env)
    };
    let mut pipeline = pipeline(json!({"kind": "json_object"}), &context, 0);
    let mask = allowed_in(padded, &mut pipeline, &[]);
    assert!(!mask.is_empty());
    assert!(mask.iter().all(|&t| (t as usize) < env.vocab_size()));
}

#[test]
#[ignore = "needs the DeepSeek tokenizer.json (DEEPSEEK_TOKENIZER_JSON); scripts/test.sh runs it"]
fn several_eos_ids_are_allowed_at_the_end_and_one_outside_the_tokenizer_is_refused() {
    let path = std::env::var("DEEPSEEK_TOKENIZER_JSON").unwrap();
    let tokenizer = logits_processing::tokenizer::load(&path).unwrap();
    let env = Vocab::new(tokenizer.clone(), &[9, 7]).unwrap();
    assert_eq!(
        (env.eos_token_id().unwrap(), env.eos_token_ids().unwrap()),
        (9, &[9, 7][..])
    );
    let mut pipeline = pipeline(json!({"kind": "grammar", "regex": "a"}), &context(&env), 0);
    let a = tokenizer.encode("a", false).unwrap().get_ids().to_vec();
    assert_eq!(allowed_in(VOCAB, &mut pipeline, &a), [7, 9]);
    // toktrie panics on such an id when the environment is built; it is refused up front.
    let refused = Vocab::new(tokenizer, &[7, VOCAB as u32]).unwrap_err();
    assert!(
        matches!(refused, Error::TokenOutOfVocab { ref field, token_id, .. }
        if field == "eos_token_id" && token_id == VOCAB as u64)
    );
}

#[test]
fn a_caller_bitmask_is_applied_in_its_place_and_checked() {
    let vocab = 70;
    let context = EngineContext {
        vocab_size: Some(vocab),
        ..Default::default()
    };
    let mut batch = Batch::new(vocab);
    let specs =
        parse_pipeline(r#"[{"kind": "temperature", "temperature": 0.5}, {"kind": "bitmask"}]"#)
            .unwrap();
    batch
        .add(1, Pipeline::from_specs(&specs, &context, 0).unwrap())
        .unwrap();
    let words_per_row = vocab.div_ceil(32);
    // Row 1 allows tokens 0, 33 and 69; row 0 holds no request (its words are ignored).
    let mut words = vec![0u32; 2 * words_per_row];
    words[words_per_row] = 1;
    words[words_per_row + 1] = 2;
    words[words_per_row + 2] = 1 << 5;
    let start = vec![1.0f32; 2 * vocab];
    let ids: [&dyn TokenHistory; 2] = [&[0u32], &[0u32]];
    let layout = BatchLayout::contiguous(2, vocab);
    let mut logits = start.clone();
    batch
        .apply_with_bitmask(
            &mut logits,
            layout,
            &ids,
            StepBitmask {
                words: &words,
                words_per_row,
            },
        )
        .unwrap();
    assert!(logits[..vocab].iter().all(|&x| x == 1.0));
    let kept: Vec<usize> = (0..vocab).filter(|&t| logits[vocab + t] == 2.0).collect();
    assert_eq!(kept, [0, 33, 69]);
    assert_eq!(
        (0..vocab)
            .filter(|&t| logits[vocab + t] == f32::NEG_INFINITY)
            .count(),
        vocab - 3
    );

    // Wrong shapes, or no bitmask: an error, logits as they were.
    let bad = [
        StepBitmask {
            words: &words,
            words_per_row: words_per_row + 1,
        },
        StepBitmask {
            words: &words[..words_per_row + 1],
            words_per_row,
        },
    ];
    for mask in bad {
        let mut logits = start.clone();
        assert!(batch
            .apply_with_bitmask(&mut logits, layout, &ids, mask)
            .is_err());
        assert_eq!(logits, start);
    }
    let mut logits = start.clone();
    assert!(matches!(
        batch.apply(&mut logits, layout, &ids),
        Err(Error::Row { row: 1, .. })
    ));
    assert_eq!(logits, start);
}

#[test]
#[ignore = "needs the DeepSeek tokenizer.json (DEEPSEEK_TOKENIZER_JSON); scripts/test.sh runs it"]
fn eos_after_the_end_is_padding_and_anything_else_a_failure() {
    let env = env();
    let context = context(&env);
    let eos = env.eos_token_id().unwrap();
    let path = std::env::var("DEEPSEEK_TOKENIZER_JSON").unwrap();
    let tokenizer = logits_processing::tokenizer::load(path).unwrap();
    let yes = tokenizer.token_to_id("yes").unwrap();
    let mut batch = Batch::new(VOCAB);
    batch
        .add(
            0,
            pipeline(json!({"kind": "grammar", "regex": "(yes|no)"}), &context, 0),
        )
        .unwrap();
    let mut step = |ids: &[u32]| {
        let mut logits = vec![0.0f32; VOCAB];
        let histories: [&dyn TokenHistory; 1] = [&ids];
        batch
            .apply(&mut logits, BatchLayout::contiguous(1, VOCAB), &histories)
            .unwrap();
        let kept: Vec<usize> = (0..VOCAB).filter(|&t| logits[t] == 0.0).collect();
        (kept, batch.get(0).unwrap().failures())
    };
    // Complete after "yes": only EOS, and EOS again and again (a finished row padded) is fine.
    assert_eq!(step(&[yes]), (vec![eos as usize], vec![]));
    assert_eq!(step(&[yes, eos]), (vec![eos as usize], vec![]));
    assert_eq!(step(&[yes, eos, eos, eos]), (vec![eos as usize], vec![]));
    // Text after the end is a failure (still only EOS).
    let (kept, failures) = step(&[yes, eos, yes]);
    assert_eq!(kept, [eos as usize]);
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert!(
        failures[0].contains(&format!("output token 2 (id {yes})")),
        "{failures:?}"
    );
}

#[test]
#[ignore = "needs the DeepSeek tokenizer.json (DEEPSEEK_TOKENIZER_JSON); scripts/test.sh runs it"]
fn a_token_after_eos_in_the_same_step_is_blamed_not_the_eos() {
    let env = env();
    let context = context(&env);
    let eos = env.eos_token_id().unwrap();
    let path = std::env::var("DEEPSEEK_TOKENIZER_JSON").unwrap();
    let tokenizer = logits_processing::tokenizer::load(path).unwrap();
    let (yes, no) = (
        tokenizer.token_to_id("yes").unwrap(),
        tokenizer.token_to_id("no").unwrap(),
    );
    for ids in [vec![yes, eos, no], vec![yes, eos, eos, no]] {
        let mut row = pipeline(json!({"kind": "grammar", "regex": "(yes|no)"}), &context, 0);
        allowed(&mut row, &[yes]);
        assert_eq!(allowed(&mut row, &ids), [eos]);
        let failures = row.failures();
        let at = ids.len() - 1;
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert!(
            failures[0].contains(&format!("output token {at} (id {no})")),
            "{ids:?}: {failures:?}"
        );
    }
}

/// A grammar whose regex expands past the limit is refused when it is parsed (no tokenizer
/// needed), naming the field: llguidance admits it, then its first mask takes 0.7-2.7 s and the
/// row fails with "too many expressions constructed".
#[test]
fn regexes_that_would_stall_a_step_are_refused_at_admission() {
    let field = |spec: Value| match parse_pipeline(&spec.to_string()) {
        Err(Error::InvalidSpec { field, message }) => {
            assert!(message.contains("limit"), "{message}");
            Some(field)
        }
        Err(other) => panic!("{other:?}"),
        Ok(_) => None,
    };
    let long = "a".repeat(500_000);
    for (spec, expected) in [
        (json!({"kind": "grammar", "regex": "a{1000000}"}), "regex"),
        (
            json!({"kind": "grammar", "regex": "(a{1000}){1000}"}),
            "regex",
        ),
        (
            json!({"kind": "grammar", "regex": "x{1000}{1000}"}),
            "regex",
        ),
        (json!({"kind": "grammar", "regex": long}), "regex"),
        (
            json!([{"kind": "top_k", "k": 3},
                   {"kind": "grammar", "json_schema": {"type": "object", "properties":
                       {"name": {"type": "string", "pattern": "^a{1000000}$"}}}}]),
            "[1].json_schema.properties.name.pattern",
        ),
        (
            json!({"kind": "grammar", "json_schema": {"type": "object",
                   "patternProperties": {"^b{100000}$": {"type": "integer"}}}}),
            r#"json_schema.patternProperties["^b{100000}$"]"#,
        ),
        (
            json!({"kind": "grammar", "lark": "// a comment with /slashes/\nstart: \"/\" x\nx: /a{1000000}/"}),
            "lark",
        ),
    ] {
        assert_eq!(field(spec.clone()).as_deref(), Some(expected), "{spec}");
    }
    // What real grammars use stays well inside the limit.
    for spec in [
        json!({"kind": "grammar", "regex": "[0-9]{3}"}),
        json!({"kind": "grammar", "regex": "a{10000}"}),
        json!({"kind": "grammar", "regex": ".{0,5000}"}),
        json!({"kind": "grammar", "regex": "[a-f0-9]{8}-[a-f0-9]{4}-[a-f0-9]{4}-[a-f0-9]{4}-[a-f0-9]{12}"}),
        json!({"kind": "grammar", "json_schema": {"type": "string", "pattern": "^[A-Z][a-z]{1,64}$"}}),
        json!({"kind": "grammar", "lark": "start: \"a/b\" NUMBER // one /a{1000000}/ here\nNUMBER: /[0-9]{1,9}/"}),
        json!({"kind": "grammar", "lark": "start: /a\\/b{3}/i"}),
    ] {
        assert_eq!(field(spec.clone()), None, "{spec}");
    }
}
