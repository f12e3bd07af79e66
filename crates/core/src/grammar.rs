//! The grammars compiled for a [`Vocab`] through llguidance: its parser factory (made on first
//! use from the vocab's token trie, about half a second for a 150k-token vocab), a bounded cache
//! of compiled grammars shared by every request (a server that sees one schema a thousand times
//! compiles it once), and the limits every grammar is compiled and run under.

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::{Matcher, ParserFactory};
use lru::LruCache;

use crate::error::{Error, Result};
use crate::vocab::{panicked, tokenizer_error, unpoisoned, Vocab};

/// Compiled grammars kept per vocab (least recently used dropped first).
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

/// A vocab's parser factory and its compiled grammars.
pub(crate) struct Grammars {
    factory: ParserFactory,
    cache: Mutex<LruCache<String, Arc<Matcher>>>,
}

impl Grammars {
    /// llguidance's parser factory over `vocab`'s token trie. llguidance reads a trie it was
    /// never tested on; a panic there is this tokenizer's error, not the caller's crash.
    pub(crate) fn new(vocab: &Vocab) -> Result<Self> {
        let env = vocab.tok_env()?;
        let make = std::panic::AssertUnwindSafe(|| ParserFactory::new_simple(env));
        let mut factory = std::panic::catch_unwind(make)
            .map_err(|panic| panicked("llguidance", panic))?
            .map_err(tokenizer_error)?;
        factory.quiet();
        *factory.limits_mut() = grammar_limits();
        Ok(Self {
            factory,
            cache: Mutex::new(LruCache::new(
                NonZeroUsize::new(GRAMMAR_CACHE_SIZE).expect("not zero"),
            )),
        })
    }
}

impl Vocab {
    /// The matcher of `grammar` before any token, compiled once per `key` (the grammar's spec
    /// text) and then taken from the cache. A grammar that does not compile is a spec error at
    /// `field` carrying llguidance's message.
    pub(crate) fn compiled(
        &self,
        field: &str,
        key: &str,
        grammar: impl FnOnce() -> Result<TopLevelGrammar>,
    ) -> Result<Arc<Matcher>> {
        let grammars = self.grammars()?;
        let cached = unpoisoned(&grammars.cache).get(key).cloned();
        if let Some(template) = cached {
            return Ok(template);
        }
        let parser = grammars
            .factory
            .create_parser(grammar()?)
            .map_err(|e| Error::spec(field, e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(error) = matcher.get_error() {
            return Err(Error::spec(field, error));
        }
        let template = Arc::new(matcher);
        unpoisoned(&grammars.cache).put(key.to_string(), template.clone());
        Ok(template)
    }

    /// Compiled grammars in the cache.
    pub fn cached(&self) -> usize {
        self.grammars_made()
            .map_or(0, |grammars| unpoisoned(&grammars.cache).len())
    }
}
