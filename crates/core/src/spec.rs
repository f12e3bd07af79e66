//! Request specs: each built-in processor as JSON data, validated when a request is admitted and
//! realized into fresh per-request state.
//!
//! | kind | fields |
//! | --- | --- |
//! | `temperature` | `temperature` (number, finite, > 0) |
//! | `forced_sequence` | `token_ids` (list of ids), `eos_token_id` (id), `position` (`"calls"`, the default, or `"tokens"`) |
//! | `hello_world` | `position` (optional); the ids come from the engine's tokenizer ([`SpecContext::hello_world`]) |
//! | `thinking_budget` | `max_thinking_tokens` (int >= 0), `overflow_percentage` (number >= 0, default 0.1), `start_token_id` / `end_token_id` / `newline_token_id` (ids; optional where [`SpecContext::thinking_tokens`] is set) |
//! | `ban_tokens` | `token_ids` (list of ids) |
//! | `logit_bias` | `bias` (object from id, as a string, to a finite number) |
//!
//! The reference's one form, `{"kind": "forced_sequence", "token_ids": [1, 2, 3], "eos_token_id": 2}`,
//! is accepted unchanged. Specs are data only: nothing in them is ever evaluated. A field that is
//! missing, of the wrong type, unknown (a typo), or a token id outside the vocab is an error that
//! names it, as is a spec over the size limits below.

use serde_json::{Map, Value};

use crate::error::{check_token, Error, Result};
use crate::processors::{
    BanTokens, ForcedSequence, LogitBias, LogitsProcessor, Position, Temperature, ThinkingBudget,
    ThinkingTokenConfig,
};

/// The largest JSON text [`parse_pipeline`] accepts, in bytes.
pub const MAX_SPEC_BYTES: usize = 1 << 20;
/// The most token ids (or biases) one spec may list.
pub const MAX_TOKEN_IDS: usize = 65_536;
/// The most processors one pipeline may hold.
pub const MAX_PIPELINE_LEN: usize = 64;

/// One built-in processor, as data.
#[derive(Debug, Clone, PartialEq)]
pub enum ProcessorSpec {
    Temperature {
        temperature: f64,
    },
    ForcedSequence {
        token_ids: Vec<u32>,
        eos_token_id: u32,
        position: PositionSpec,
    },
    HelloWorld {
        position: PositionSpec,
    },
    ThinkingBudget {
        tokens: Option<ThinkingTokenConfig>,
        max_thinking_tokens: usize,
        overflow_percentage: f64,
    },
    BanTokens {
        token_ids: Vec<u32>,
    },
    LogitBias {
        bias: Vec<(u32, f32)>,
    },
}

/// How a forced sequence finds its position: by counting calls (the reference) or from the number
/// of generated tokens (robust to preemption and prefill/decode splits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PositionSpec {
    #[default]
    Calls,
    Tokens,
}

/// What an engine knows at start-up that specs may rely on.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpecContext {
    /// Token ids must be below this, when set.
    pub vocab_size: Option<usize>,
    /// The encoding of "Hello world!" and the EOS id, for `hello_world` specs.
    pub hello_world: Option<(Vec<u32>, u32)>,
    /// The model's thinking tokens, for `thinking_budget` specs that do not name them.
    pub thinking_tokens: Option<ThinkingTokenConfig>,
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
        let fields = Fields { object, at };
        let kind = fields.string("kind")?;
        let spec = match kind {
            "temperature" => {
                fields.only(&["temperature"])?;
                ProcessorSpec::Temperature {
                    temperature: fields.number("temperature")?,
                }
            }
            "forced_sequence" => {
                fields.only(&["token_ids", "eos_token_id", "position"])?;
                ProcessorSpec::ForcedSequence {
                    token_ids: fields.token_ids("token_ids")?,
                    eos_token_id: fields.token_id("eos_token_id")?,
                    position: fields.position()?,
                }
            }
            "hello_world" => {
                fields.only(&["position"])?;
                ProcessorSpec::HelloWorld {
                    position: fields.position()?,
                }
            }
            "thinking_budget" => {
                const IDS: [&str; 3] = ["start_token_id", "end_token_id", "newline_token_id"];
                fields.only(&[
                    "max_thinking_tokens",
                    "overflow_percentage",
                    IDS[0],
                    IDS[1],
                    IDS[2],
                ])?;
                let given = IDS.iter().filter(|f| object.contains_key(**f)).count();
                let tokens = match given {
                    0 => None,
                    3 => Some(ThinkingTokenConfig {
                        start_token_id: fields.token_id(IDS[0])?,
                        end_token_id: fields.token_id(IDS[1])?,
                        newline_token_id: fields.token_id(IDS[2])?,
                    }),
                    _ => {
                        return Err(Error::spec(
                            fields.path(IDS.iter().find(|f| !object.contains_key(**f)).unwrap()),
                            "give all three thinking token ids or none",
                        ))
                    }
                };
                let overflow_percentage = match object.get("overflow_percentage") {
                    None => 0.1,
                    Some(_) => fields.number("overflow_percentage")?,
                };
                ProcessorSpec::ThinkingBudget {
                    tokens,
                    max_thinking_tokens: fields.count("max_thinking_tokens")?,
                    overflow_percentage,
                }
            }
            "ban_tokens" => {
                fields.only(&["token_ids"])?;
                ProcessorSpec::BanTokens {
                    token_ids: fields.token_ids("token_ids")?,
                }
            }
            "logit_bias" => {
                fields.only(&["bias"])?;
                ProcessorSpec::LogitBias {
                    bias: fields.bias("bias")?,
                }
            }
            other => {
                return Err(Error::spec(
                    fields.path("kind"),
                    format!(
                        "unknown kind {other:?}; expected one of temperature, forced_sequence, \
                         hello_world, thinking_budget, ban_tokens, logit_bias"
                    ),
                ))
            }
        };
        spec.validate_values(at)?;
        Ok(spec)
    }

    /// Checks what does not depend on the engine: value ranges.
    fn validate_values(&self, at: &str) -> Result<()> {
        let field = |name: &str| format!("{at}{}{name}", if at.is_empty() { "" } else { "." });
        match self {
            ProcessorSpec::Temperature { temperature } => Temperature::new(*temperature)
                .map(drop)
                .map_err(|e| Error::spec(field("temperature"), e.to_string())),
            ProcessorSpec::ThinkingBudget {
                overflow_percentage,
                ..
            } => ThinkingBudget::new(ThinkingTokenConfig::DISABLED, 0, *overflow_percentage)
                .map(drop)
                .map_err(|e| Error::spec(field("overflow_percentage"), e.to_string())),
            ProcessorSpec::LogitBias { bias } => LogitBias::new(bias.clone())
                .map(drop)
                .map_err(|e| Error::spec(field("bias"), e.to_string())),
            _ => Ok(()),
        }
    }

    /// Builds fresh per-request state. `prompt_len` is where generated tokens start in the ids the
    /// engine will pass (for forced sequences positioned by tokens).
    pub fn realize(
        &self,
        context: &SpecContext,
        prompt_len: usize,
    ) -> Result<Box<dyn LogitsProcessor>> {
        let position = |p: PositionSpec| match p {
            PositionSpec::Calls => Position::Calls,
            PositionSpec::Tokens => Position::GeneratedTokens { prompt_len },
        };
        let processor: Box<dyn LogitsProcessor> = match self {
            ProcessorSpec::Temperature { temperature } => Box::new(Temperature::new(*temperature)?),
            ProcessorSpec::ForcedSequence {
                token_ids,
                eos_token_id,
                position: p,
            } => Box::new(
                ForcedSequence::new(token_ids.clone(), Some(*eos_token_id))?
                    .with_position(position(*p)),
            ),
            ProcessorSpec::HelloWorld { position: p } => {
                let (ids, eos) = context.hello_world.clone().ok_or_else(|| {
                    Error::spec(
                        "kind",
                        "hello_world needs the engine's tokenizer (SpecContext::hello_world)",
                    )
                })?;
                Box::new(ForcedSequence::new(ids, Some(eos))?.with_position(position(*p)))
            }
            ProcessorSpec::ThinkingBudget {
                tokens,
                max_thinking_tokens,
                overflow_percentage,
            } => {
                let tokens = tokens.or(context.thinking_tokens).ok_or_else(|| {
                    Error::spec(
                        "start_token_id",
                        "thinking_budget needs its token ids, in the spec or from the model",
                    )
                })?;
                Box::new(ThinkingBudget::new(
                    tokens,
                    *max_thinking_tokens,
                    *overflow_percentage,
                )?)
            }
            ProcessorSpec::BanTokens { token_ids } => Box::new(BanTokens::new(token_ids.clone())),
            ProcessorSpec::LogitBias { bias } => Box::new(LogitBias::new(bias.clone())?),
        };
        if let (Some(vocab_size), Some(token)) = (context.vocab_size, processor.max_token_id()) {
            check_token(self.kind(), token, vocab_size)?;
        }
        Ok(processor)
    }

    /// Checks the spec against an engine: everything [`ProcessorSpec::realize`] would check.
    pub fn validate(&self, context: &SpecContext) -> Result<()> {
        self.realize(context, 0).map(drop)
    }

    pub fn kind(&self) -> &'static str {
        match self {
            ProcessorSpec::Temperature { .. } => "temperature",
            ProcessorSpec::ForcedSequence { .. } => "forced_sequence",
            ProcessorSpec::HelloWorld { .. } => "hello_world",
            ProcessorSpec::ThinkingBudget { .. } => "thinking_budget",
            ProcessorSpec::BanTokens { .. } => "ban_tokens",
            ProcessorSpec::LogitBias { .. } => "logit_bias",
        }
    }
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

/// Typed access to a spec object's fields, with errors that name the field.
struct Fields<'a> {
    object: &'a Map<String, Value>,
    at: &'a str,
}

impl<'a> Fields<'a> {
    fn path(&self, name: &str) -> String {
        if self.at.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.at)
        }
    }

    fn only(&self, allowed: &[&str]) -> Result<()> {
        match self
            .object
            .keys()
            .find(|k| *k != "kind" && !allowed.contains(&k.as_str()))
        {
            Some(unknown) => Err(Error::spec(
                self.path(unknown),
                format!("unknown field; expected {}", allowed.join(", ")),
            )),
            None => Ok(()),
        }
    }

    fn get(&self, name: &str) -> Result<&'a Value> {
        self.object
            .get(name)
            .ok_or_else(|| Error::spec(self.path(name), "missing"))
    }

    fn wrong(&self, name: &str, expected: &str, found: &Value) -> Error {
        Error::spec(
            self.path(name),
            format!("expected {expected}, found {}", type_name(found)),
        )
    }

    fn string(&self, name: &str) -> Result<&'a str> {
        let value = self.get(name)?;
        value
            .as_str()
            .ok_or_else(|| self.wrong(name, "a string", value))
    }

    fn number(&self, name: &str) -> Result<f64> {
        let value = self.get(name)?;
        value
            .as_f64()
            .ok_or_else(|| self.wrong(name, "a number", value))
    }

    fn count(&self, name: &str) -> Result<usize> {
        let value = self.get(name)?;
        value
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| self.wrong(name, "a non-negative integer", value))
    }

    fn id_of(&self, name: &str, value: &Value) -> Result<u32> {
        value
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| self.wrong(name, "a token id (an integer from 0 to 2^32-1)", value))
    }

    fn token_id(&self, name: &str) -> Result<u32> {
        self.id_of(name, self.get(name)?)
    }

    fn token_ids(&self, name: &str) -> Result<Vec<u32>> {
        let value = self.get(name)?;
        let items = value
            .as_array()
            .ok_or_else(|| self.wrong(name, "a list of token ids", value))?;
        if items.len() > MAX_TOKEN_IDS {
            return Err(Error::TooLarge {
                field: self.path(name),
                len: items.len(),
                limit: MAX_TOKEN_IDS,
            });
        }
        items
            .iter()
            .enumerate()
            .map(|(i, item)| self.id_of(&format!("{name}[{i}]"), item))
            .collect()
    }

    fn bias(&self, name: &str) -> Result<Vec<(u32, f32)>> {
        let value = self.get(name)?;
        let entries = value
            .as_object()
            .ok_or_else(|| self.wrong(name, "an object from token id to bias", value))?;
        if entries.len() > MAX_TOKEN_IDS {
            return Err(Error::TooLarge {
                field: self.path(name),
                len: entries.len(),
                limit: MAX_TOKEN_IDS,
            });
        }
        entries
            .iter()
            .map(|(key, bias)| {
                let field = format!("{name}[{key:?}]");
                let token = key.parse::<u32>().map_err(|_| {
                    Error::spec(self.path(&field), "keys must be token ids (\"123\")")
                })?;
                let bias = bias
                    .as_f64()
                    .ok_or_else(|| self.wrong(&field, "a number", bias))?;
                Ok((token, bias as f32))
            })
            .collect()
    }

    fn position(&self) -> Result<PositionSpec> {
        match self.object.get("position") {
            None => Ok(PositionSpec::Calls),
            Some(_) => match self.string("position")? {
                "calls" => Ok(PositionSpec::Calls),
                "tokens" => Ok(PositionSpec::Tokens),
                other => Err(Error::spec(
                    self.path("position"),
                    format!("expected \"calls\" or \"tokens\", found {other:?}"),
                )),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(
            spec,
            ProcessorSpec::ForcedSequence {
                token_ids: vec![1, 2, 3],
                eos_token_id: 2,
                position: PositionSpec::Calls
            }
        );
    }

    #[test]
    fn every_kind_parses() {
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
            (r#"{"kind": "logit_bias", "bias": {"x": 1}}"#, "bias[\"x\"]"),
            (
                r#"[{"kind": "temperature", "temperature": 1}, {"kind": "ban_tokens"}]"#,
                "[1].token_ids",
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
    fn realize_checks_the_vocab_and_context() {
        let context = SpecContext {
            vocab_size: Some(10),
            ..Default::default()
        };
        let spec = ProcessorSpec::parse(
            r#"{"kind": "forced_sequence", "token_ids": [3, 10], "eos_token_id": 2}"#,
        )
        .unwrap();
        assert_eq!(
            field_of(spec.validate(&context).unwrap_err()),
            "forced_sequence"
        );
        let hello = ProcessorSpec::parse(r#"{"kind": "hello_world"}"#).unwrap();
        assert!(hello.validate(&context).is_err());
        let with_tokenizer = SpecContext {
            hello_world: Some((vec![4, 5], 1)),
            ..context
        };
        assert!(hello.validate(&with_tokenizer).is_ok());
    }
}
