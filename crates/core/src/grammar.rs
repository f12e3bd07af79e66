//! The engine's tokenizer as llguidance sees it, and the grammars compiled for it.
//!
//! A [`GrammarEnv`] is built once per engine (per batch) from its `tokenizers` tokenizer: the
//! token trie llguidance walks to compute masks, the EOS ids, and a bounded cache of compiled
//! grammars shared by every request, so a server that sees one schema a thousand times compiles
//! it once. Building it costs about a second for a 150k-token vocab; every grammar spec then
//! reuses it. It is built on first use.

use std::any::Any;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, OnceLock};

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::toktrie::{SimpleVob, TokEnv, TokTrie};
use llguidance::{Matcher, ParserFactory};
use lru::LruCache;

use crate::budget::{ByteBudgetCache, Footprint};
use crate::error::{Error, Result};

/// Compiled grammars kept per environment (least recently used dropped first).
pub const GRAMMAR_CACHE_SIZE: usize = 256;

/// The bytes of what kinds derive from the whole vocab (`ban_strings`' automata, DRY's breakers
/// of a text, the newline tokens) kept per environment, keyed by the spec's content: the least
/// recently used are dropped to stay within it, and a value larger than it is used by its
/// request and not kept (docs/hardening.md).
pub const DERIVED_CACHE_BYTES: usize = 128 << 20;

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

/// The most work a grammar's regex may expand to ([`check_regex_size`]): llguidance builds a
/// counted repetition or a literal one element at a time, about 0.6 µs each in a mask (10,000:
/// about 6 ms for the first mask of `a{10000}`), and a million (`a{1000000}`, `(a{1000}){1000}`)
/// stalls a step for a second before failing.
pub const MAX_REGEX_SIZE: u64 = 10_000;

/// Refuses a regex whose counted repetitions and literals expand past [`MAX_REGEX_SIZE`]
/// elements (repetitions multiply: `x{1000}{1000}` is a million), naming `field`. A regex the
/// parser here does not read is left to llguidance, which reports its own errors.
pub(crate) fn check_regex_size(field: &str, pattern: &str) -> Result<()> {
    use regex_syntax::hir::{Hir, HirKind};
    fn size(hir: &Hir) -> u64 {
        match hir.kind() {
            HirKind::Empty | HirKind::Look(_) | HirKind::Class(_) => 1,
            HirKind::Literal(literal) => literal.0.len() as u64,
            HirKind::Repetition(repetition) => {
                let count = repetition.max.unwrap_or(repetition.min).max(1);
                size(&repetition.sub).saturating_mul(u64::from(count))
            }
            HirKind::Capture(capture) => size(&capture.sub),
            HirKind::Concat(parts) | HirKind::Alternation(parts) => parts
                .iter()
                .fold(0u64, |total, part| total.saturating_add(size(part))),
        }
    }
    let parsed = regex_syntax::ParserBuilder::new()
        .utf8(false)
        .unicode(false)
        .build()
        .parse(pattern);
    let Ok(hir) = parsed else {
        return Ok(());
    };
    let expanded = size(&hir);
    if expanded > MAX_REGEX_SIZE {
        return Err(Error::spec(
            field,
            format!(
                "the regex expands to {expanded} elements (counted repetitions multiply, literals \
                 count each byte), over the limit of {MAX_REGEX_SIZE}: a mask would stall a step"
            ),
        ));
    }
    Ok(())
}

/// The regex terminals of a Lark grammar (`/.../flags`, as Lark's lexer reads them: up to the
/// first `/` not escaped), each checked with [`check_regex_size`] under `field` (`lark`); quoted
/// strings and `//` comments are skipped.
pub(crate) fn check_lark_regexes(field: &str, lark: &str) -> Result<()> {
    let mut chars = lark.char_indices().peekable();
    while let Some((_, c)) = chars.next() {
        match c {
            '"' => {
                // A string literal, escapes included.
                while let Some((_, c)) = chars.next() {
                    match c {
                        '\\' => drop(chars.next()),
                        '"' => break,
                        _ => {}
                    }
                }
            }
            '/' if chars.peek().is_some_and(|&(_, next)| next == '/') => {
                // A comment, to the end of the line.
                for (_, c) in chars.by_ref() {
                    if c == '\n' {
                        break;
                    }
                }
            }
            '/' => {
                let start = chars.peek().map_or(lark.len(), |&(i, _)| i);
                let mut end = lark.len();
                while let Some((i, c)) = chars.next() {
                    match c {
                        '\\' => drop(chars.next()),
                        '/' => {
                            end = i;
                            break;
                        }
                        _ => {}
                    }
                }
                let regex = &lark[start..end];
                check_regex_size(field, regex).map_err(|e| match e {
                    Error::InvalidSpec { field, message } => {
                        let shown: String = regex.chars().take(40).collect();
                        Error::spec(field, format!("/{shown}/: {message}"))
                    }
                    other => other,
                })?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// The regexes of a JSON schema (`pattern`, and the keys of `patternProperties`), each checked
/// with [`check_regex_size`]; `at` names the schema's field (`json_schema`).
pub(crate) fn check_schema_regexes(at: &str, schema: &serde_json::Value) -> Result<()> {
    match schema {
        serde_json::Value::Object(object) => {
            for (key, value) in object {
                let field = format!("{at}.{key}");
                match (key.as_str(), value) {
                    ("pattern", serde_json::Value::String(pattern)) => {
                        check_regex_size(&field, pattern)?
                    }
                    ("patternProperties", serde_json::Value::Object(patterns)) => {
                        for (pattern, sub) in patterns {
                            check_regex_size(&format!("{field}[{pattern:?}]"), pattern)?;
                            check_schema_regexes(&format!("{field}.{pattern}"), sub)?;
                        }
                    }
                    _ => check_schema_regexes(&field, value)?,
                }
            }
            Ok(())
        }
        serde_json::Value::Array(items) => items
            .iter()
            .enumerate()
            .try_for_each(|(i, item)| check_schema_regexes(&format!("{at}[{i}]"), item)),
        _ => Ok(()),
    }
}

/// llguidance's view of the engine's tokenizer, and the grammars compiled for it. Cheap to
/// clone (shared). Built when the first grammar needs it: an engine that is given its tokenizer
/// but never sees a grammar pays only for reading the tokenizer.
#[derive(Clone)]
pub struct GrammarEnv(Arc<Inner>);

struct Inner {
    tokenizer_vocab: usize,
    // The tokenizer (kept to encode the text of specs) and the EOS override (empty: the
    // tokenizer's own), which the environment is built from.
    tokenizer: tokenizers::Tokenizer,
    eos_override: Vec<u32>,
    built: OnceLock<std::result::Result<Built, String>>,
}

struct Built {
    factory: ParserFactory,
    eos: SimpleVob,
    eos_token_ids: Vec<u32>,
    cache: Mutex<LruCache<String, Arc<Matcher>>>,
    // What kinds derive from the whole vocab (DRY's breakers of a text), by key.
    derived: Mutex<ByteBudgetCache>,
}

impl std::fmt::Debug for GrammarEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GrammarEnv(vocab_size={})", self.vocab_size())
    }
}

/// Two environments are equal when they are the same one.
impl PartialEq for GrammarEnv {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl GrammarEnv {
    /// The environment of `tokenizer`. `eos_token_ids`, when not empty, are the ids a finished
    /// grammar allows (a chat model often ends on either of two, e.g. Qwen3's `<|im_end|>` and
    /// `<|endoftext|>`), in place of the EOS the tokenizer declares (which toktrie finds from its
    /// special tokens). An id outside the tokenizer's vocab is a [`Error::TokenOutOfVocab`].
    pub fn new(tokenizer: tokenizers::Tokenizer, eos_token_ids: &[u32]) -> Result<Self> {
        let tokenizer_vocab = tokenizer.get_vocab_size(true);
        if let Some(&id) = eos_token_ids
            .iter()
            .find(|&&id| id as usize >= tokenizer_vocab)
        {
            return Err(Error::TokenOutOfVocab {
                field: "eos_token_id".into(),
                token_id: id.into(),
                vocab_size: tokenizer_vocab,
            });
        }
        Ok(Self(Arc::new(Inner {
            tokenizer_vocab,
            tokenizer,
            eos_override: eos_token_ids.to_vec(),
            built: OnceLock::new(),
        })))
    }

    /// The environment of the `tokenizer.json` at `path`.
    pub fn from_file(path: impl AsRef<std::path::Path>, eos_token_ids: &[u32]) -> Result<Self> {
        Self::new(crate::tokenizer::load(path)?, eos_token_ids)
    }

    /// The token trie and parser factory, built on first use (about a second for a 150k-token
    /// vocab). A tokenizer llguidance cannot read is a [`Error::Tokenizer`], at every use.
    fn built(&self) -> Result<&Built> {
        self.0
            .built
            .get_or_init(|| {
                build(self.0.tokenizer.clone(), self.0.eos_override.clone())
                    .map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|e| Error::Tokenizer(e.clone()))
    }

    /// Builds the environment now rather than at the first grammar (for a caller that wants
    /// its cost, or its error, up front).
    pub fn prepare(&self) -> Result<()> {
        self.built().map(drop)
    }

    /// Tokens the tokenizer knows (its added tokens included): masks cover these, and a wider
    /// (padded) logits row has the rest masked out.
    pub fn vocab_size(&self) -> usize {
        match self.0.built.get() {
            Some(Ok(built)) => built.factory.tok_env().tok_trie().vocab_size(),
            _ => self.0.tokenizer_vocab,
        }
    }

    /// The first of the EOS ids a finished grammar allows.
    pub fn eos_token_id(&self) -> Result<u32> {
        Ok(self.built()?.eos_token_ids[0])
    }

    /// Every EOS id a finished grammar allows.
    pub fn eos_token_ids(&self) -> Result<&[u32]> {
        Ok(&self.built()?.eos_token_ids)
    }

    /// The mask that allows only the EOS ids, in words.
    pub(crate) fn eos_words(&self) -> Result<&[u32]> {
        Ok(self.built()?.eos.as_slice())
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
        let built = self.built()?;
        let cached = built.lock().get(key).cloned();
        if let Some(template) = cached {
            return Ok(template);
        }
        let parser = built
            .factory
            .create_parser(grammar()?)
            .map_err(|e| Error::spec(field, e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(error) = matcher.get_error() {
            return Err(Error::spec(field, error));
        }
        let template = Arc::new(matcher);
        built.lock().put(key.to_string(), template.clone());
        Ok(template)
    }

    /// The text of every token, as its bytes (a special token's as its name, `<|im_end|>`),
    /// with its id, in id order: what llama.cpp's `detokenize({id}, special = true)` gives.
    pub fn token_texts(&self) -> Result<impl Iterator<Item = (u32, &[u8])>> {
        let trie = self.built()?.factory.tok_env().tok_trie();
        Ok((0..trie.vocab_size() as u32).map(move |id| (id, special_as_name(trie.token(id)))))
    }

    /// The text a token adds to decoded text, as bytes: empty for a special token (decoding
    /// skips it) and for an id past the tokenizer's.
    pub fn decoded_text(&self, id: u32) -> Result<&[u8]> {
        let bytes = self.built()?.factory.tok_env().tok_trie().token(id);
        Ok(match bytes.first() {
            Some(&TokTrie::SPECIAL_TOKEN_MARKER) => &[],
            _ => bytes,
        })
    }

    /// The text a token shows, as bytes: a special token's as its name (`<tool_call>`), as
    /// llama.cpp renders pieces for its triggers; empty for an id past the tokenizer's.
    pub(crate) fn token_text(&self, id: u32) -> Result<&[u8]> {
        let trie = self.built()?.factory.tok_env().tok_trie();
        Ok(if (id as usize) < trie.vocab_size() {
            special_as_name(trie.token(id))
        } else {
            &[]
        })
    }

    /// Tokens that spell `bytes` (toktrie's greedy tokenization: any bytes a byte-level vocab
    /// can spell), to feed a matcher text that arrived inside a longer token.
    pub(crate) fn tokenize_bytes(&self, bytes: &[u8]) -> Result<Vec<u32>> {
        Ok(self
            .built()?
            .factory
            .tok_env()
            .tok_trie()
            .greedy_tokenize(bytes))
    }

    /// The id of the token llguidance reads as special whose name is `text` (Qwen's
    /// `</tool_call>`), which a grammar's literal text does not match.
    pub(crate) fn special_token_named(&self, text: &str) -> Result<Option<u32>> {
        let trie = self.built()?.factory.tok_env().tok_trie();
        Ok(self.0.tokenizer.token_to_id(text).filter(|&id| {
            (id as usize) < trie.vocab_size()
                && trie.token(id).first() == Some(&TokTrie::SPECIAL_TOKEN_MARKER)
        }))
    }

    /// `make`'s value for `key`, made once per environment (the most recently used kept, within
    /// [`DERIVED_CACHE_BYTES`]): what a kind derives from the whole vocab is not derived again for
    /// each request.
    pub(crate) fn derived<T: Any + Send + Sync + Footprint>(
        &self,
        key: &str,
        make: impl FnOnce(&Self) -> Result<T>,
    ) -> Result<Arc<T>> {
        let built = self.built()?;
        let cached = unpoisoned(&built.derived).get(key);
        if let Some(value) = cached.and_then(|v| v.downcast::<T>().ok()) {
            return Ok(value);
        }
        let value = Arc::new(make(self)?);
        let footprint = value.footprint();
        unpoisoned(&built.derived).put(key, value.clone(), footprint);
        Ok(value)
    }

    /// The bytes [`GrammarEnv::derived`] values hold in the cache (at most
    /// [`DERIVED_CACHE_BYTES`]), and how many there are.
    pub fn derived_held(&self) -> (usize, usize) {
        match self.0.built.get() {
            Some(Ok(built)) => {
                let cache = unpoisoned(&built.derived);
                (cache.held(), cache.len())
            }
            _ => (0, 0),
        }
    }

    /// The tokenizer it was made from.
    pub fn tokenizer(&self) -> &tokenizers::Tokenizer {
        &self.0.tokenizer
    }

    /// Compiled grammars in the cache.
    pub fn cached(&self) -> usize {
        match self.0.built.get() {
            Some(Ok(built)) => built.lock().len(),
            _ => 0,
        }
    }
}

/// The token trie and parser factory of `tokenizer`. toktrie and llguidance read a tokenizer they
/// were never tested on; a panic there is this tokenizer's error, not the caller's crash.
fn build(tokenizer: tokenizers::Tokenizer, eos_token_ids: Vec<u32>) -> Result<Built> {
    let read = std::panic::AssertUnwindSafe(move || build_unchecked(tokenizer, &eos_token_ids));
    std::panic::catch_unwind(read).unwrap_or_else(|panic| {
        let message = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("a panic");
        Err(Error::Tokenizer(format!(
            "llguidance cannot read it: {message}"
        )))
    })
}

fn build_unchecked(tokenizer: tokenizers::Tokenizer, eos_token_ids: &[u32]) -> Result<Built> {
    let mut bytes =
        toktrie_hf_tokenizers::ByteTokenizer::from_tokenizer(tokenizer).map_err(tokenizer_error)?;
    if !eos_token_ids.is_empty() {
        bytes.set_eos_tokens(eos_token_ids);
    }
    let env: TokEnv = bytes.into_tok_env(None).map_err(tokenizer_error)?;
    let mut factory = ParserFactory::new_simple(&env).map_err(tokenizer_error)?;
    factory.quiet();
    *factory.limits_mut() = grammar_limits();
    let trie = env.tok_trie();
    Ok(Built {
        eos: trie.eos_token_set(),
        eos_token_ids: trie.eos_tokens().to_vec(),
        factory,
        cache: Mutex::new(LruCache::new(
            NonZeroUsize::new(GRAMMAR_CACHE_SIZE).expect("not zero"),
        )),
        derived: Mutex::new(ByteBudgetCache::new(DERIVED_CACHE_BYTES)),
    })
}

impl Built {
    fn lock(&self) -> std::sync::MutexGuard<'_, LruCache<String, Arc<Matcher>>> {
        unpoisoned(&self.cache)
    }
}

/// A token's bytes as toktrie keeps them, a special token's without toktrie's marker.
fn special_as_name(bytes: &[u8]) -> &[u8] {
    match bytes.split_first() {
        Some((&TokTrie::SPECIAL_TOKEN_MARKER, name)) => name,
        _ => bytes,
    }
}

/// A cache that holds no invariant a panic could break.
fn unpoisoned<T>(lock: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    lock.lock().unwrap_or_else(|e| e.into_inner())
}

/// The tokenizer's encoding (no special tokens), for the text of specs.
impl crate::processors::TextEncoder for GrammarEnv {
    fn encode_plain(&self, text: &str) -> Result<Vec<u32>> {
        crate::processors::TextEncoder::encode_plain(&self.0.tokenizer, text)
    }
}

/// llguidance's errors are `anyhow` errors; only their text is kept.
fn tokenizer_error(error: impl std::fmt::Display) -> Error {
    Error::Tokenizer(error.to_string())
}

/// A byte-level tokenizer whose ids 0..256 are the bytes and whose further tokens are
/// `pieces` (never produced by encoding: it has no merges).
#[cfg(test)]
pub(crate) fn byte_level_env(pieces: &[&str]) -> GrammarEnv {
    // GPT-2's byte-to-character map, which byte-level tokenizers write their tokens in.
    let byte_char = |b: u8| {
        let printable =
            |b: u8| (b'!'..=b'~').contains(&b) || (0xa1..=0xac).contains(&b) || b >= 0xae;
        if printable(b) {
            return b as char;
        }
        char::from_u32(256 + (0..b).filter(|&c| !printable(c)).count() as u32).unwrap()
    };
    let mut vocab = serde_json::Map::new();
    for b in 0..=255u8 {
        vocab.insert(byte_char(b).to_string(), b.into());
    }
    for piece in pieces {
        let id = vocab.len();
        vocab.insert(piece.bytes().map(byte_char).collect(), id.into());
    }
    let byte_level = serde_json::json!({"type": "ByteLevel", "add_prefix_space": false,
        "trim_offsets": true, "use_regex": true});
    let text = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": byte_level, "post_processor": null,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
                  "continuing_subword_prefix": null, "end_of_word_suffix": null,
                  "fuse_unk": false, "byte_fallback": false, "vocab": vocab, "merges": []}
    });
    GrammarEnv::new(text.to_string().parse().unwrap(), &[]).unwrap()
}
