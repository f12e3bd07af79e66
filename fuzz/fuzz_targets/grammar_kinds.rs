//! The grammar kinds: random grammar specs (JSON schemas built from the input, regexes, Lark
//! text, llguidance's own object, `json_object`, malformed ones) must validate and compile or
//! fail with an error, never panic; a grammar that compiles is run through a batch step by step,
//! over a tiny byte-level tokenizer built here, with tokens it allows and tokens it does not,
//! rewinds and failing steps. After every step:
//! - the row's mask equals that of a fresh pipeline given the whole history at once (so a
//!   rewind, and a failed step rolled back, leave the grammar as if they never happened);
//! - every allowed token the probes try is accepted, every refused one puts the row in the
//!   failure state (a failure reported, only EOS allowed);
//! - a failed step leaves the block bit for bit as it was.
#![no_main]

use std::sync::OnceLock;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use logits_processing::{
    parse_pipeline, Batch, BatchLayout, Error, Vocab, Pipeline, EngineContext, Step,
    TokenHistory,
};
use serde_json::{json, Value};

/// Multi-byte tokens after the 256 single bytes, so a grammar's text has several tokenizations.
const PIECES: &[&str] = &[
    "{\"", "\"}", "\":", "\",", "\": ", ", \"", "[]", "{}", "true", "false", "null", "tr", "ue",
    "fa", "lse", "00", "12", "3.", ".5", "-1", "e+", "ab", "abc", "ba", "cd", "xyz", " a", "  ",
    "\n", "\\\"", "\\n", "\\u00", "é", "€", "name", "age", "\"name\"", "[1", ",2", "]}",
];
const EOS: &str = "</s>";
/// The logits' width: a few ids past the tokenizer's (a padded vocab).
const PAD: usize = 5;

/// GPT-2's byte-to-character map, which byte-level tokenizers write their tokens in.
fn byte_char(b: u8) -> char {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xa1..=0xac).contains(&b) || b >= 0xae;
    if printable(b) {
        return b as char;
    }
    let shift = (0..b).filter(|&c| !printable(c)).count() as u32;
    char::from_u32(256 + shift).unwrap()
}

fn tokenizer() -> tokenizers::Tokenizer {
    let mut vocab = serde_json::Map::new();
    for b in 0..=255u8 {
        vocab.insert(byte_char(b).to_string(), json!(b));
    }
    for piece in PIECES {
        let name: String = piece.bytes().map(byte_char).collect();
        let id = vocab.len();
        vocab.entry(name).or_insert(json!(id));
    }
    let eos = vocab.len();
    let text = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [{"id": eos, "content": EOS, "single_word": false, "lstrip": false,
                          "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                          "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true,
                    "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
                  "continuing_subword_prefix": null, "end_of_word_suffix": null,
                  "fuse_unk": false, "byte_fallback": false, "vocab": vocab, "merges": []}
    });
    text.to_string().parse().expect("the tiny tokenizer loads")
}

fn env() -> &'static Vocab {
    static ENV: OnceLock<Vocab> = OnceLock::new();
    ENV.get_or_init(|| {
        let env = Vocab::new(tokenizer(), &[]).expect("no EOS ids to check");
        env.prepare().expect("llguidance reads the tiny tokenizer");
        env
    })
}

#[derive(Arbitrary, Debug)]
enum Schema {
    Object {
        properties: Vec<(u8, Schema)>,
        required: u8,
        additional: Option<bool>,
    },
    Array {
        items: Box<Schema>,
        min: Option<u8>,
        max: Option<u8>,
    },
    String {
        min: Option<u8>,
        max: Option<u8>,
        pattern: Option<String>,
        format: Option<u8>,
    },
    Integer {
        min: Option<i16>,
        max: Option<i16>,
    },
    Number {
        min: Option<i16>,
        exclusive: bool,
    },
    Boolean,
    Null,
    Enum(Vec<u8>),
    Const(u8),
    AnyOf(Vec<Schema>),
    OneOf(Vec<Schema>),
    AllOf(Vec<Schema>),
    Types(Vec<u8>),
    Ref(String),
    /// Any keyword with any value.
    Keyword(String, String),
    True,
    False,
}

const NAMES: &[&str] = &["name", "age", "a", "b", "x y", "é", ""];
const TYPES: &[&str] = &[
    "object", "array", "string", "integer", "number", "boolean", "null", "bogus",
];
const FORMATS: &[&str] = &[
    "date-time",
    "date",
    "time",
    "email",
    "uuid",
    "ipv4",
    "nonsense",
];

impl Schema {
    fn to_json(&self) -> Value {
        let name = |n: u8| NAMES[n as usize % NAMES.len()].to_string();
        let value = |n: u8| {
            [
                json!(n),
                json!(name(n)),
                json!(null),
                json!([n]),
                json!({"k": n}),
            ][n as usize % 5]
                .clone()
        };
        let list = |schemas: &[Schema]| Value::Array(schemas.iter().map(Schema::to_json).collect());
        let mut out = serde_json::Map::new();
        match self {
            Schema::Object {
                properties,
                required,
                additional,
            } => {
                out.insert("type".into(), json!("object"));
                let props: serde_json::Map<String, Value> = properties
                    .iter()
                    .map(|(n, s)| (name(*n), s.to_json()))
                    .collect();
                let required: Vec<String> = properties
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| required >> (i % 8) & 1 == 1)
                    .map(|(_, (n, _))| name(*n))
                    .collect();
                out.insert("properties".into(), Value::Object(props));
                out.insert("required".into(), json!(required));
                if let Some(additional) = additional {
                    out.insert("additionalProperties".into(), json!(additional));
                }
            }
            Schema::Array { items, min, max } => {
                out.insert("type".into(), json!("array"));
                out.insert("items".into(), items.to_json());
                if let Some(m) = min {
                    out.insert("minItems".into(), json!(m % 6));
                }
                if let Some(m) = max {
                    out.insert("maxItems".into(), json!(m % 6));
                }
            }
            Schema::String {
                min,
                max,
                pattern,
                format,
            } => {
                out.insert("type".into(), json!("string"));
                if let Some(m) = min {
                    out.insert("minLength".into(), json!(m % 8));
                }
                if let Some(m) = max {
                    out.insert("maxLength".into(), json!(m % 8));
                }
                if let Some(p) = pattern {
                    out.insert("pattern".into(), json!(p));
                }
                if let Some(f) = format {
                    out.insert("format".into(), json!(FORMATS[*f as usize % FORMATS.len()]));
                }
            }
            Schema::Integer { min, max } => {
                out.insert("type".into(), json!("integer"));
                if let Some(m) = min {
                    out.insert("minimum".into(), json!(m));
                }
                if let Some(m) = max {
                    out.insert("maximum".into(), json!(m));
                }
            }
            Schema::Number { min, exclusive } => {
                out.insert("type".into(), json!("number"));
                let key = if *exclusive {
                    "exclusiveMinimum"
                } else {
                    "minimum"
                };
                if let Some(m) = min {
                    out.insert(key.into(), json!(*m as f64 / 8.0));
                }
            }
            Schema::Boolean => return json!({"type": "boolean"}),
            Schema::Null => return json!({"type": "null"}),
            Schema::Enum(values) => {
                out.insert(
                    "enum".into(),
                    Value::Array(values.iter().map(|&v| value(v)).collect()),
                );
            }
            Schema::Const(v) => return json!({"const": value(*v)}),
            Schema::AnyOf(s) => return json!({"anyOf": list(s)}),
            Schema::OneOf(s) => return json!({"oneOf": list(s)}),
            Schema::AllOf(s) => return json!({"allOf": list(s)}),
            Schema::Types(t) => {
                let types: Vec<&str> = t.iter().map(|&t| TYPES[t as usize % TYPES.len()]).collect();
                return json!({"type": types});
            }
            Schema::Ref(r) => return json!({"$ref": r}),
            Schema::Keyword(k, v) => {
                let v = serde_json::from_str(v).unwrap_or_else(|_| json!(v));
                out.insert(k.clone(), v);
            }
            Schema::True => return json!(true),
            Schema::False => return json!(false),
        }
        Value::Object(out)
    }
}

#[derive(Arbitrary, Debug)]
enum RegexPiece {
    Literal(String),
    Class(u8, u8),
    Repeat(Box<RegexPiece>, u8, u8),
    Alt(Box<RegexPiece>, Box<RegexPiece>),
    Group(Vec<RegexPiece>),
    Any,
}

impl RegexPiece {
    fn write(&self, out: &mut String) {
        match self {
            RegexPiece::Literal(s) => out.push_str(&regex_syntax_escape(s)),
            RegexPiece::Class(a, b) => {
                let (a, b) = (b'a' + a % 26, b'a' + b % 26);
                out.push_str(&format!("[{}-{}]", a.min(b) as char, a.max(b) as char));
            }
            RegexPiece::Repeat(p, lo, n) => {
                out.push('(');
                p.write(out);
                out.push_str(&format!("){{{},{}}}", lo % 4, lo % 4 + n % 4));
            }
            RegexPiece::Alt(a, b) => {
                out.push('(');
                a.write(out);
                out.push('|');
                b.write(out);
                out.push(')');
            }
            RegexPiece::Group(pieces) => {
                out.push('(');
                pieces.iter().for_each(|p| p.write(out));
                out.push(')');
            }
            RegexPiece::Any => out.push('.'),
        }
    }
}

fn regex_syntax_escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            let special = "\\.+*?()|[]{}^$-&~#".contains(c);
            special.then_some('\\').into_iter().chain([c])
        })
        .collect()
}

#[derive(Arbitrary, Debug)]
enum GrammarInput {
    JsonSchema(Schema),
    /// The schema as text (compact JSON: fewer ways to spend steps on whitespace).
    CompactSchema(Schema),
    Regex(Vec<RegexPiece>),
    RawRegex(String),
    Lark(Vec<(u8, Vec<RegexPiece>)>),
    RawLark(String),
    /// llguidance's object with one grammar of each form, or raw JSON.
    Llguidance(Box<GrammarInput>),
    RawLlguidance(String),
    JsonObject,
    /// Any text as the whole spec.
    RawSpec(String),
}

impl GrammarInput {
    fn spec(&self) -> String {
        let grammar = |key: &str, value: Value| json!({"kind": "grammar", key: value}).to_string();
        match self {
            GrammarInput::JsonSchema(s) => grammar("json_schema", s.to_json()),
            GrammarInput::CompactSchema(s) => {
                let mut schema = s.to_json();
                if let Some(object) = schema.as_object_mut() {
                    object.insert("x-guidance".into(), json!({"whitespace_flexible": false}));
                }
                grammar("json_schema", schema)
            }
            GrammarInput::Regex(pieces) => grammar("regex", json!(regex(pieces))),
            GrammarInput::RawRegex(r) => grammar("regex", json!(r)),
            GrammarInput::Lark(rules) => grammar("lark", json!(lark(rules))),
            GrammarInput::RawLark(l) => grammar("lark", json!(l)),
            GrammarInput::Llguidance(inner) => {
                let one = match &**inner {
                    GrammarInput::JsonSchema(s) | GrammarInput::CompactSchema(s) => {
                        json!({"json_schema": s.to_json()})
                    }
                    GrammarInput::Regex(pieces) => {
                        json!({"lark_grammar": format!("start: /{}/", regex(pieces))})
                    }
                    GrammarInput::Lark(rules) => json!({"lark_grammar": lark(rules)}),
                    GrammarInput::RawLark(l) | GrammarInput::RawRegex(l) => {
                        json!({"lark_grammar": l})
                    }
                    _ => json!({}),
                };
                grammar("llguidance", json!({"grammars": [one]}))
            }
            GrammarInput::RawLlguidance(text) => {
                let value = serde_json::from_str(text).unwrap_or_else(|_| json!(text));
                grammar("llguidance", value)
            }
            GrammarInput::JsonObject => json!({"kind": "json_object"}).to_string(),
            GrammarInput::RawSpec(text) => text.clone(),
        }
    }
}

fn regex(pieces: &[RegexPiece]) -> String {
    let mut out = String::new();
    pieces.iter().for_each(|p| p.write(&mut out));
    out
}

/// Rules `r0 .. rn`; each is a regex and may name a later rule (so it ends).
fn lark(rules: &[(u8, Vec<RegexPiece>)]) -> String {
    let n = rules.len().max(1);
    let mut text = String::from("start: r0\n");
    for i in 0..n {
        let (refer, pieces) = rules.get(i).map_or((0, &[][..]), |(r, p)| (*r, &p[..]));
        let body = format!("/{}/", regex(pieces).replace('/', "\\/"));
        match (refer as usize % 3, i + 1 < n) {
            (1, true) => text.push_str(&format!("r{i}: {body} r{}\n", i + 1)),
            (2, true) => text.push_str(&format!("r{i}: {body} | r{}\n", i + 1)),
            _ => text.push_str(&format!("r{i}: {body}\n")),
        }
    }
    text
}

#[derive(Arbitrary, Debug)]
enum StepInput {
    /// An allowed token (by its index among them).
    Allowed(u16),
    /// Any id of the logits row, allowed or not (past the tokenizer's now and then).
    Any(u16),
    Eos,
    /// The last few ids taken back (an engine's rejected speculation).
    Rewind(u8),
    /// A step whose external processor fails after scribbling on the row.
    Failing(u16),
}

/// Steps first and of a fixed number, so that every input runs them (missing bytes read as
/// zeros: the first allowed token each step); the grammar takes the rest.
#[derive(Arbitrary, Debug)]
struct Input {
    steps: [StepInput; 12],
    /// Which allowed and refused tokens each step probes.
    probes: [u16; 4],
    prompt: u8,
    grammar: GrammarInput,
}

/// The ids a row allows, from a row of zeros through `pipeline`.
fn allowed(pipeline: &mut Pipeline, ids: &[u32], width: usize) -> (Vec<u32>, bool) {
    let mut row = vec![0.0f32; width];
    pipeline
        .process(&ids, &mut row)
        .expect("a grammar's step does not fail");
    let allowed = (0..width as u32)
        .filter(|&t| row[t as usize] == 0.0)
        .collect();
    (allowed, !pipeline.failures().is_empty())
}

fuzz_target!(|input: Input| {
    let env = env();
    let vocab = env.vocab_size();
    let width = vocab + PAD;
    let eos = env.eos_token_id().unwrap();
    let text = input.grammar.spec();
    let Ok(specs) = parse_pipeline(&text) else {
        return;
    };
    // Without a tokenizer (a frontend) and with one: an error or a grammar, never a panic.
    let _ = specs
        .iter()
        .try_for_each(|s| s.validate(&EngineContext::default()));
    let context = EngineContext {
        vocab_size: Some(width),
        vocab: Some(env.clone()),
        ..Default::default()
    };
    let prompt_len = input.prompt as usize % 3;
    let realize = || Pipeline::from_specs(&specs, &context, prompt_len);
    let Ok(first) = realize() else {
        return;
    };
    if !first
        .steps()
        .iter()
        .any(|s| matches!(s, Step::Processor(_)))
    {
        return;
    }
    let mut steps = first.into_steps();
    steps.push(Step::External(7));
    let mut batch = Batch::new(width);
    batch.add(1, Pipeline::new(steps)).unwrap();
    let layout = BatchLayout::contiguous(2, width);

    let mut ids: Vec<u32> = (0..prompt_len as u32).map(|t| t + 40).collect();
    let mut probes = input.probes.iter().cycle();
    let mut probe = |n: usize| probes.next().map_or(0, |&p| p as usize % n.max(1));
    for (i, step) in input.steps.iter().enumerate() {
        // The grammar as a fresh pipeline given the whole history sees it.
        let mut fresh = realize().expect("compiled once, compiles again");
        let (want, failed) = allowed(&mut fresh, &ids, width);
        assert!(
            want.iter().all(|&t| (t as usize) < vocab),
            "ids past the tokenizer are never allowed"
        );
        if failed {
            assert_eq!(want, [eos], "a failed grammar allows only EOS");
        }

        // The batch's row: the same mask. Row 0 has no request. A failing step reads one more
        // id, which its rollback must forget.
        let empty: Vec<u32> = vec![];
        let mut tried = ids.clone();
        if let StepInput::Failing(t) = *step {
            tried.push(t as u32 % width as u32);
        }
        let histories: [&dyn TokenHistory; 2] = [&empty, &tried];
        let mut block = vec![0.0f32; 2 * width];
        let fail = matches!(step, StepInput::Failing(_));
        batch.plan(&histories).unwrap();
        let applied = batch.apply_planned(&mut block, layout, &mut |_, _, row| {
            if fail {
                row.fill(9.0);
                return Err(Error::External("a failing step".into()));
            }
            Ok(())
        });
        if fail {
            assert!(applied.is_err());
            assert!(
                block.iter().all(|&x| x.to_bits() == 0),
                "the block as it was"
            );
            continue;
        }
        applied.unwrap();
        let got: Vec<u32> = (0..width as u32)
            .filter(|&t| block[width + t as usize] == 0.0)
            .collect();
        assert_eq!(
            got, want,
            "the batch's mask is the fresh grammar's, at {ids:?}"
        );
        assert!(block[..width].iter().all(|&x| x == 0.0), "row 0 untouched");
        let failures = batch.get(1).unwrap().failures();
        assert_eq!(!failures.is_empty(), failed, "{failures:?}");

        // A probe (an allowed token on even steps, a refused one on odd steps): an allowed
        // token is accepted, a refused one fails the row.
        let ok = i % 2 == 0;
        if !failed {
            let tokens: Vec<u32> = (0..vocab as u32)
                .filter(|t| *t != eos && want.binary_search(t).is_ok() == ok)
                .collect();
            if !tokens.is_empty() {
                let token = tokens[probe(tokens.len())];
                let mut next = ids.clone();
                next.push(token);
                let mut fresh = realize().unwrap();
                let (after, failed) = allowed(&mut fresh, &next, width);
                assert_eq!(
                    failed, !ok,
                    "token {token} after {ids:?}, allowed: {want:?}"
                );
                if !ok {
                    assert_eq!(after, [eos], "a refused token leaves only EOS");
                }
            }
        }

        match *step {
            StepInput::Allowed(i) if !want.is_empty() => ids.push(want[i as usize % want.len()]),
            StepInput::Allowed(_) | StepInput::Failing(_) => {}
            StepInput::Any(t) => ids.push(t as u32 % width as u32),
            StepInput::Eos => ids.push(eos),
            StepInput::Rewind(n) => {
                let keep = ids.len().saturating_sub(n as usize % 4).max(prompt_len);
                ids.truncate(keep);
            }
        }
    }
});
