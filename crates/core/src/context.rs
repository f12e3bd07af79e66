//! What an engine knows at start-up that specs may rely on: built once per engine from its
//! tokenizer, model name, vocab size and EOS ids ([`EngineContext::for_engine`]), or explicitly
//! without an engine ([`EngineContext::structure_only`]).
//!
//! Everything derived from the tokenizer is derived here, by one rule each: the ids of
//! "Hello world!" ([`HELLO_WORLD_TEXT`]), the thinking tokens
//! ([`get_thinking_token_config`]), and the token ids of any text a spec carries
//! ([`EngineContext::encode`]). A kind that needs the engine reads it from the context in its
//! own file; nothing else changes.

use std::sync::Arc;

use crate::error::{check_token, Error, Result};
use crate::processors::{
    get_thinking_token_config, TextEncoder, ThinkingTokenConfig, HELLO_WORLD_TEXT,
};

/// The engine's tokenizer, shared, as the context encodes text with it.
#[derive(Clone)]
pub struct Encoder(pub Arc<dyn TextEncoder + Send + Sync>);

impl std::fmt::Debug for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Encoder(..)")
    }
}

/// Two encoders are equal when they are the same one.
impl PartialEq for Encoder {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// What an engine knows at start-up that specs may rely on.
///
/// ```
/// use logits_processing::{ProcessorSpec, EngineContext, TextEncoder, Result};
/// use std::sync::Arc;
///
/// struct Letters; // a toy tokenizer: one id per byte
/// impl TextEncoder for Letters {
///     fn encode_plain(&self, text: &str) -> Result<Vec<u32>> {
///         Ok(text.bytes().map(u32::from).collect())
///     }
/// }
/// let context = EngineContext::for_engine(Some(Arc::new(Letters)), Some("my-model"), Some(256), &[0])?;
/// assert_eq!(context.hello_world.as_ref().unwrap().0[..2], [72, 101]); // "He"
/// assert_eq!(context.encode("stop", "ab")?, [97, 98]);
/// let hello = ProcessorSpec::parse(r#"{"kind": "hello_world"}"#)?;
/// hello.validate(&context)?;
/// // Without an engine, only what does not depend on one is checked.
/// hello.validate(&EngineContext::structure_only())?;
/// assert!(hello.validate(&EngineContext::default()).is_err());
/// # Ok::<(), logits_processing::Error>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineContext {
    /// Token ids must be below this, when set.
    pub vocab_size: Option<usize>,
    /// The encoding of "Hello world!" and the EOS id, for `hello_world` specs.
    pub hello_world: Option<(Vec<u32>, u32)>,
    /// The model's thinking tokens, for `thinking_budget` specs that do not name them.
    pub thinking_tokens: Option<ThinkingTokenConfig>,
    /// The engine's vocab (token texts, EOS ids, compiled grammars), for the kinds that read
    /// token texts (`Kind::needs_token_texts`: grammars, `ban_strings`, DRY's text breakers, ...).
    #[cfg(feature = "tokenizers")]
    pub vocab: Option<crate::vocab::Vocab>,
    /// The engine's tokenizer, for specs that carry text ([`EngineContext::encode`]).
    pub encoder: Option<Encoder>,
    /// The model's EOS ids: what a row is left with when a step would leave it no finite logit
    /// (see [`crate::Pipeline`]). Empty: such a row is left as the step left it.
    pub eos_token_ids: Vec<u32>,
    /// No engine is known yet (a frontend, a client): what a kind would take from the engine is
    /// not checked, only what does not depend on it ([`EngineContext::structure_only`]).
    pub structure_only: bool,
    /// Under speculative decoding, the most drafts the engine verifies for a request in one step
    /// (vLLM's `num_speculative_tokens`), when it hands a row per draft: each pipeline then keeps
    /// what it needs to resume from any of them ([`crate::Pipeline::with_speculative_tokens`]).
    /// 0: none.
    pub speculative_tokens: usize,
}

impl EngineContext {
    /// The context of an engine: the tokenizer (its text encoding, without special tokens),
    /// the model's name, the vocab size of its logits and its EOS ids (the first is the one a
    /// `hello_world` reply ends with). From them: `hello_world` (with a tokenizer and an EOS id)
    /// and the thinking tokens ([`get_thinking_token_config`]'s rule; none where it finds no
    /// single-token `<think>` / `</think>`). Set `grammar` (and override any field) after.
    ///
    /// A tokenizer that fails to encode "Hello world!" is an [`Error::Tokenizer`].
    pub fn for_engine(
        encoder: Option<Arc<dyn TextEncoder + Send + Sync>>,
        model_name: Option<&str>,
        vocab_size: Option<usize>,
        eos_token_ids: &[u32],
    ) -> Result<Self> {
        let hello_world = match (&encoder, eos_token_ids.first()) {
            (Some(encoder), Some(&eos)) => Some((encoder.encode_plain(HELLO_WORLD_TEXT)?, eos)),
            _ => None,
        };
        let thinking_tokens = (encoder.is_some() || model_name.is_some())
            .then(|| {
                get_thinking_token_config(
                    model_name.unwrap_or(""),
                    encoder.as_deref().map(|e| e as &dyn TextEncoder),
                )
            })
            .filter(|c| c.start_token_id != 0 && c.end_token_id != 0);
        Ok(Self {
            vocab_size,
            hello_world,
            thinking_tokens,
            encoder: encoder.map(Encoder),
            eos_token_ids: eos_token_ids.to_vec(),
            ..Default::default()
        })
    }

    /// The context of a caller that does not know the engine yet (a frontend, a client):
    /// validation checks everything that does not depend on the engine (kinds, fields, types,
    /// values, size limits, a grammar's syntax) and accepts what the engine will supply
    /// (`hello_world`, a thinking budget without ids). It realizes nothing that needs the
    /// engine.
    pub fn structure_only() -> Self {
        Self {
            structure_only: true,
            ..Default::default()
        }
    }

    /// Whether the context has the engine's token texts (a `Vocab`), which
    /// the kinds that read them need.
    pub fn has_token_texts(&self) -> bool {
        #[cfg(feature = "tokenizers")]
        return self.vocab.is_some();
        #[cfg(not(feature = "tokenizers"))]
        return false;
    }

    /// The engine's EOS id (the first of its EOS ids), for kinds that act on EOS by default.
    pub fn eos_token_id(&self) -> Option<u32> {
        self.eos_token_ids.first().copied()
    }

    /// The token ids of `text` (no special tokens) for the spec field `field`; an error naming
    /// it when the context has no tokenizer.
    pub fn encode(&self, field: &str, text: &str) -> Result<Vec<u32>> {
        let encoder = self.encoder.as_ref().ok_or_else(|| {
            Error::spec(
                field,
                "text needs the engine's tokenizer, which this context has not got",
            )
        })?;
        let ids = encoder.0.encode_plain(text)?;
        self.check_ids(field, ids.iter().copied())?;
        Ok(ids)
    }

    /// Checks the ids of the list `field` against the vocab, when it is known; the error names
    /// the entry (`token_ids[3]`).
    pub fn check_ids(&self, field: &str, ids: impl IntoIterator<Item = u32>) -> Result<()> {
        let Some(vocab) = self.vocab_size else {
            return Ok(());
        };
        ids.into_iter()
            .enumerate()
            .try_for_each(|(i, id)| check_token(&format!("{field}[{i}]"), id, vocab))
    }

    /// Checks one id against the vocab, when it is known.
    pub fn check_id(&self, field: &str, id: u32) -> Result<()> {
        match self.vocab_size {
            Some(vocab) => check_token(field, id, vocab),
            None => Ok(()),
        }
    }
}
