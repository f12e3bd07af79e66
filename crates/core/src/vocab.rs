//! The engine's vocabulary as the kinds read it: each token's text (as bytes), the EOS ids, the
//! tokenizer that encodes the text of specs, and what kinds derive from the whole vocab (DRY's
//! text breakers, `ban_strings`' automata, the newline tokens), kept within a byte budget. With
//! the `grammar` feature it also holds the grammars compiled for it (`grammar.rs`).
//!
//! A [`Vocab`] is built once per engine from its `tokenizers` tokenizer and shared by every
//! request. Reading the token texts (toktrie's trie) costs about half a second for a 150k-token
//! vocab: it is done on first use, so an engine given its tokenizer that never sees a kind
//! needing the texts pays only for reading the tokenizer.

use std::any::Any;
use std::sync::{Arc, Mutex, OnceLock};

#[cfg(feature = "grammar")]
use toktrie::SimpleVob;
use toktrie::{TokEnv, TokTrie};

use crate::budget::{ByteBudgetCache, Footprint};
use crate::error::{Error, Result};

/// The bytes of what kinds derive from the whole vocab (`ban_strings`' automata, DRY's breakers
/// of a text, the newline tokens) kept per vocab, keyed by the spec's content: the least
/// recently used are dropped to stay within it, and a value larger than it is used by its
/// request and not kept (docs/hardening.md).
pub const DERIVED_CACHE_BYTES: usize = 128 << 20;

/// The engine's vocabulary: token texts, EOS ids, the tokenizer, and what is derived from them.
/// Cheap to clone (shared).
#[derive(Clone)]
pub struct Vocab(Arc<Inner>);

struct Inner {
    tokenizer_vocab: usize,
    // The tokenizer (kept to encode the text of specs) and the EOS override (empty: the
    // tokenizer's own), which the texts are read from.
    tokenizer: tokenizers::Tokenizer,
    eos_override: Vec<u32>,
    texts: OnceLock<std::result::Result<Texts, String>>,
    #[cfg(feature = "grammar")]
    grammars: OnceLock<std::result::Result<crate::grammar::Grammars, String>>,
}

/// What is read from the tokenizer on first use.
struct Texts {
    env: TokEnv,
    #[cfg(feature = "grammar")]
    eos: SimpleVob,
    eos_token_ids: Vec<u32>,
    // What kinds derive from the whole vocab, by key.
    derived: Mutex<ByteBudgetCache>,
}

impl std::fmt::Debug for Vocab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Vocab(vocab_size={})", self.vocab_size())
    }
}

/// Two vocabs are equal when they are the same one.
impl PartialEq for Vocab {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Vocab {
    /// The vocab of `tokenizer`. `eos_token_ids`, when not empty, are the ids a finished
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
            texts: OnceLock::new(),
            #[cfg(feature = "grammar")]
            grammars: OnceLock::new(),
        })))
    }

    /// The vocab of the `tokenizer.json` at `path`.
    pub fn from_file(path: impl AsRef<std::path::Path>, eos_token_ids: &[u32]) -> Result<Self> {
        Self::new(crate::tokenizer::load(path)?, eos_token_ids)
    }

    /// The token texts, read on first use. A tokenizer toktrie cannot read is a
    /// [`Error::Tokenizer`], at every use.
    fn texts(&self) -> Result<&Texts> {
        self.0
            .texts
            .get_or_init(|| {
                read_texts(self.0.tokenizer.clone(), self.0.eos_override.clone())
                    .map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|e| Error::Tokenizer(e.clone()))
    }

    /// toktrie's view of the tokenizer, which llguidance compiles grammars against.
    #[cfg(feature = "grammar")]
    pub(crate) fn tok_env(&self) -> Result<&TokEnv> {
        Ok(&self.texts()?.env)
    }

    /// The grammars' parser factory and cache, made on first use.
    #[cfg(feature = "grammar")]
    pub(crate) fn grammars(&self) -> Result<&crate::grammar::Grammars> {
        self.0
            .grammars
            .get_or_init(|| crate::grammar::Grammars::new(self).map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| Error::Tokenizer(e.clone()))
    }

    /// The grammars' parser factory and cache, if made.
    #[cfg(feature = "grammar")]
    pub(crate) fn grammars_made(&self) -> Option<&crate::grammar::Grammars> {
        self.0.grammars.get()?.as_ref().ok()
    }

    /// Reads the token texts (and, with grammars, makes their parser factory) now rather than
    /// at first use (for a caller that wants its cost, or its error, up front).
    pub fn prepare(&self) -> Result<()> {
        self.texts()?;
        #[cfg(feature = "grammar")]
        self.grammars()?;
        Ok(())
    }

    fn trie(&self) -> Result<&TokTrie> {
        Ok(self.texts()?.env.tok_trie())
    }

    /// Tokens the tokenizer knows (its added tokens included): masks cover these, and a wider
    /// (padded) logits row has the rest masked out.
    pub fn vocab_size(&self) -> usize {
        match self.0.texts.get() {
            Some(Ok(texts)) => texts.env.tok_trie().vocab_size(),
            _ => self.0.tokenizer_vocab,
        }
    }

    /// The first of the EOS ids a finished grammar allows.
    pub fn eos_token_id(&self) -> Result<u32> {
        Ok(self.texts()?.eos_token_ids[0])
    }

    /// Every EOS id a finished grammar allows.
    pub fn eos_token_ids(&self) -> Result<&[u32]> {
        Ok(&self.texts()?.eos_token_ids)
    }

    /// The mask that allows only the EOS ids, in words.
    #[cfg(feature = "grammar")]
    pub(crate) fn eos_words(&self) -> Result<&[u32]> {
        Ok(self.texts()?.eos.as_slice())
    }

    /// The text of every token, as its bytes (a special token's as its name, `<|im_end|>`),
    /// with its id, in id order: what llama.cpp's `detokenize({id}, special = true)` gives.
    pub fn token_texts(&self) -> Result<impl Iterator<Item = (u32, &[u8])>> {
        let trie = self.trie()?;
        Ok((0..trie.vocab_size() as u32).map(move |id| (id, special_as_name(trie.token(id)))))
    }

    /// The text a token adds to decoded text, as bytes: empty for a special token (decoding
    /// skips it) and for an id past the tokenizer's.
    pub fn decoded_text(&self, id: u32) -> Result<&[u8]> {
        let bytes = self.trie()?.token(id);
        Ok(match bytes.first() {
            Some(&TokTrie::SPECIAL_TOKEN_MARKER) => &[],
            _ => bytes,
        })
    }

    /// The text a token shows, as bytes: a special token's as its name (`<tool_call>`), as
    /// llama.cpp renders pieces for its triggers; empty for an id past the tokenizer's.
    #[cfg(feature = "grammar")]
    pub(crate) fn token_text(&self, id: u32) -> Result<&[u8]> {
        let trie = self.trie()?;
        Ok(if (id as usize) < trie.vocab_size() {
            special_as_name(trie.token(id))
        } else {
            &[]
        })
    }

    /// Tokens that spell `bytes` (toktrie's greedy tokenization: any bytes a byte-level vocab
    /// can spell), to feed a matcher text that arrived inside a longer token.
    #[cfg(feature = "grammar")]
    pub(crate) fn tokenize_bytes(&self, bytes: &[u8]) -> Result<Vec<u32>> {
        Ok(self.trie()?.greedy_tokenize(bytes))
    }

    /// The id of the token toktrie reads as special whose name is `text` (Qwen's
    /// `</tool_call>`), which a grammar's literal text does not match.
    #[cfg(feature = "grammar")]
    pub(crate) fn special_token_named(&self, text: &str) -> Result<Option<u32>> {
        let trie = self.trie()?;
        Ok(self.0.tokenizer.token_to_id(text).filter(|&id| {
            (id as usize) < trie.vocab_size()
                && trie.token(id).first() == Some(&TokTrie::SPECIAL_TOKEN_MARKER)
        }))
    }

    /// `make`'s value for `key`, made once per vocab (the most recently used kept, within
    /// [`DERIVED_CACHE_BYTES`]): what a kind derives from the whole vocab is not derived again for
    /// each request.
    pub(crate) fn derived<T: Any + Send + Sync + Footprint>(
        &self,
        key: &str,
        make: impl FnOnce(&Self) -> Result<T>,
    ) -> Result<Arc<T>> {
        let texts = self.texts()?;
        let cached = unpoisoned(&texts.derived).get(key);
        if let Some(value) = cached.and_then(|v| v.downcast::<T>().ok()) {
            return Ok(value);
        }
        let value = Arc::new(make(self)?);
        let footprint = value.footprint();
        unpoisoned(&texts.derived).put(key, value.clone(), footprint);
        Ok(value)
    }

    /// The bytes [`Vocab::derived`] values hold in the cache (at most [`DERIVED_CACHE_BYTES`]),
    /// and how many there are.
    pub fn derived_held(&self) -> (usize, usize) {
        match self.0.texts.get() {
            Some(Ok(texts)) => {
                let cache = unpoisoned(&texts.derived);
                (cache.held(), cache.len())
            }
            _ => (0, 0),
        }
    }

    /// The tokenizer it was made from.
    pub fn tokenizer(&self) -> &tokenizers::Tokenizer {
        &self.0.tokenizer
    }
}

/// The token trie of `tokenizer`. toktrie reads a tokenizer it was never tested on; a panic
/// there is this tokenizer's error, not the caller's crash.
fn read_texts(tokenizer: tokenizers::Tokenizer, eos_token_ids: Vec<u32>) -> Result<Texts> {
    let read =
        std::panic::AssertUnwindSafe(move || read_texts_unchecked(tokenizer, &eos_token_ids));
    std::panic::catch_unwind(read).unwrap_or_else(|panic| Err(panicked("toktrie", panic)))
}

/// A panic in `library` reading a tokenizer, as that tokenizer's error.
pub(crate) fn panicked(library: &str, panic: Box<dyn Any + Send>) -> Error {
    let message = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("a panic");
    Error::Tokenizer(format!("{library} cannot read it: {message}"))
}

fn read_texts_unchecked(tokenizer: tokenizers::Tokenizer, eos_token_ids: &[u32]) -> Result<Texts> {
    let mut bytes =
        toktrie_hf_tokenizers::ByteTokenizer::from_tokenizer(tokenizer).map_err(tokenizer_error)?;
    if !eos_token_ids.is_empty() {
        bytes.set_eos_tokens(eos_token_ids);
    }
    let env: TokEnv = bytes.into_tok_env(None).map_err(tokenizer_error)?;
    let trie = env.tok_trie();
    Ok(Texts {
        #[cfg(feature = "grammar")]
        eos: trie.eos_token_set(),
        eos_token_ids: trie.eos_tokens().to_vec(),
        env,
        derived: Mutex::new(ByteBudgetCache::new(DERIVED_CACHE_BYTES)),
    })
}

/// A token's bytes as toktrie keeps them, a special token's without toktrie's marker.
fn special_as_name(bytes: &[u8]) -> &[u8] {
    match bytes.split_first() {
        Some((&TokTrie::SPECIAL_TOKEN_MARKER, name)) => name,
        _ => bytes,
    }
}

/// A cache that holds no invariant a panic could break.
pub(crate) fn unpoisoned<T>(lock: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    lock.lock().unwrap_or_else(|e| e.into_inner())
}

/// The tokenizer's encoding (no special tokens), for the text of specs.
impl crate::processors::TextEncoder for Vocab {
    fn encode_plain(&self, text: &str) -> Result<Vec<u32>> {
        crate::processors::TextEncoder::encode_plain(&self.0.tokenizer, text)
    }
}

/// toktrie's and llguidance's errors are `anyhow` errors; only their text is kept.
pub(crate) fn tokenizer_error(error: impl std::fmt::Display) -> Error {
    Error::Tokenizer(error.to_string())
}

/// A byte-level tokenizer whose ids 0..256 are the bytes and whose further tokens are
/// `pieces` (never produced by encoding: it has no merges).
#[cfg(test)]
pub(crate) fn byte_level_vocab(pieces: &[&str]) -> Vocab {
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
    Vocab::new(text.to_string().parse().unwrap(), &[]).unwrap()
}
