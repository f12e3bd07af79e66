use std::collections::HashMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::history::TokenHistory;
use crate::plan::RowPlan;
use crate::processors::counts::{merged, BULK};
use crate::processors::cursor::Cursor;
use crate::processors::repetition_penalty::vocab_limit;
use crate::processors::{push_bans, LogitsProcessor};
use crate::spec::{EngineContext, KindSpec};

/// `{"kind": "no_repeat_ngram", "n": 3}`: `n` at least 1.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoRepeatNGramSpec {
    #[schemars(range(min = 1))]
    pub n: u32,
}

impl KindSpec for NoRepeatNGramSpec {
    fn check(&self) -> Result<()> {
        NoRepeatNGram::new(self.n as usize, None).map(drop)
    }

    fn realize(&self, context: &EngineContext, _: usize) -> Result<Box<dyn LogitsProcessor>> {
        Ok(Box::new(NoRepeatNGram::new(
            self.n as usize,
            context.vocab_size,
        )?))
    }
}

/// transformers' `NoRepeatNGramLogitsProcessor`: bans every token that would complete an n-gram
/// already present in the ids (the prompt included, as transformers does for decoder-only
/// models). With fewer than `n` ids nothing is banned; `n = 1` bans every id seen.
///
/// Keeps an index from each `(n-1)`-gram of the ids to the tokens that followed it, updated with
/// the new ids only (a rolling hash, each hit checked against a copy of the ids, so collisions
/// never ban a wrong token). A step costs `O(n)` plus one ban per token banned, whatever the
/// history's length; the index holds one entry per distinct `(n-1)`-gram and a copy of the ids.
/// Ids outside the vocab (when it is known at admission) are never banned, as in transformers.
///
/// ```
/// use logits_processing::{process_row, processors::NoRepeatNGram};
/// let mut ngram = NoRepeatNGram::new(2, None)?;
/// let mut row = [0.0f32; 4];
/// process_row(&mut ngram, &[1u32, 2, 3, 1], &mut row)?; // "1 2" was seen: 2 may not follow 1
/// assert_eq!(row, [0.0, 0.0, f32::NEG_INFINITY, 0.0]);
/// # Ok::<(), logits_processing::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct NoRepeatNGram {
    n: usize,
    limit: u32,
    index: Index,
    cursor: Cursor,
    // For `undo`: the cursor and length before the last plan, what it added, or (when it
    // rescanned) the index before it.
    last_cursor: Cursor,
    log: Vec<Added>,
    before: Option<Box<Index>>,
    banned: Vec<u32>,
}

/// The index of `(n-1)`-grams.
#[derive(Debug, Clone, PartialEq, Default)]
struct Index {
    // The ids read (the grams are slices of it).
    ids: Vec<u32>,
    // The hash of the last n-1 ids read.
    rolling: u64,
    // From a gram's hash to its latest entry; entries of the same hash chain through `same`.
    by_hash: HashMap<u64, u32>,
    entries: Vec<Entry>,
}

#[derive(Debug, Clone, PartialEq)]
struct Entry {
    // Where one occurrence of the gram starts in `ids`.
    at: usize,
    hash: u64,
    same: Option<u32>,
    // The tokens that followed the gram and how often, by token.
    next: Vec<(u32, u32)>,
}

/// One window added by a step: its entry, the token counted, and whether the entry is new.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Added {
    entry: u32,
    token: Option<u32>,
    created: bool,
    rolling: u64,
}

/// The multiplier of the polynomial rolling hash (odd, so powers never vanish mod 2^64).
const BASE: u64 = 0x9e37_79b9_7f4a_7c15;

impl NoRepeatNGram {
    pub fn new(n: usize, vocab_size: Option<usize>) -> Result<Self> {
        if n == 0 {
            return Err(Error::argument("n", "must be at least 1"));
        }
        Ok(Self {
            n,
            limit: vocab_limit(vocab_size),
            index: Index::default(),
            cursor: Cursor::default(),
            last_cursor: Cursor::default(),
            log: vec![],
            before: None,
            banned: vec![],
        })
    }

    pub fn n(&self) -> usize {
        self.n
    }

    /// The tokens banned after `ids` (sorted), the index brought up to them.
    pub fn banned(&mut self, ids: &dyn TokenHistory) -> &[u32] {
        self.update(ids);
        self.banned.clear();
        if ids.token_count() >= self.n {
            let m = self.n - 1;
            let len = self.index.ids.len();
            if let Some(entry) = self.index.find(self.index.rolling, len - m, m) {
                let next = &self.index.entries[entry as usize].next;
                self.banned.extend(
                    next.iter()
                        .map(|&(token, _)| token)
                        .filter(|&t| t < self.limit),
                );
            }
        }
        &self.banned
    }

    fn update(&mut self, ids: &dyn TokenHistory) {
        self.last_cursor = self.cursor;
        self.log.clear();
        self.before = None;
        if !self.cursor.extended_by(ids) {
            self.before = Some(Box::new(std::mem::take(&mut self.index)));
        }
        // Many new ids (a prompt): the tokens that follow each gram are sorted and merged in
        // after, so the cost does not depend on their order (inserted one by one, a gram
        // followed by a whole vocab in descending order moves O(vocab²) words); `undo` then
        // restores the index as it was.
        let bulk = ids.token_count().saturating_sub(self.index.ids.len()) > BULK;
        if bulk && self.before.is_none() {
            self.before = Some(Box::new(self.index.clone()));
        }
        let mut pending: Vec<(u32, u32)> = vec![];
        let m = self.n - 1;
        let high = BASE.wrapping_pow(m.saturating_sub(1) as u32);
        for i in self.index.ids.len()..ids.token_count() {
            let token = ids.token_at(i);
            let index = &mut self.index;
            let rolling = index.rolling;
            if i >= m {
                // The window ending at `i`: the gram of the m ids before it, then `token`.
                let (entry, created) = index.entry(rolling, i - m, m);
                if bulk {
                    pending.push((entry, token));
                } else {
                    index.add(entry, token);
                }
                if self.before.is_none() {
                    self.log.push(Added {
                        entry,
                        token: Some(token),
                        created,
                        rolling,
                    });
                }
            } else if self.before.is_none() {
                self.log.push(Added {
                    entry: u32::MAX,
                    token: None,
                    created: false,
                    rolling,
                });
            }
            index.ids.push(token);
            if m > 0 {
                // Drop the id leaving the gram, bring in the new one.
                let leaving = if i >= m {
                    index.ids[i - m] as u64 + 1
                } else {
                    0
                };
                let kept = index.rolling.wrapping_sub(leaving.wrapping_mul(high));
                index.rolling = kept.wrapping_mul(BASE).wrapping_add(token as u64 + 1);
            }
        }
        if bulk {
            pending.sort_unstable();
            for group in pending.chunk_by(|a, b| a.0 == b.0) {
                let next = &mut self.index.entries[group[0].0 as usize].next;
                *next = merged(next, group.iter().map(|&(_, token)| token).collect());
            }
        }
        self.cursor.read_all(ids);
    }
}

impl Index {
    /// The entry of the gram `ids[at..at + m]` of hash `hash`, if there is one.
    fn find(&self, hash: u64, at: usize, m: usize) -> Option<u32> {
        let gram = &self.ids[at..at + m];
        let mut candidate = self.by_hash.get(&hash).copied();
        while let Some(e) = candidate {
            let entry = &self.entries[e as usize];
            if self.ids[entry.at..entry.at + m] == *gram {
                return Some(e);
            }
            candidate = entry.same;
        }
        None
    }

    /// The entry of the gram `ids[at..at + m]`, made if new.
    fn entry(&mut self, hash: u64, at: usize, m: usize) -> (u32, bool) {
        if let Some(e) = self.find(hash, at, m) {
            return (e, false);
        }
        let e = self.entries.len() as u32;
        let same = self.by_hash.insert(hash, e);
        self.entries.push(Entry {
            at,
            hash,
            same,
            next: vec![],
        });
        (e, true)
    }

    fn add(&mut self, entry: u32, token: u32) {
        let next = &mut self.entries[entry as usize].next;
        match next.binary_search_by_key(&token, |&(t, _)| t) {
            Ok(at) => next[at].1 += 1,
            Err(at) => next.insert(at, (token, 1)),
        }
    }

    /// Takes back one [`Added`] (the latest not yet taken back).
    fn take_back(&mut self, added: Added) {
        self.ids.pop();
        self.rolling = added.rolling;
        let Some(token) = added.token else {
            return;
        };
        let entry = &mut self.entries[added.entry as usize];
        if let Ok(at) = entry.next.binary_search_by_key(&token, |&(t, _)| t) {
            entry.next[at].1 -= 1;
            if entry.next[at].1 == 0 {
                entry.next.remove(at);
            }
        }
        if added.created {
            // The newest entry: unlink it from its hash's chain.
            let entry = self.entries.pop().expect("the created entry is the last");
            match entry.same {
                Some(previous) => self.by_hash.insert(entry.hash, previous),
                None => self.by_hash.remove(&entry.hash),
            };
        }
    }
}

impl LogitsProcessor for NoRepeatNGram {
    fn plan(&mut self, ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        self.banned(ids);
        push_bans(plan, &self.banned);
        Ok(())
    }

    fn undo(&mut self) {
        match self.before.take() {
            Some(index) => self.index = *index,
            None => {
                while let Some(added) = self.log.pop() {
                    self.index.take_back(added);
                }
            }
        }
        self.log.clear();
        self.cursor = self.last_cursor;
    }

    fn reset(&mut self) {
        self.index = Index::default();
        self.cursor = Cursor::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A prompt holding every id of a large vocab once (all following the one empty gram at
    /// n = 1) costs the same in any order.
    #[test]
    fn the_cost_of_a_prompt_does_not_depend_on_the_order_of_its_ids() {
        crate::processors::counts::assert_order_independent(|ids, vocab| {
            let mut ngram = NoRepeatNGram::new(1, Some(vocab as usize)).unwrap();
            ngram.banned(&ids).len()
        });
        // Merged in bulk, then stepped one id at a time, and taken back: the rule's answer.
        let ids: Vec<u32> = (0..600u32).map(|i| (i * 7 + i / 13) % 11).collect();
        for n in 1..4 {
            let mut ngram = NoRepeatNGram::new(n, None).unwrap();
            assert_eq!(ngram.banned(&&ids[..500]), reference(n, &ids[..500]), "{n}");
            for len in 501..=ids.len() {
                assert_eq!(
                    ngram.banned(&&ids[..len]),
                    reference(n, &ids[..len]),
                    "{n} {len}"
                );
            }
            ngram.banned(&ids.repeat(2));
            let mut plan = RowPlan::new();
            ngram.undo();
            ngram.plan(&&ids[..], &mut plan).unwrap();
            assert_eq!(ngram.banned, reference(n, &ids), "{n} after undo");
        }
    }

    /// transformers' rule, as written there: every window of `n` ids whose first `n - 1` equal
    /// the last `n - 1` ids bans its last id.
    fn reference(n: usize, ids: &[u32]) -> Vec<u32> {
        let len = ids.len();
        if len < n {
            return vec![];
        }
        let prefix = &ids[len + 1 - n..];
        let mut banned: Vec<u32> = ids
            .windows(n)
            .filter(|w| w[..n - 1] == *prefix)
            .map(|w| w[n - 1])
            .collect();
        banned.sort_unstable();
        banned.dedup();
        banned
    }

    #[test]
    fn bans_what_completes_a_seen_ngram() {
        let mut ngram = NoRepeatNGram::new(3, None).unwrap();
        assert_eq!(ngram.banned(&[5u32, 6, 7, 5]), [] as [u32; 0]);
        assert_eq!(ngram.banned(&[5u32, 6, 7, 5, 6]), [7]);
        let mut unigram = NoRepeatNGram::new(1, None).unwrap();
        assert_eq!(unigram.banned(&[4u32, 2, 4]), [2, 4]);
    }

    proptest! {
        /// Fed growing, rewound and replaced histories, with undos between, the index bans what
        /// transformers' rule bans.
        #[test]
        fn incremental_equals_the_rule(
            n in 1usize..5,
            steps in proptest::collection::vec(
                (0usize..6, proptest::collection::vec(0u32..4, 0..5)), 1..40),
        ) {
            let mut ngram = NoRepeatNGram::new(n, None).unwrap();
            let mut ids: Vec<u32> = vec![];
            for (action, chunk) in steps {
                match action {
                    0..=2 => ids.extend(chunk),
                    3 => ids.truncate(ids.len().saturating_sub(chunk.len())),
                    4 => {
                        // A plan taken back leaves the index as it was.
                        let before = (ngram.index.clone(), ngram.cursor);
                        let mut plan = RowPlan::new();
                        let mut other = ids.clone();
                        other.extend(&chunk);
                        ngram.plan(&other, &mut plan).unwrap();
                        ngram.undo();
                        prop_assert_eq!(&(ngram.index.clone(), ngram.cursor), &before);
                        ids.extend(chunk);
                    }
                    _ => ids = chunk,
                }
                prop_assert_eq!(ngram.banned(&ids).to_vec(), reference(n, &ids), "{:?}", ids);
            }
        }
    }
}
