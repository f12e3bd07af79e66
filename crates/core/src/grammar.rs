//! The engine's tokenizer as llguidance sees it, and the grammars compiled for it.
//!
//! A [`GrammarEnv`] is built once per engine (per batch) from its `tokenizers` tokenizer: the
//! token trie llguidance walks to compute masks, the EOS ids, and a bounded cache of compiled
//! grammars shared by every request, so a server that sees one schema a thousand times compiles
//! it once. Building it costs about a second for a 150k-token vocab; every grammar spec then
//! reuses it.

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::toktrie::{SimpleVob, TokEnv};
use llguidance::{Matcher, ParserFactory};
use lru::LruCache;

use crate::error::{Error, Result};

/// Compiled grammars kept per environment (least recently used dropped first).
pub const GRAMMAR_CACHE_SIZE: usize = 256;

/// The limits every grammar is compiled and run under, so a hostile grammar cannot stall a
/// step: past them the grammar's compile fails (a `SpecError`) or its row stops with a failure
/// (only EOS allowed; [`crate::LogitsProcessor::failure`]). They are llguidance's defaults,
/// stated here so they are ours to keep.
pub fn grammar_limits() -> ParserLimits {
    ParserLimits {
        // Earley items in one row: the grammar's branching factor.
        max_items_in_row: 2_000,
        // Lexer work to build the initial regex nodes (compile time; about 50k a millisecond).
        initial_lexer_fuel: 1_000_000,
        // Lexer work for one mask (about 14k a millisecond).
        step_lexer_fuel: 200_000,
        // Earley items for one mask (about 20k a millisecond).
        step_max_items: 50_000,
        // Lexer states (memory: 1-2 kB each).
        max_lexer_states: 250_000,
        // Symbols in the grammar's productions (a few megabytes of JSON schema).
        max_grammar_size: 500_000,
        precompute_large_lexemes: true,
        // Errors carry llguidance's message, not a dump of the parser's state.
        verbose_errors: false,
    }
}

/// llguidance's view of the engine's tokenizer, and the grammars compiled for it. Cheap to
/// clone (shared).
#[derive(Clone)]
pub struct GrammarEnv(Arc<Inner>);

struct Inner {
    factory: ParserFactory,
    eos: SimpleVob,
    eos_token_id: u32,
    cache: Mutex<LruCache<String, Arc<Matcher>>>,
}

impl std::fmt::Debug for GrammarEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "GrammarEnv(vocab_size={}, eos_token_id={})",
            self.vocab_size(),
            self.eos_token_id()
        )
    }
}

/// Two environments are equal when they are the same one.
impl PartialEq for GrammarEnv {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl GrammarEnv {
    /// The environment of `tokenizer`. `eos_token_id` overrides the EOS the tokenizer declares
    /// (toktrie finds it from the tokenizer's special tokens otherwise).
    pub fn new(tokenizer: tokenizers::Tokenizer, eos_token_id: Option<u32>) -> Result<Self> {
        let mut bytes = toktrie_hf_tokenizers::ByteTokenizer::from_tokenizer(tokenizer)
            .map_err(tokenizer_error)?;
        if let Some(eos) = eos_token_id {
            bytes.set_eos_token(eos);
        }
        let env: TokEnv = bytes.into_tok_env(None).map_err(tokenizer_error)?;
        let mut factory = ParserFactory::new_simple(&env).map_err(tokenizer_error)?;
        factory.quiet();
        *factory.limits_mut() = grammar_limits();
        let trie = env.tok_trie();
        Ok(Self(Arc::new(Inner {
            eos: trie.eos_token_set(),
            eos_token_id: trie.eos_token(),
            factory,
            cache: Mutex::new(LruCache::new(
                NonZeroUsize::new(GRAMMAR_CACHE_SIZE).expect("not zero"),
            )),
        })))
    }

    /// The environment of the `tokenizer.json` at `path`.
    pub fn from_file(path: impl AsRef<std::path::Path>, eos_token_id: Option<u32>) -> Result<Self> {
        Self::new(crate::tokenizer::load(path)?, eos_token_id)
    }

    /// Tokens the tokenizer knows: masks cover these, and a wider (padded) logits row has the
    /// rest masked out.
    pub fn vocab_size(&self) -> usize {
        self.0.factory.tok_env().tok_trie().vocab_size()
    }

    /// The EOS id a finished grammar allows.
    pub fn eos_token_id(&self) -> u32 {
        self.0.eos_token_id
    }

    /// The mask that allows only the EOS ids, in words.
    pub(crate) fn eos_words(&self) -> &[u32] {
        self.0.eos.as_slice()
    }

    /// Mask words per row: one bit per token of the tokenizer.
    pub(crate) fn mask_words(&self) -> usize {
        self.vocab_size().div_ceil(32)
    }

    /// The matcher of `grammar` before any token, compiled once per `key` (the grammar's spec
    /// text) and then taken from the cache. A grammar that does not compile is a spec error at
    /// `field` carrying llguidance's message.
    pub(crate) fn compiled(
        &self,
        field: &str,
        key: &str,
        grammar: impl FnOnce() -> Result<TopLevelGrammar>,
    ) -> Result<Arc<Matcher>> {
        let cached = self.lock().get(key).cloned();
        let template = match cached {
            Some(template) => template,
            None => {
                let parser = self
                    .0
                    .factory
                    .create_parser(grammar()?)
                    .map_err(|e| Error::spec(field, e.to_string()))?;
                let matcher = Matcher::new(Ok(parser));
                if let Some(error) = matcher.get_error() {
                    return Err(Error::spec(field, error));
                }
                let template = Arc::new(matcher);
                self.lock().put(key.to_string(), template.clone());
                template
            }
        };
        Ok(template)
    }

    /// Compiled grammars in the cache.
    pub fn cached(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LruCache<String, Arc<Matcher>>> {
        // The cache holds no invariant a panic could break.
        self.0.cache.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// llguidance's errors are `anyhow` errors; only their text is kept.
fn tokenizer_error(error: impl std::fmt::Display) -> Error {
    Error::Tokenizer(error.to_string())
}
