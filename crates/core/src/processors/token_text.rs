//! Token parameters given as text or as ids (encoded with the engine's tokenizer), the engine's
//! EOS id by default, and the sentence ends of logits-processor-zoo's kinds.

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
