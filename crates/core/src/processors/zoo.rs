//! What the kinds taken from NVIDIA's logits-processor-zoo share: text-or-ids parameters resolved
//! through the engine's tokenizer, the EOS id by default, the zoo's sentence ends, and the clock
//! of the wall-clock kinds.

use std::sync::Arc;
use std::time::Instant;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::spec::{check_len, EngineContext};

/// A phrase given as text (encoded with the engine's tokenizer, no special tokens) or as ids.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum TextOrIds {
    Text(String),
    Ids(Vec<u32>),
}

impl TextOrIds {
    /// The ids, checked against the vocab; text needs the context's tokenizer (the error names
    /// `field`). An empty phrase is refused.
    pub(crate) fn ids(&self, context: &EngineContext, field: &str) -> Result<Vec<u32>> {
        let ids = match self {
            TextOrIds::Text(text) => context.encode(field, text)?,
            TextOrIds::Ids(ids) => {
                check_len(field, ids.len())?;
                context.check_ids(field, ids.iter().copied())?;
                ids.clone()
            }
        };
        if ids.is_empty() {
            return Err(Error::argument(field, "must hold at least one token"));
        }
        Ok(ids)
    }

    pub(crate) fn check(&self, field: &str) -> Result<()> {
        match self {
            TextOrIds::Text(text) if text.is_empty() => {
                Err(Error::argument(field, "must not be empty"))
            }
            TextOrIds::Ids(ids) if ids.is_empty() => {
                Err(Error::argument(field, "must hold at least one id"))
            }
            TextOrIds::Ids(ids) => check_len(field, ids.len()),
            TextOrIds::Text(_) => Ok(()),
        }
    }

    pub(crate) fn is_text(&self) -> bool {
        matches!(self, TextOrIds::Text(_))
    }
}

/// One token given as text or as its id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum TextOrId {
    Text(String),
    Id(u32),
}

impl TextOrId {
    /// The id: the zoo's `text_to_token(..., last=False)`: the text's last token, the text
    /// encoding to at most two tokens (the zoo allows a prefix-space or BOS token before it).
    pub(crate) fn id(&self, context: &EngineContext, field: &str) -> Result<u32> {
        match self {
            TextOrId::Id(id) => {
                context.check_id(field, *id)?;
                Ok(*id)
            }
            TextOrId::Text(text) => {
                let ids = context.encode(field, text)?;
                match ids.as_slice() {
                    [.., last] if ids.len() <= 2 => Ok(*last),
                    _ => Err(Error::argument(
                        field,
                        format!(
                            "{text:?} is {} tokens; it must be one (or a prefix token and one)",
                            ids.len()
                        ),
                    )),
                }
            }
        }
    }

    pub(crate) fn is_text(&self) -> bool {
        matches!(self, TextOrId::Text(_))
    }
}

/// `given`, else the engine's EOS id; an error naming `field` when neither is known.
pub(crate) fn eos_or(context: &EngineContext, given: Option<u32>, field: &str) -> Result<u32> {
    match given.or(context.eos_token_id()) {
        Some(id) => {
            context.check_id(field, id)?;
            Ok(id)
        }
        None => Err(Error::spec(
            field,
            "needs an EOS id: give it, or the engine's context must know its EOS id",
        )),
    }
}

/// The text whose last token is the zoo's full stop, and the one whose last token is its new line
/// (`SentenceChecker`).
pub(crate) const SENTENCE_END_TEXTS: [&str; 2] = ["It is a sentence.", "It is a new line\n"];

/// The ids that end a sentence: `given`, else the last tokens of [`SENTENCE_END_TEXTS`].
pub(crate) fn sentence_ends(
    context: &EngineContext,
    given: Option<&[u32]>,
    field: &str,
) -> Result<Vec<u32>> {
    if let Some(ids) = given {
        check_len(field, ids.len())?;
        context.check_ids(field, ids.iter().copied())?;
        return Ok(ids.to_vec());
    }
    SENTENCE_END_TEXTS
        .iter()
        .map(|text| {
            let ids = context.encode(field, text)?;
            ids.last()
                .copied()
                .ok_or_else(|| Error::Tokenizer(format!("encode({text:?}) gave no ids")))
        })
        .collect()
}

/// A spec that can only be realized with the engine's tokenizer, checked without one
/// ([`EngineContext::structure_only`]): the structure alone.
pub(crate) fn structure_only(context: &EngineContext, needs_tokenizer: bool) -> bool {
    context.structure_only && needs_tokenizer && context.encoder.is_none()
}

/// Where the wall-clock kinds read the time: seconds from a fixed origin. Injectable, so a test
/// (or an engine with its own clock) decides what time it is.
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now(&self) -> f64;
}

/// The process's monotonic clock.
#[derive(Debug)]
pub struct SystemClock(Instant);

impl SystemClock {
    pub fn shared() -> Arc<dyn Clock> {
        static ORIGIN: std::sync::OnceLock<Arc<SystemClock>> = std::sync::OnceLock::new();
        ORIGIN
            .get_or_init(|| Arc::new(SystemClock(Instant::now())))
            .clone()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> f64 {
        self.0.elapsed().as_secs_f64()
    }
}

/// A clock a test sets by hand.
#[derive(Debug, Default)]
pub struct ManualClock(std::sync::Mutex<f64>);

impl ManualClock {
    pub fn set(&self, seconds: f64) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = seconds;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> f64 {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
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

/// Whether a token occurs among the generated ids, read incrementally (the zoo's `enabled`: the
/// boost token not written yet), and whether the last id ends a sentence.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct Seen {
    cursor: crate::processors::cursor::Cursor,
    found: bool,
}

impl Seen {
    /// Reads the ids past what was read (all of them from `prompt_len` when they do not extend
    /// them) and says whether `token` is among the generated ones.
    pub fn update(
        &mut self,
        ids: &dyn crate::history::TokenHistory,
        prompt_len: usize,
        token: u32,
    ) -> bool {
        let from = if self.cursor.extended_by(ids) && self.cursor.seen() >= prompt_len {
            self.cursor.seen()
        } else {
            self.found = false;
            prompt_len
        };
        if !self.found {
            self.found = (from..ids.token_count()).any(|i| ids.token_at(i) == token);
        }
        self.cursor.read_all(ids);
        self.found
    }
}
