use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use aho_corasick::automaton::{Automaton, StateID};
use aho_corasick::nfa::contiguous::NFA;
use aho_corasick::{Anchored, MatchKind};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::budget::Footprint;
use crate::error::{Error, Result};
use crate::history::TokenHistory;
use crate::plan::RowPlan;
use crate::processors::cursor::Cursor;
use crate::processors::{push_bans, LogitsProcessor};
use crate::spec::{check_texts, EngineContext, KindSpec};
use crate::vocab::Vocab;

/// `{"kind": "ban_strings", "strings": ["As an AI", "I cannot"], "case_sensitive": true}`: texts
/// never to generate, whatever tokens would spell them. At each step every token whose text
/// would complete one of `strings`, given the text generated so far, is banned: a string split
/// over several tokens is stopped at its last token.
///
/// - `strings`: 1 to 256 bytes each, at most 1,024 of them;
/// - `case_sensitive` (default true): false compares ASCII letters regardless of case (other
///   letters as they are).
///
/// Reads the text generated from `prompt_len` on, not the prompt, and needs the engine's
/// tokenizer (its token texts): without one the spec is refused, naming `strings`. A special
/// token adds no text.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BanStringsSpec {
    pub strings: Vec<String>,
    #[serde(default = "case_sensitive_by_default")]
    pub case_sensitive: bool,
}

fn case_sensitive_by_default() -> bool {
    true
}

const MAX_STRING_BYTES: usize = 256;

impl KindSpec for BanStringsSpec {
    /// The banned strings are looked for in the output alone.
    fn needs_prompt_len(&self) -> bool {
        true
    }

    fn check(&self) -> Result<()> {
        if self.strings.is_empty() {
            return Err(Error::spec(
                "strings",
                "must hold 1 to 1,024 strings, got none",
            ));
        }
        check_texts(
            "strings",
            self.strings.iter().map(String::as_str),
            1024,
            MAX_STRING_BYTES,
        )
    }

    fn realize(
        &self,
        context: &EngineContext,
        prompt_len: usize,
    ) -> Result<Box<dyn LogitsProcessor>> {
        self.check()?;
        let env = context.vocab.clone().ok_or_else(|| {
            Error::spec(
                "strings",
                "banned strings need the engine's tokenizer (its token texts), which this \
                 context has not got",
            )
        })?;
        let key = serde_json::to_string(self).expect("plain data");
        let banner = env.derived(&format!("ban_strings {key}"), |_| {
            Banner::new(&self.strings, self.case_sensitive)
        })?;
        Ok(Box::new(BanStrings::new(banner, env, prompt_len)))
    }

    fn validate(&self, context: &EngineContext) -> Option<Result<()>> {
        // Without an engine, the tokenizer is the engine's to supply.
        (context.structure_only && context.vocab.is_none()).then(|| self.check())
    }
}

/// The bytes of banned-token lists one [`Banner`] keeps: past them its lists are dropped and
/// found again as states are visited (a pass over the vocab's texts each).
pub(crate) const BANNED_LISTS_BYTES: usize = 4 << 20;

/// The automaton over the banned strings and, by its state, the tokens that would complete one:
/// shared by every request with the same strings, each state's tokens found once (a pass over
/// the vocab's texts) and kept, within [`BANNED_LISTS_BYTES`]. The automaton is a contiguous NFA
/// (a few bytes per byte of the strings: 1,024 strings of 256 bytes take about 2 MB; a DFA would
/// take a transition table of every state by every byte class, hundreds of megabytes).
struct Banner {
    nfa: NFA,
    banned: Mutex<BannedLists>,
}

#[derive(Default)]
struct BannedLists {
    by_state: HashMap<StateID, Arc<[u32]>>,
    bytes: usize,
}

/// What a list costs in [`BannedLists`]: its ids, its `Arc`'s counts and the map's slot.
fn list_bytes(tokens: &[u32]) -> usize {
    tokens.len() * 4 + 64
}

/// The automaton and the most its lists may hold.
impl Footprint for Banner {
    fn footprint(&self) -> usize {
        std::mem::size_of::<Self>() + self.nfa.memory_usage() + BANNED_LISTS_BYTES
    }
}

impl Banner {
    fn new(strings: &[String], case_sensitive: bool) -> Result<Self> {
        let nfa = NFA::builder()
            .match_kind(MatchKind::Standard)
            .ascii_case_insensitive(!case_sensitive)
            .build(strings)
            .map_err(|e| Error::spec("strings", e.to_string()))?;
        Ok(Self {
            nfa,
            banned: Mutex::new(BannedLists::default()),
        })
    }

    fn start(&self) -> StateID {
        self.nfa
            .start_state(Anchored::No)
            .expect("an unanchored search starts")
    }

    /// The state after reading `text` from `state`.
    fn read(&self, state: StateID, text: &[u8]) -> StateID {
        text.iter()
            .fold(state, |s, &byte| self.nfa.next_state(Anchored::No, s, byte))
    }

    /// The tokens whose text would complete a string in `state`, sorted.
    fn banned(&self, state: StateID, env: &Vocab) -> Result<Arc<[u32]>> {
        let lock = || self.banned.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tokens) = lock().by_state.get(&state) {
            return Ok(tokens.clone());
        }
        let mut tokens = vec![];
        for id in 0..env.vocab_size() as u32 {
            let text = env.decoded_text(id)?;
            let completes = text.iter().scan(state, |s, &byte| {
                *s = self.nfa.next_state(Anchored::No, *s, byte);
                Some(self.nfa.is_match(*s))
            });
            if completes.into_iter().any(|m| m) {
                tokens.push(id);
            }
        }
        let tokens: Arc<[u32]> = tokens.into();
        let cost = list_bytes(&tokens);
        let mut lists = lock();
        if lists.bytes + cost > BANNED_LISTS_BYTES {
            lists.by_state.clear();
            lists.bytes = 0;
        }
        if cost <= BANNED_LISTS_BYTES && lists.by_state.insert(state, tokens.clone()).is_none() {
            lists.bytes += cost;
        }
        Ok(tokens)
    }
}

/// `ban_strings`: see [`BanStringsSpec`]. The state is the automaton's after the generated text,
/// advanced by the new ids' texts only (a rescan from `prompt_len` when the ids do not extend
/// those read); a step costs the new text's bytes and one ban per banned token, and the first
/// visit of a state (by any request with these strings) a pass over the vocab's texts.
pub struct BanStrings {
    banner: Arc<Banner>,
    env: Vocab,
    prompt_len: usize,
    state: StateID,
    cursor: Cursor,
    // Before the last plan, for `undo`.
    last: (StateID, Cursor),
}

impl BanStrings {
    fn new(banner: Arc<Banner>, env: Vocab, prompt_len: usize) -> Self {
        let start = banner.start();
        Self {
            banner,
            env,
            prompt_len,
            state: start,
            cursor: Cursor::default(),
            last: (start, Cursor::default()),
        }
    }
}

impl std::fmt::Debug for BanStrings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BanStrings")
            .field("prompt_len", &self.prompt_len)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl LogitsProcessor for BanStrings {
    fn plan(&mut self, ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        let (mut state, from) = if self.cursor.extended_by(ids) {
            (self.state, self.cursor.seen())
        } else {
            (self.banner.start(), 0)
        };
        for i in from.max(self.prompt_len)..ids.token_count() {
            state = self
                .banner
                .read(state, self.env.decoded_text(ids.token_at(i))?);
        }
        let banned = self.banner.banned(state, &self.env)?;
        // Nothing changes until nothing can fail.
        self.last = (self.state, self.cursor);
        self.state = state;
        self.cursor.read_all(ids);
        push_bans(plan, &banned);
        Ok(())
    }

    fn undo(&mut self) {
        (self.state, self.cursor) = self.last;
    }

    fn reset(&mut self) {
        (self.state, self.cursor) = (self.banner.start(), Cursor::default());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::byte_level_vocab;
    use proptest::prelude::*;

    const PIECES: [&str; 8] = ["As", " an", " AI", "I c", "annot", "an", "<|x|>", " a"];

    fn env() -> &'static Vocab {
        static ENV: std::sync::OnceLock<Vocab> = std::sync::OnceLock::new();
        ENV.get_or_init(|| byte_level_vocab(&PIECES))
    }

    fn spec(json: &str) -> BanStringsSpec {
        serde_json::from_str(json).unwrap()
    }

    fn context() -> EngineContext {
        EngineContext {
            vocab: Some(env().clone()),
            ..Default::default()
        }
    }

    fn banned(processor: &mut Box<dyn LogitsProcessor>, ids: &[u32]) -> Vec<u32> {
        let mut row = vec![0.0f32; env().vocab_size()];
        crate::process_row(processor.as_mut(), &ids, &mut row).unwrap();
        (0..row.len() as u32)
            .filter(|&t| row[t as usize] == f32::NEG_INFINITY)
            .collect()
    }

    /// The definition: the tokens whose text, after the generated text, ends a banned string
    /// somewhere inside itself.
    fn by_definition(strings: &[&str], case_sensitive: bool, generated: &[u32]) -> Vec<u32> {
        let fold = |b: &[u8]| -> Vec<u8> {
            if case_sensitive {
                b.to_vec()
            } else {
                b.to_ascii_lowercase()
            }
        };
        let text: Vec<u8> = generated
            .iter()
            .flat_map(|&t| env().decoded_text(t).unwrap().to_vec())
            .collect();
        (0..env().vocab_size() as u32)
            .filter(|&t| {
                let token = env().decoded_text(t).unwrap();
                let whole = fold(&[&text[..], token].concat());
                (text.len() + 1..=whole.len()).any(|end| {
                    strings
                        .iter()
                        .any(|s| whole[..end].ends_with(&fold(s.as_bytes())))
                })
            })
            .collect()
    }

    #[test]
    fn no_strings_is_refused_naming_strings() {
        let spec = BanStringsSpec {
            strings: vec![],
            ..serde_json::from_value(serde_json::json!({"strings": ["x"]})).unwrap()
        };
        let error = spec.check().unwrap_err().to_string();
        assert!(error.contains("strings"), "{error}");
    }

    #[test]
    fn a_string_spelled_over_tokens_is_stopped_at_its_last_token() {
        let mut ban = spec(r#"{"strings": ["As an AI"]}"#)
            .realize(&context(), 1)
            .unwrap();
        let (as_, an, ai) = (256, 257, 258);
        // The prompt (id 7) is not read; "As an" is one token from " AI".
        assert!(!banned(&mut ban, &[7, as_]).contains(&ai));
        let after = banned(&mut ban, &[7, as_, an]);
        assert!(after.contains(&ai), "{after:?}");
        assert!(!after.contains(&an));
        // Byte by byte too: " A" then "I" completes it.
        let spelled: Vec<u32> = [7, as_, an, b' ' as u32, b'A' as u32].to_vec();
        assert!(banned(&mut ban, &spelled).contains(&(b'I' as u32)));
    }

    #[test]
    fn without_the_tokenizer_it_is_refused_naming_strings() {
        let error = spec(r#"{"strings": ["x"]}"#)
            .realize(&EngineContext::default(), 0)
            .unwrap_err();
        assert!(error.to_string().contains("strings"), "{error}");
        let empty = spec(r#"{"strings": ["ok", ""]}"#).check().unwrap_err();
        assert!(empty.to_string().contains("strings[1]"), "{empty}");
    }

    /// 1,024 strings of 256 bytes, `seed` making them differ from another list's.
    fn large_strings(seed: u64) -> Vec<String> {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..1024)
            .map(|_| {
                (0..MAX_STRING_BYTES)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        char::from(b' ' + (x % 95) as u8)
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn the_largest_lists_cost_megabytes_and_the_cache_keeps_its_byte_budget() {
        let env = byte_level_vocab(&PIECES);
        let context = EngineContext {
            vocab: Some(env.clone()),
            ..Default::default()
        };
        let banner = Banner::new(&large_strings(0), true).unwrap();
        let footprint = banner.footprint();
        assert!(footprint < 16 << 20, "{footprint} bytes");
        let mut held = vec![];
        for seed in 0..18 {
            let spec = BanStringsSpec {
                strings: large_strings(seed),
                case_sensitive: true,
            };
            let mut ban = spec.realize(&context, 0).unwrap();
            banned(&mut ban, &[b'a' as u32, b' ' as u32]);
            let (bytes, count) = env.derived_held();
            assert!(bytes <= crate::vocab::DERIVED_CACHE_BYTES, "{bytes} bytes");
            held.push(count);
        }
        // Past the budget, the oldest lists are dropped: fewer kept than admitted.
        let kept = *held.last().unwrap();
        assert!((4..18).contains(&kept), "{held:?}");
        assert!(
            kept as u64 * (footprint as u64) <= crate::vocab::DERIVED_CACHE_BYTES as u64 * 2,
            "{held:?}"
        );
    }

    proptest! {
        #[test]
        fn bans_what_the_definition_bans_as_the_text_grows_and_rewinds(
            ids in prop::collection::vec(prop::sample::select(
                vec![b'a' as u32, b'n' as u32, b' ' as u32, b'I' as u32, b'c' as u32,
                     256, 257, 258, 259, 260, 261, 262, 263]), 0..24),
            rewind in 0usize..6,
            case_sensitive in any::<bool>(),
        ) {
            let strings = ["an AI", "cannot", "nn", "I"];
            let json = serde_json::json!({"strings": strings, "case_sensitive": case_sensitive});
            let mut ban = spec(&json.to_string()).realize(&context(), 0).unwrap();
            for end in 0..=ids.len() {
                prop_assert_eq!(
                    banned(&mut ban, &ids[..end]),
                    by_definition(&strings, case_sensitive, &ids[..end])
                );
            }
            // A rewind (the ids no longer extend those read) rescans.
            let end = ids.len().saturating_sub(rewind);
            prop_assert_eq!(
                banned(&mut ban, &ids[..end]),
                by_definition(&strings, case_sensitive, &ids[..end])
            );
        }
    }
}
