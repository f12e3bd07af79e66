//! The one error type of the core crate.

use thiserror::Error;

/// Everything that can go wrong in this crate. When a call returns an error, the logits it was
/// given are exactly as they were.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum Error {
    /// A temperature that is not finite or is below [`crate::processors::MIN_TEMPERATURE`].
    #[error("temperature must be finite and at least 1e-30 (a smaller one turns logits into infinity), got {value}")]
    InvalidTemperature { value: f64 },

    /// A forced sequence (or HelloWorld) was built without an end-of-sequence token.
    #[error("{processor} requires eos_token_id")]
    MissingEosToken { processor: &'static str },

    /// A token id that does not index the logits row (or the batch's vocab).
    #[error("{field}: token id {token_id} is outside the vocab of {vocab_size}")]
    TokenOutOfVocab {
        field: String,
        token_id: u64,
        vocab_size: usize,
    },

    /// A numeric argument outside its allowed range.
    #[error("{field}: {message}")]
    InvalidArgument { field: String, message: String },

    /// A request spec that could not be accepted; `field` names the offending part.
    #[error("invalid spec at `{field}`: {message}")]
    InvalidSpec { field: String, message: String },

    /// A spec or token list over a documented size limit.
    #[error("`{field}` is too large: {len} exceeds the limit of {limit}")]
    TooLarge {
        field: String,
        len: usize,
        limit: usize,
    },

    /// Logits whose shape does not fit the call.
    #[error("logits shape: {0}")]
    Shape(String),

    /// A batch row index that holds no request, or is past the end.
    #[error("row {row}: {message}")]
    Row { row: usize, message: String },

    /// A tokenizer could not be loaded or used.
    #[error("tokenizer: {0}")]
    Tokenizer(String),

    /// A step of one batch row failed; `error` says how. The whole step was taken back.
    #[error("row {row}: {error}")]
    InRow { row: usize, error: Box<Error> },

    /// A user-supplied processor (outside this crate) failed.
    #[error("processor failed: {0}")]
    External(String),

    /// A user-supplied processor failed after the logits it was given moved: their memory was
    /// replaced or freed during its step. Nothing is written to the logits after it, not even to
    /// restore them; every processor's state is still taken back.
    #[error("processor failed: {0}")]
    LogitsMoved(String),
}

/// Short for `std::result::Result<T, Error>`.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn spec(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::InvalidSpec {
            field: field.into(),
            message: message.into(),
        }
    }

    /// This error, as the failure of batch row `row` (kept as it is when it already names one).
    pub fn in_row(self, row: usize) -> Self {
        match self {
            Error::InRow { .. } | Error::Row { .. } => self,
            error => Error::InRow {
                row,
                error: Box::new(error),
            },
        }
    }

    /// This error, met while admitting the spec at `at` (`"[2]"` for a pipeline's third entry, or
    /// `""`), as a spec error naming the field from `at` on (`[2].token_ids[3]`).
    pub fn in_spec(self, at: &str) -> Self {
        match self {
            Error::InvalidTemperature { .. } => {
                Error::spec(field_at(at, "temperature"), self.to_string())
            }
            Error::MissingEosToken { .. } => {
                Error::spec(field_at(at, "eos_token_id"), self.to_string())
            }
            Error::InvalidArgument { field, message } | Error::InvalidSpec { field, message } => {
                Error::spec(field_at(at, &field), message)
            }
            Error::TooLarge { field, len, limit } => Error::TooLarge {
                field: field_at(at, &field),
                len,
                limit,
            },
            Error::TokenOutOfVocab {
                field,
                token_id,
                vocab_size,
            } => Error::TokenOutOfVocab {
                field: field_at(at, &field),
                token_id,
                vocab_size,
            },
            other => other,
        }
    }

    /// The error without the row it happened in.
    pub fn root(&self) -> &Error {
        match self {
            Error::InRow { error, .. } => error.root(),
            error => error,
        }
    }

    pub(crate) fn argument(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::InvalidArgument {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// `name` inside the spec at `at` (`"[1]"`, or `""` for a spec alone).
pub(crate) fn field_at(at: &str, name: &str) -> String {
    match (at.is_empty(), name.is_empty()) {
        (true, _) => name.to_string(),
        (false, true) => at.to_string(),
        (false, false) if name.starts_with('[') => format!("{at}{name}"),
        (false, false) => format!("{at}.{name}"),
    }
}

/// Checks that `token_id` indexes a row of `vocab_size` logits.
pub(crate) fn check_token(field: &str, token_id: u32, vocab_size: usize) -> Result<()> {
    if (token_id as usize) < vocab_size {
        Ok(())
    } else {
        Err(Error::TokenOutOfVocab {
            field: field.to_string(),
            token_id: token_id.into(),
            vocab_size,
        })
    }
}
