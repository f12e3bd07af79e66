use std::collections::HashMap;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::history::TokenHistory;
use crate::plan::RowPlan;
use crate::processors::cursor::Cursor;
use crate::processors::{push_bans, LogitsProcessor};
use crate::spec::{check_len, KindSpec, SpecContext};

/// `{"kind": "ban_strings", "strings": ["As an AI", "delve"], "case_sensitive": true}`: text that
/// must not be written, across token boundaries: each step bans every token whose text would
/// complete one of `strings` after the text generated so far (the ids from `prompt_len` on; the
/// prompt is not read).
///
/// - `strings` (non-empty texts, at least one);
/// - `case_sensitive` (default true; false folds ASCII letters only).
///
/// Needs the tokenizer's token texts (the engine's context with a tokenizer llguidance reads, as
/// grammars do). The strings make one Aho-Corasick automaton; the generated text's state in it
/// is kept from step to step (a step reads only its new ids), and the tokens each state bans are
/// found by one pass over the vocab the first time the state is reached, then cached: a step
/// after that costs a lookup and the bans. A token that completes a string in the middle of its
/// own text is banned too; special tokens write no text and are never banned.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BanStringsSpec {
    pub strings: Vec<String>,
    #[serde(default = "default_case_sensitive")]
    pub case_sensitive: bool,
}

fn default_case_sensitive() -> bool {
    true
}

impl KindSpec for BanStringsSpec {
    fn check(&self) -> Result<()> {
        check_len("strings", self.strings.len())?;
        if self.strings.is_empty() {
            return Err(Error::argument("strings", "must list at least one string"));
        }
        if let Some(i) = self.strings.iter().position(String::is_empty) {
            return Err(Error::argument(
                format!("strings[{i}]"),
                "must not be empty",
            ));
        }
        Ok(())
    }

    fn realize(
        &self,
        context: &SpecContext,
        prompt_len: usize,
    ) -> Result<Box<dyn LogitsProcessor>> {
        #[cfg(feature = "grammar")]
        let texts = context.grammar.as_ref().map(|g| g.token_texts());
        #[cfg(not(feature = "grammar"))]
        let texts: Option<Result<TokenTexts>> = None;
        let texts = texts.ok_or_else(|| {
            Error::spec(
                "strings",
                "needs the tokenizer's token texts: the engine's context must have a tokenizer \
                 llguidance reads (as grammars do)",
            )
        })??;
        Ok(Box::new(BanStrings::new(
            &self.strings,
            self.case_sensitive,
            Arc::new(texts),
            prompt_len,
        )))
    }

    fn validate(&self, context: &SpecContext) -> Option<Result<()>> {
        #[cfg(feature = "grammar")]
        let has_texts = context.grammar.is_some();
        #[cfg(not(feature = "grammar"))]
        let has_texts = false;
        // Without the token texts, as a grammar without its tokenizer: the structure alone.
        (!has_texts).then(|| self.check())
    }
}

/// Every token's text, as bytes, in one buffer.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TokenTexts {
    bytes: Vec<u8>,
    // Token `t`'s text is `bytes[ends[t - 1]..ends[t]]` (from 0 for the first).
    ends: Vec<u32>,
}

impl TokenTexts {
    /// The texts of tokens `0, 1, ...` in order.
    pub fn new<'a>(texts: impl IntoIterator<Item = &'a [u8]>) -> Self {
        let mut out = Self::default();
        for text in texts {
            out.bytes.extend_from_slice(text);
            out.ends.push(out.bytes.len() as u32);
        }
        out
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Token `t`'s text; empty for a token outside the list.
    pub fn get(&self, t: u32) -> &[u8] {
        let t = t as usize;
        if t >= self.ends.len() {
            return &[];
        }
        let start = if t == 0 { 0 } else { self.ends[t - 1] as usize };
        &self.bytes[start..self.ends[t] as usize]
    }
}

/// The banned strings' Aho-Corasick automaton as a full transition table: `delta[s][b]` is the
/// state after byte `b` from state `s`, and `hit[s]` says a string ends there.
#[derive(Debug)]
struct Automaton {
    delta: Vec<[u32; 256]>,
    hit: Vec<bool>,
    fold: bool,
}

impl Automaton {
    fn new(strings: &[String], case_sensitive: bool) -> Self {
        let fold = !case_sensitive;
        let norm = |b: u8| if fold { b.to_ascii_lowercase() } else { b };
        const NONE: u32 = u32::MAX;
        let mut delta = vec![[NONE; 256]];
        let mut hit = vec![false];
        for s in strings {
            let mut state = 0usize;
            for b in s.bytes().map(norm) {
                if delta[state][b as usize] == NONE {
                    delta.push([NONE; 256]);
                    hit.push(false);
                    delta[state][b as usize] = (delta.len() - 1) as u32;
                }
                state = delta[state][b as usize] as usize;
            }
            hit[state] = true;
        }
        // Breadth first: each state's missing transitions are its failure state's.
        let mut fail = vec![0u32; delta.len()];
        let mut queue = std::collections::VecDeque::new();
        for slot in delta[0].iter_mut() {
            match *slot {
                NONE => *slot = 0,
                child => queue.push_back(child),
            }
        }
        while let Some(state) = queue.pop_front() {
            let state = state as usize;
            // The failure state is shallower: its row is complete already.
            let fail_row = delta[fail[state] as usize];
            for (slot, &through_fail) in delta[state].iter_mut().zip(fail_row.iter()) {
                if *slot == NONE {
                    *slot = through_fail;
                } else {
                    let child = *slot as usize;
                    fail[child] = through_fail;
                    if hit[through_fail as usize] {
                        hit[child] = true;
                    }
                    queue.push_back(*slot);
                }
            }
        }
        Self { delta, hit, fold }
    }

    /// The state after `text` from `state`, and whether a string ended on the way.
    #[inline]
    fn walk(&self, mut state: u32, text: &[u8]) -> (u32, bool) {
        let mut hit = false;
        for &b in text {
            let b = if self.fold { b.to_ascii_lowercase() } else { b };
            state = self.delta[state as usize][b as usize];
            hit |= self.hit[state as usize];
        }
        (state, hit)
    }
}

/// Banned strings: see [`BanStringsSpec`].
#[derive(Debug, Clone)]
pub struct BanStrings {
    automaton: Arc<Automaton>,
    texts: Arc<TokenTexts>,
    prompt_len: usize,
    // The generated ids read and the automaton's state after their text.
    cursor: Cursor,
    state: u32,
    // The tokens each state bans, found once.
    banned: HashMap<u32, Arc<Vec<u32>>>,
    before: (Cursor, u32),
}

impl BanStrings {
    /// `strings` (not empty) banned over the token texts `texts`; generated ids start at
    /// `prompt_len`.
    pub fn new(
        strings: &[String],
        case_sensitive: bool,
        texts: Arc<TokenTexts>,
        prompt_len: usize,
    ) -> Self {
        Self {
            automaton: Arc::new(Automaton::new(strings, case_sensitive)),
            texts,
            prompt_len,
            cursor: Cursor::default(),
            state: 0,
            banned: HashMap::new(),
            before: (Cursor::default(), 0),
        }
    }

    fn banned_at(&mut self, state: u32) -> Arc<Vec<u32>> {
        let (automaton, texts) = (&self.automaton, &self.texts);
        self.banned
            .entry(state)
            .or_insert_with(|| {
                Arc::new(
                    (0..texts.len() as u32)
                        .filter(|&t| automaton.walk(state, texts.get(t)).1)
                        .collect(),
                )
            })
            .clone()
    }
}

impl LogitsProcessor for BanStrings {
    fn plan(&mut self, ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        self.before = (self.cursor, self.state);
        let from = if self.cursor.extended_by(ids) && self.cursor.seen() >= self.prompt_len {
            self.cursor.seen()
        } else {
            self.state = 0;
            self.prompt_len.min(ids.token_count())
        };
        for i in from..ids.token_count() {
            self.state = self
                .automaton
                .walk(self.state, self.texts.get(ids.token_at(i)))
                .0;
        }
        self.cursor.read_all(ids);
        let banned = self.banned_at(self.state);
        push_bans(plan, &banned);
        Ok(())
    }

    fn undo(&mut self) {
        (self.cursor, self.state) = self.before;
    }

    fn max_token_id(&self) -> Option<u32> {
        self.texts.len().checked_sub(1).map(|t| t as u32)
    }

    fn reset(&mut self) {
        self.cursor = Cursor::default();
        self.state = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process_row;

    fn texts(words: &[&str]) -> Arc<TokenTexts> {
        Arc::new(TokenTexts::new(words.iter().map(|w| w.as_bytes())))
    }

    fn banned(p: &mut BanStrings, ids: &[u32], vocab: usize) -> Vec<usize> {
        let mut row = vec![0.0f32; vocab];
        process_row(p, &ids, &mut row).unwrap();
        (0..vocab)
            .filter(|&i| row[i] == f32::NEG_INFINITY)
            .collect()
    }

    #[test]
    fn bans_the_tokens_that_complete_a_string_across_token_boundaries() {
        // 0 "del", 1 "ve", 2 "delve", 3 "v", 4 "e", 5 " ", 6 "lved", 7 "" (special)
        let vocab = ["del", "ve", "delve", "v", "e", " ", "lved", ""];
        let mut p = BanStrings::new(&["delve".into()], true, texts(&vocab), 1);
        assert_eq!(banned(&mut p, &[5], 8), [2]);
        assert_eq!(banned(&mut p, &[5, 0], 8), [1, 2]);
        assert_eq!(banned(&mut p, &[5, 0, 3], 8), [2, 4]);
        // "de" + "lved": the string ends inside the token.
        let mut p = BanStrings::new(&["delve".into()], true, texts(&["de", "lved"]), 0);
        assert_eq!(banned(&mut p, &[0], 2), [1]);
    }

    #[test]
    fn folds_ascii_case_when_asked_and_reads_only_generated_text() {
        let vocab = ["AS AN", " AI", "as an", "x"];
        let mut p = BanStrings::new(&["as an ai".into()], false, texts(&vocab), 1);
        // The prompt ("as an") is not read.
        assert_eq!(banned(&mut p, &[2], 4), Vec::<usize>::new());
        assert_eq!(banned(&mut p, &[2, 0], 4), [1]);
        let mut exact = BanStrings::new(&["as an ai".into()], true, texts(&vocab), 0);
        assert_eq!(banned(&mut exact, &[0], 4), Vec::<usize>::new());
    }

    #[test]
    fn a_rewind_rereads_and_an_undo_takes_the_step_back() {
        let vocab = ["a", "b", "c"];
        let mut p = BanStrings::new(&["abc".into()], true, texts(&vocab), 0);
        assert_eq!(banned(&mut p, &[0, 1], 3), [2]);
        assert_eq!(banned(&mut p, &[1], 3), Vec::<usize>::new());
        p.plan(&[1u32, 0], &mut RowPlan::new()).unwrap();
        p.undo();
        assert_eq!(banned(&mut p, &[1, 0, 1], 3), [2]);
    }
}
