//! Request specs: each processor as JSON data (`{"kind": ..., ...}`), validated when a request is
//! admitted and realized into fresh per-request state.
//!
//! Each kind's spec is a serde struct in its processor's file, registered once in
//! [`crate::processors::KINDS`]; this module only dispatches on `"kind"` and turns serde's errors
//! into errors that name the field (`[1].token_ids[3]`). The kinds and their fields are listed in
//! docs/core.md.
//!
//! The reference's one form, `{"kind": "forced_sequence", "token_ids": [1, 2, 3], "eos_token_id": 2}`,
//! is accepted unchanged. Specs are data only: nothing in them is ever evaluated. A field that is
//! missing, of the wrong type, unknown (a typo), or a token id outside the vocab is an error that
//! names it, as is a spec over the size limits below.

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{Map, Value};

pub use crate::context::EngineContext;
use crate::error::{check_token, field_at, Error, Result};
pub use crate::processor::KindSpec;
use crate::processors::{LogitsProcessor, KINDS};

/// The largest JSON text [`parse_pipeline`] accepts, in bytes.
pub const MAX_SPEC_BYTES: usize = 1 << 20;
/// The most token ids (or biases) one spec may list.
pub const MAX_TOKEN_IDS: usize = 65_536;
/// The most processors one pipeline may hold.
pub const MAX_PIPELINE_LEN: usize = 64;

/// A [`KindSpec`] that can also be written back as JSON and copied.
trait AnySpec: KindSpec {
    fn to_value(&self) -> Value;
    fn clone_box(&self) -> Box<dyn AnySpec>;
}

impl<S: KindSpec + Serialize + Clone> AnySpec for S {
    fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("specs are plain data")
    }
    fn clone_box(&self) -> Box<dyn AnySpec> {
        Box::new(self.clone())
    }
}

type ParseResult =
    std::result::Result<Box<dyn AnySpec>, serde_path_to_error::Error<serde_json::Error>>;

/// One registered kind: its name, how its spec is read, its JSON Schema (derived from the same
/// struct, see [`crate::spec_schema`]), and what the kind is: the questions asked of a kind
/// ([`Kind::reads_history`], [`Kind::masks`], [`Kind::truncates`], [`Kind::needs_token_texts`],
/// [`Kind::edits_on_host`]) are answered here, on its registry line,
/// and a test over every registered kind holds each answer to the kind's behaviour
/// (processors/tests.rs).
pub struct Kind {
    pub name: &'static str,
    parse: fn(Value) -> ParseResult,
    pub(crate) schema: fn(&mut schemars::SchemaGenerator) -> schemars::Schema,
    reads_history: bool,
    masks: bool,
    truncates: bool,
    token_texts: bool,
    edited_on_host: bool,
}

impl Kind {
    /// The kind `name`, whose spec is `S`: it reads the history, and neither masks, truncates
    /// nor needs token texts until said otherwise (the methods below).
    pub const fn new<S: KindSpec + Serialize + DeserializeOwned + Clone + schemars::JsonSchema>(
        name: &'static str,
    ) -> Self {
        Self {
            name,
            parse: parse_as::<S>,
            schema: S::json_schema,
            reads_history: true,
            masks: false,
            truncates: false,
            token_texts: false,
            edited_on_host: false,
        }
    }

    /// The kind's edits depend on nothing a request accumulates: neither its ids nor how many
    /// steps came before. An engine that runs ahead of its history (vLLM's Model Runner V2,
    /// SGLang's overlap scheduler) can plan such a row without waiting for the newest sampled
    /// token.
    pub const fn history_free(self) -> Self {
        Self {
            reads_history: false,
            ..self
        }
    }

    /// The kind allows only some tokens, whatever their logits (allowed ids, a grammar).
    pub const fn masking(self) -> Self {
        Self {
            masks: true,
            ..self
        }
    }

    /// The kind cuts a row by its values (top-k, top-p, ...).
    pub const fn truncating(self) -> Self {
        Self {
            truncates: true,
            ..self
        }
    }

    /// Specs of the kind can need the engine's token texts (the decoded text of every token):
    /// an engine that loads its tokenizer lazily loads it for them.
    pub const fn with_token_texts(self) -> Self {
        Self {
            token_texts: true,
            ..self
        }
    }

    /// Some plans of the kind hold an edit the device kernels do not carry out
    /// ([`crate::RowPlan::cpu_only`]: a reshape, a whole-row edit, a truncation rule the band
    /// kernel lacks, ...): on a GPU those steps take the host round trip (docs/cuda.md).
    pub const fn editing_on_host(self) -> Self {
        Self {
            edited_on_host: true,
            ..self
        }
    }

    /// Whether specs of the kind read the request's token ids (or count its steps).
    pub const fn reads_history(&self) -> bool {
        self.reads_history
    }

    /// Whether the kind allows only some tokens, whatever their logits.
    pub const fn masks(&self) -> bool {
        self.masks
    }

    /// Whether the kind cuts a row by its values.
    pub const fn truncates(&self) -> bool {
        self.truncates
    }

    /// Whether specs of the kind can need the engine's token texts.
    pub const fn needs_token_texts(&self) -> bool {
        self.token_texts
    }

    /// Whether some plans of the kind are edited on the host only (see
    /// [`Kind::editing_on_host`]; `RowPlan::cpu_only` says which).
    pub const fn edits_on_host(&self) -> bool {
        self.edited_on_host
    }
}

fn parse_as<S: KindSpec + Serialize + DeserializeOwned + Clone>(value: Value) -> ParseResult {
    serde_path_to_error::deserialize::<_, S>(value).map(|spec| Box::new(spec) as Box<dyn AnySpec>)
}

/// One processor, as data: a registered kind and its fields.
pub struct ProcessorSpec {
    kind: &'static Kind,
    spec: Box<dyn AnySpec>,
    // Where the spec stood in the pipeline it was read from ("[1]"), so that errors found when it
    // is realized name the field as parse errors do.
    at: String,
}

impl Clone for ProcessorSpec {
    fn clone(&self) -> Self {
        Self {
            kind: self.kind,
            spec: self.spec.clone_box(),
            at: self.at.clone(),
        }
    }
}

impl PartialEq for ProcessorSpec {
    fn eq(&self, other: &Self) -> bool {
        self.to_value() == other.to_value()
    }
}

impl std::fmt::Debug for ProcessorSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ProcessorSpec({})", self.to_value())
    }
}

/// Parses a pipeline: a JSON list of specs, or one spec object.
pub fn parse_pipeline(json: &str) -> Result<Vec<ProcessorSpec>> {
    if json.len() > MAX_SPEC_BYTES {
        return Err(Error::TooLarge {
            field: "spec".into(),
            len: json.len(),
            limit: MAX_SPEC_BYTES,
        });
    }
    let value: Value =
        serde_json::from_str(json).map_err(|e| Error::spec("spec", format!("not JSON: {e}")))?;
    pipeline_from_value(&value)
}

/// [`parse_pipeline`] for an already parsed JSON value.
pub fn pipeline_from_value(value: &Value) -> Result<Vec<ProcessorSpec>> {
    match value {
        Value::Array(items) => {
            if items.len() > MAX_PIPELINE_LEN {
                return Err(Error::TooLarge {
                    field: "pipeline".into(),
                    len: items.len(),
                    limit: MAX_PIPELINE_LEN,
                });
            }
            items
                .iter()
                .enumerate()
                .map(|(i, item)| ProcessorSpec::from_value_at(item, &format!("[{i}]")))
                .collect()
        }
        _ => Ok(vec![ProcessorSpec::from_value(value)?]),
    }
}

/// The field a serde error is about: its path, or for a missing or unknown field (reported at
/// the object) the field serde's message names.
fn serde_field(error: &serde_path_to_error::Error<serde_json::Error>) -> String {
    // A map key that failed to parse is "?" in the path: name the map.
    let path = error.path().to_string().replace(".?", "");
    let message = error.inner().to_string();
    let named = ["missing field `", "unknown field `"]
        .iter()
        .find_map(|prefix| message.strip_prefix(prefix)?.split('`').next());
    match (path.as_str(), named) {
        (".", Some(name)) => name.to_string(),
        (".", None) => String::new(),
        // An unknown field's path already ends with it; a missing one's is the object holding it.
        (_, Some(name)) if !path.ends_with(name) => format!("{path}.{name}"),
        _ => path,
    }
}

/// The key that failed to parse, where a map key did (serde's path ends in `?` there, and its
/// message may not show the key): the key the message quotes, else the first that is not an
/// id (the maps of specs are keyed by token id).
fn failed_key(path: &serde_path_to_error::Path, fields: &Value, message: &str) -> Option<String> {
    use serde_path_to_error::Segment;
    let mut value = fields;
    for segment in path.iter() {
        value = match segment {
            Segment::Map { key } => value.get(key)?,
            Segment::Seq { index } => value.get(index)?,
            Segment::Unknown => {
                let keys = value.as_object()?.keys();
                let quoted = keys.clone().find(|k| message.contains(&format!("{k:?}")));
                return quoted
                    .or_else(|| keys.clone().find(|k| k.parse::<u32>().is_err()))
                    .cloned();
            }
            Segment::Enum { .. } => return None,
        };
    }
    None
}

impl ProcessorSpec {
    /// Parses one spec object.
    pub fn parse(json: &str) -> Result<Self> {
        let mut specs = parse_pipeline(json)?;
        match (specs.len(), json.trim_start().starts_with('[')) {
            (1, false) => Ok(specs.remove(0)),
            _ => Err(Error::spec("spec", "expected one spec object")),
        }
    }

    pub fn from_value(value: &Value) -> Result<Self> {
        Self::from_value_at(value, "")
    }

    fn from_value_at(value: &Value, at: &str) -> Result<Self> {
        let Value::Object(object) = value else {
            return Err(Error::spec(
                if at.is_empty() { "spec" } else { at },
                format!(
                    "expected an object with a \"kind\", found {}",
                    type_name(value)
                ),
            ));
        };
        let kind_field = field_at(at, "kind");
        let name = match object.get("kind") {
            Some(Value::String(name)) => name.as_str(),
            Some(other) => {
                return Err(Error::spec(
                    kind_field,
                    format!("expected a string, found {}", type_name(other)),
                ))
            }
            None => return Err(Error::spec(kind_field, "missing")),
        };
        let Some(kind) = KINDS.iter().find(|k| k.name == name) else {
            let known: Vec<&str> = KINDS.iter().map(|k| k.name).collect();
            return Err(Error::spec(
                kind_field,
                format!(
                    "unknown kind {name:?}; expected one of {}",
                    known.join(", ")
                ),
            ));
        };
        let fields: Map<String, Value> = object
            .iter()
            .filter(|(key, _)| *key != "kind")
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect();
        let fields = Value::Object(fields);
        let spec = (kind.parse)(fields.clone()).map_err(|e| {
            let message = e.inner().to_string();
            let message = message.split(" at line ").next().unwrap_or(&message);
            let field = match failed_key(e.path(), &fields, message) {
                // The map key at fault: `bias["x"]`.
                Some(key) => format!("{}[{key:?}]", serde_field(&e)),
                None => serde_field(&e),
            };
            Error::spec(field_at(at, &field), message.to_string())
        })?;
        spec.check().map_err(|e| e.in_spec(at))?;
        Ok(Self {
            kind,
            spec,
            at: at.to_string(),
        })
    }

    /// Builds fresh per-request state. `prompt_len` is where generated tokens start in the ids the
    /// engine will pass (for processors that count output tokens).
    pub fn realize(
        &self,
        context: &EngineContext,
        prompt_len: usize,
    ) -> Result<Box<dyn LogitsProcessor>> {
        let processor = self
            .spec
            .realize(context, prompt_len)
            .map_err(|e| e.in_spec(&self.at))?;
        // A backstop for a kind that forgot to check one of its ids.
        if let (Some(vocab_size), Some(token)) = (context.vocab_size, processor.max_token_id()) {
            check_token(&field_at(&self.at, self.kind.name), token, vocab_size)?;
        }
        Ok(processor)
    }

    /// Checks the spec against an engine: everything [`ProcessorSpec::realize`] would check.
    pub fn validate(&self, context: &EngineContext) -> Result<()> {
        match self.spec.validate(context) {
            Some(checked) => checked.map_err(|e| e.in_spec(&self.at)),
            None => self.realize(context, 0).map(drop),
        }
    }

    /// The spec as JSON, with what it takes from `context` made explicit where `context` has it
    /// (see [`KindSpec::resolve`]); as it is otherwise.
    pub fn resolve(&self, context: &EngineContext) -> Result<Value> {
        match self
            .spec
            .resolve(context)
            .map_err(|e| e.in_spec(&self.at))?
        {
            Some(value) => Ok(value),
            None => Ok(self.to_value()),
        }
    }

    /// The spec with its position counted by generated tokens where its kind counts calls
    /// (see [`KindSpec::position_by_tokens`]); as it is otherwise.
    pub fn positioned_by_tokens(&self) -> Self {
        let mut spec = self.spec.clone_box();
        spec.position_by_tokens();
        Self {
            kind: self.kind,
            spec,
            at: self.at.clone(),
        }
    }

    /// Whether the step takes the caller's own mask each step (see
    /// [`KindSpec::takes_caller_mask`]).
    pub fn takes_caller_mask(&self) -> bool {
        self.spec.takes_caller_mask()
    }

    /// Whether the spec depends on where the prompt ends (see [`KindSpec::needs_prompt_len`]).
    pub fn needs_prompt_len(&self) -> bool {
        self.spec.needs_prompt_len()
    }

    /// The spec as JSON, `"kind"` first.
    pub fn to_value(&self) -> Value {
        let mut object = Map::new();
        object.insert("kind".into(), Value::String(self.kind.name.into()));
        if let Value::Object(fields) = self.spec.to_value() {
            object.extend(fields);
        }
        Value::Object(object)
    }

    pub fn kind(&self) -> &'static str {
        self.kind.name
    }

    /// The kind's registry entry: what the kind is ([`Kind::reads_history`], ...).
    pub fn entry(&self) -> &'static Kind {
        self.kind
    }

    /// Whether the spec's kind reads the request's ids (see [`Kind::reads_history`]).
    pub fn reads_history(&self) -> bool {
        self.kind.reads_history
    }

    /// Whether the spec's kind allows only some tokens (see [`Kind::masks`]).
    pub fn masks(&self) -> bool {
        self.kind.masks
    }

    /// Whether the spec's kind cuts a row by its values (see [`Kind::truncates`]).
    pub fn truncates(&self) -> bool {
        self.kind.truncates
    }

    /// Whether the spec's kind can need the engine's token texts (see
    /// [`Kind::needs_token_texts`]).
    pub fn needs_token_texts(&self) -> bool {
        self.kind.token_texts
    }

    /// Where the spec stood in the pipeline it was read from (`"[1]"`), or `""`.
    pub fn position(&self) -> &str {
        &self.at
    }
}

/// The names of the registered kinds, in registration order.
pub fn kinds() -> impl Iterator<Item = &'static str> {
    KINDS.iter().map(|k| k.name)
}

/// The registry entry of the kind `name`, which says what the kind is.
pub fn kind(name: &str) -> Option<&'static Kind> {
    KINDS.iter().find(|k| k.name == name)
}

/// Whether a spec of `kind` reads the request's token ids (or counts its steps); see
/// [`Kind::reads_history`]. Unknown kinds read them (the safe answer).
pub fn reads_history(kind: &str) -> bool {
    self::kind(kind).is_none_or(Kind::reads_history)
}

/// Checks the length of an id list against [`MAX_TOKEN_IDS`].
pub(crate) fn check_len(field: &str, len: usize) -> Result<()> {
    if len > MAX_TOKEN_IDS {
        return Err(Error::TooLarge {
            field: field.into(),
            len,
            limit: MAX_TOKEN_IDS,
        });
    }
    Ok(())
}

/// Checks a list of texts a spec carries: at most `count` of them, each 1 to `bytes` bytes; the
/// error names the list or the entry (`strings[2]`).
pub(crate) fn check_texts<'a>(
    field: &str,
    texts: impl ExactSizeIterator<Item = &'a str>,
    count: usize,
    bytes: usize,
) -> Result<()> {
    if texts.len() > count {
        return Err(Error::TooLarge {
            field: field.into(),
            len: texts.len(),
            limit: count,
        });
    }
    for (i, text) in texts.enumerate() {
        if text.is_empty() || text.len() > bytes {
            return Err(Error::argument(
                format!("{field}[{i}]"),
                format!("must be 1 to {bytes} bytes, got {}", text.len()),
            ));
        }
    }
    Ok(())
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// A spec that can only be realized with the engine's tokenizer, checked without one
/// ([`EngineContext::structure_only`]): the structure alone.
pub(crate) fn structure_only(context: &EngineContext, needs_tokenizer: bool) -> bool {
    context.structure_only && needs_tokenizer && context.encoder.is_none()
}

/// A resolved spec as JSON, `"kind"` first (as every spec is written back).
pub(crate) fn with_kind(kind: &str, spec: &impl Serialize) -> serde_json::Value {
    let mut object = serde_json::Map::new();
    object.insert("kind".into(), kind.into());
    if let serde_json::Value::Object(fields) = serde_json::to_value(spec).expect("plain data") {
        object.extend(fields);
    }
    object.into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn field_of(err: Error) -> String {
        match err {
            Error::InvalidSpec { field, .. } | Error::TooLarge { field, .. } => field,
            Error::TokenOutOfVocab { field, .. } => field,
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn the_reference_form_is_accepted_unchanged() {
        let spec = ProcessorSpec::parse(
            r#"{"kind": "forced_sequence", "token_ids": [1, 2, 3], "eos_token_id": 2}"#,
        )
        .unwrap();
        assert_eq!(spec.kind(), "forced_sequence");
        assert_eq!(
            spec.to_value(),
            json!({"kind": "forced_sequence", "token_ids": [1, 2, 3], "eos_token_id": 2, "position": "calls"})
        );
    }

    #[test]
    fn every_kind_parses_and_writes_back_what_it_read() {
        let specs = parse_pipeline(
            r#"[{"kind": "temperature", "temperature": 0.7},
                {"kind": "hello_world", "position": "tokens"},
                {"kind": "thinking_budget", "max_thinking_tokens": 100},
                {"kind": "thinking_budget", "max_thinking_tokens": 5, "overflow_percentage": 0.5,
                 "start_token_id": 1, "end_token_id": 2, "newline_token_id": 3},
                {"kind": "ban_tokens", "token_ids": [5, 6]},
                {"kind": "logit_bias", "bias": {"7": -1.5}}]"#,
        )
        .unwrap();
        let kinds: Vec<_> = specs.iter().map(ProcessorSpec::kind).collect();
        assert_eq!(
            kinds,
            [
                "temperature",
                "hello_world",
                "thinking_budget",
                "thinking_budget",
                "ban_tokens",
                "logit_bias"
            ]
        );
        for spec in &specs {
            assert_eq!(&ProcessorSpec::from_value(&spec.to_value()).unwrap(), spec);
        }
        assert!(kinds.iter().all(|k| super::kinds().any(|r| r == *k)));
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (r#"{"kind": "nope"}"#, "kind"),
            (r#"{"token_ids": []}"#, "kind"),
            (
                r#"{"kind": "forced_sequence", "token_ids": [1]}"#,
                "eos_token_id",
            ),
            (
                r#"{"kind": "forced_sequence", "token_ids": "1", "eos_token_id": 2}"#,
                "token_ids",
            ),
            (
                r#"{"kind": "forced_sequence", "token_ids": [1, -4], "eos_token_id": 2}"#,
                "token_ids[1]",
            ),
            (
                r#"{"kind": "forced_sequence", "token_ids": [1], "eos_token_id": 2, "eos": 3}"#,
                "eos",
            ),
            (
                r#"{"kind": "temperature", "temperature": 0}"#,
                "temperature",
            ),
            (
                r#"{"kind": "temperature", "temperature": "hot"}"#,
                "temperature",
            ),
            (
                r#"{"kind": "thinking_budget", "max_thinking_tokens": -1}"#,
                "max_thinking_tokens",
            ),
            (
                r#"{"kind": "thinking_budget", "max_thinking_tokens": 1, "start_token_id": 4}"#,
                "end_token_id",
            ),
            (
                r#"{"kind": "logit_bias", "bias": {"x": 1}}"#,
                r#"bias["x"]"#,
            ),
            (
                r#"{"kind": "logit_bias", "bias": {"3": 1, "x": 1, "-4": 2}}"#,
                r#"bias["x"]"#,
            ),
            (
                r#"[{"kind": "top_k", "k": 2}, {"kind": "logit_bias", "bias": {"1e3": 1}}]"#,
                r#"[1].bias["1e3"]"#,
            ),
            (r#"{"kind": "logit_bias", "bias": {"3": 1e300}}"#, "bias.3"),
            (
                r#"[{"kind": "temperature", "temperature": 1}, {"kind": "ban_tokens"}]"#,
                "[1].token_ids",
            ),
            (
                r#"[{"kind": "temperature", "temperature": 1}, {"kind": "temperature", "temperature": -1}]"#,
                "[1].temperature",
            ),
        ];
        for (json, field) in cases {
            assert_eq!(field_of(parse_pipeline(json).unwrap_err()), field, "{json}");
        }
    }

    #[test]
    fn size_limits() {
        let big = format!(
            r#"{{"kind": "ban_tokens", "token_ids": [{}]}}"#,
            vec!["1"; MAX_TOKEN_IDS + 1].join(",")
        );
        assert_eq!(field_of(parse_pipeline(&big).unwrap_err()), "token_ids");
        let huge = " ".repeat(MAX_SPEC_BYTES + 1);
        assert_eq!(field_of(parse_pipeline(&huge).unwrap_err()), "spec");
        let long = format!(
            "[{}]",
            vec![r#"{"kind":"ban_tokens","token_ids":[]}"#; 65].join(",")
        );
        assert_eq!(field_of(parse_pipeline(&long).unwrap_err()), "pipeline");
    }

    #[test]
    fn realize_checks_the_vocab_naming_the_id_and_the_context() {
        let context = EngineContext {
            vocab_size: Some(10),
            ..Default::default()
        };
        let spec = ProcessorSpec::parse(
            r#"{"kind": "forced_sequence", "token_ids": [3, 10], "eos_token_id": 2}"#,
        )
        .unwrap();
        assert_eq!(
            field_of(spec.validate(&context).unwrap_err()),
            "token_ids[1]"
        );
        let eos = ProcessorSpec::parse(
            r#"{"kind": "forced_sequence", "token_ids": [3], "eos_token_id": 12}"#,
        )
        .unwrap();
        assert_eq!(
            field_of(eos.validate(&context).unwrap_err()),
            "eos_token_id"
        );
        let budget = ProcessorSpec::parse(
            r#"{"kind": "thinking_budget", "max_thinking_tokens": 3, "start_token_id": 1,
                "end_token_id": 99, "newline_token_id": 3}"#,
        )
        .unwrap();
        assert_eq!(
            field_of(budget.validate(&context).unwrap_err()),
            "end_token_id"
        );
        let hello = ProcessorSpec::parse(r#"{"kind": "hello_world"}"#).unwrap();
        assert!(hello.validate(&context).is_err());
        let with_tokenizer = EngineContext {
            hello_world: Some((vec![4, 5], 1)),
            ..context
        };
        assert!(hello.validate(&with_tokenizer).is_ok());
        assert_eq!(
            hello.resolve(&with_tokenizer).unwrap(),
            json!({"kind": "forced_sequence", "token_ids": [4, 5], "eos_token_id": 1, "position": "calls"})
        );
    }
}
