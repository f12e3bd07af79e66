//! Per-request token counts over a range of positions, updated from the new ids only: the state
//! of the repetition, frequency and presence penalties.

use crate::history::TokenHistory;
use crate::processors::cursor::Cursor;

/// How many times each token occurs at positions `from..to` of the ids read so far (only the last
/// `window` of those positions when a window is set: llama.cpp's `penalty_last_n`), as a list
/// sorted by token (the order a plan's sparse edits are cheapest in). Ids at or above `limit`
/// (outside the vocab) are not counted: they cannot be generated, and transformers drops them too.
///
/// Each [`TokenCounts::update`] reads only the ids new since the last one, unless they do not
/// extend the ids read (see [`Cursor`]), and then it recounts them all. A few new ids (a decode
/// step's) are each inserted into the sorted list (`O(log distinct)`, plus a move of
/// `O(distinct)` words for a new distinct token: a few microseconds at 30,000 distinct tokens),
/// and as much per id that leaves the window; more than [`BULK`] (a prompt) are sorted and
/// merged in, `O(new log new + distinct)`, so that the cost does not depend on the order of the
/// ids (inserting a whole vocab's ids one by one in descending order would move `O(distinct²)`
/// words).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TokenCounts {
    from: usize,
    to: usize,
    limit: u32,
    window: Option<usize>,
    counts: Vec<(u32, u32)>,
    cursor: Cursor,
    // For `undo`: the cursor before the last update, the ids it counted and those that left the
    // window, or (when it recounted) the counts before it.
    last_cursor: Cursor,
    added: Vec<u32>,
    removed: Vec<u32>,
    before: Option<Vec<(u32, u32)>>,
}

impl TokenCounts {
    pub fn new(from: usize, to: usize, limit: u32) -> Self {
        Self {
            from,
            to,
            limit,
            window: None,
            counts: vec![],
            cursor: Cursor::default(),
            last_cursor: Cursor::default(),
            added: vec![],
            removed: vec![],
            before: None,
        }
    }

    /// Counts only the last `window` positions of `from..to` (all of them when `None`).
    pub fn with_window(mut self, window: Option<usize>) -> Self {
        self.window = window;
        self
    }

    /// The first position counted when the ids end at `end`.
    fn start(&self, end: usize) -> usize {
        match self.window {
            Some(window) => self.from.max(end.saturating_sub(window)),
            None => self.from,
        }
    }

    /// `(token, count)` for every token counted, by token.
    pub fn counts(&self) -> &[(u32, u32)] {
        &self.counts
    }

    /// Brings the counts up to `ids`.
    pub fn update(&mut self, ids: &dyn TokenHistory) {
        self.last_cursor = self.cursor;
        self.added.clear();
        self.removed.clear();
        self.before = None;
        let end = ids.token_count().min(self.to);
        let extended = self.cursor.extended_by(ids);
        let previous_end = self.cursor.seen().min(self.to);
        let first_new = previous_end.max(self.start(end));
        if extended && end.saturating_sub(first_new) <= BULK {
            for i in first_new..end {
                let token = ids.token_at(i);
                if token < self.limit {
                    self.add(token);
                    self.added.push(token);
                }
            }
            // Positions that left the window (never those just skipped above).
            for i in self.start(previous_end)..self.start(end).min(previous_end) {
                let token = ids.token_at(i);
                if token < self.limit {
                    self.remove(token);
                    self.removed.push(token);
                }
            }
        } else {
            // Merged into what was counted when the window kept all of it, else recounted.
            let keeps_all = extended && self.start(end) <= self.start(previous_end);
            let from = if keeps_all {
                first_new
            } else {
                self.start(end).min(end)
            };
            let tokens: Vec<u32> = (from..end)
                .map(|i| ids.token_at(i))
                .filter(|&t| t < self.limit)
                .collect();
            let base: &[(u32, u32)] = if keeps_all { &self.counts } else { &[] };
            let counts = merged(base, tokens);
            self.before = Some(std::mem::replace(&mut self.counts, counts));
        }
        self.cursor.read_all(ids);
    }

    /// Takes back the last [`TokenCounts::update`].
    pub fn undo(&mut self) {
        match self.before.take() {
            Some(counts) => self.counts = counts,
            None => {
                while let Some(token) = self.removed.pop() {
                    self.add(token);
                }
                while let Some(token) = self.added.pop() {
                    self.remove(token);
                }
            }
        }
        self.added.clear();
        self.removed.clear();
        self.cursor = self.last_cursor;
    }

    pub fn reset(&mut self) {
        *self = Self::new(self.from, self.to, self.limit).with_window(self.window);
    }

    fn add(&mut self, token: u32) {
        match self.counts.binary_search_by_key(&token, |&(t, _)| t) {
            Ok(at) => self.counts[at].1 += 1,
            Err(at) => self.counts.insert(at, (token, 1)),
        }
    }

    fn remove(&mut self, token: u32) {
        if let Ok(at) = self.counts.binary_search_by_key(&token, |&(t, _)| t) {
            self.counts[at].1 -= 1;
            if self.counts[at].1 == 0 {
                self.counts.remove(at);
            }
        }
    }
}

/// New ids past which an update sorts and merges them rather than inserting each.
pub(crate) const BULK: usize = 64;

/// `counts` (sorted by token) with `tokens` counted in.
pub(crate) fn merged(counts: &[(u32, u32)], mut tokens: Vec<u32>) -> Vec<(u32, u32)> {
    tokens.sort_unstable();
    let mut fresh: Vec<(u32, u32)> = Vec::new();
    for token in tokens {
        match fresh.last_mut() {
            Some((last, count)) if *last == token => *count += 1,
            _ => fresh.push((token, 1)),
        }
    }
    if counts.is_empty() {
        return fresh;
    }
    let mut out = Vec::with_capacity(counts.len() + fresh.len());
    let (mut a, mut b) = (counts.iter().peekable(), fresh.into_iter().peekable());
    loop {
        match (a.peek(), b.peek()) {
            (Some(&&(ta, ca)), Some(&(tb, cb))) => {
                if ta < tb {
                    out.push((ta, ca));
                    a.next();
                } else if tb < ta {
                    out.push((tb, cb));
                    b.next();
                } else {
                    out.push((ta, ca + cb));
                    a.next();
                    b.next();
                }
            }
            (Some(_), None) => out.extend(a.by_ref().copied()),
            (None, Some(_)) => out.extend(b.by_ref()),
            (None, None) => return out,
        }
    }
}

/// Checks that `read(ids, vocab)` (which reads a prompt holding every id of a 151,936 vocab once
/// and says how many distinct ids it holds) takes about as long with the ids in descending order
/// as in ascending order, the best of three runs each.
#[cfg(test)]
pub(crate) fn assert_order_independent(read: impl Fn(&[u32], u32) -> usize) {
    let vocab = 151_936u32;
    let ascending: Vec<u32> = (0..vocab).collect();
    let descending: Vec<u32> = (0..vocab).rev().collect();
    let best_of_3 = |ids: &[u32]| {
        (0..3)
            .map(|_| {
                let start = std::time::Instant::now();
                let distinct = read(ids, vocab);
                let took = start.elapsed();
                assert_eq!(distinct, vocab as usize);
                took
            })
            .min()
            .unwrap()
    };
    let (up, down) = (best_of_3(&ascending), best_of_3(&descending));
    assert!(
        down < up * 5 + std::time::Duration::from_millis(20),
        "ascending {up:?}, descending {down:?}"
    );
}

/// A penalty's `window` field (llama.cpp's `penalty_last_n`): absent or -1, every id in scope; 0,
/// none; `n > 0`, the last `n` ids in scope.
pub(crate) fn window_of(window: Option<i64>) -> crate::Result<Option<usize>> {
    match window {
        None | Some(-1) => Ok(None),
        Some(n) if n >= 0 => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
        Some(n) => Err(crate::Error::argument(
            "window",
            format!("must be -1 (every id), 0 (none) or a count of ids, got {n}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cost_of_a_prompt_does_not_depend_on_the_order_of_its_ids() {
        assert_order_independent(|ids, vocab| {
            let mut counts = TokenCounts::new(0, usize::MAX, vocab);
            counts.update(&ids);
            counts.counts().len()
        });
    }

    #[test]
    fn a_bulk_update_merges_into_what_was_counted_and_is_taken_back() {
        let first: Vec<u32> = (0..10).collect();
        let mut counts = TokenCounts::new(0, usize::MAX, 1_000);
        counts.update(&&first[..]);
        let more: Vec<u32> = first
            .iter()
            .copied()
            .chain((0..200).map(|i| (i * 37 % 300) as u32))
            .collect();
        counts.update(&&more[..]);
        assert_eq!(counts.counts(), counted_below(&more, 1_000));
        counts.undo();
        assert_eq!(counts.counts(), counted_below(&first, 1_000));
    }

    fn counted_below(ids: &[u32], limit: u32) -> Vec<(u32, u32)> {
        let mut counts = std::collections::BTreeMap::new();
        for &id in ids.iter().filter(|&&id| id < limit) {
            *counts.entry(id).or_insert(0) += 1;
        }
        counts.into_iter().collect()
    }

    fn counted(ids: &[u32], from: usize, to: usize) -> Vec<(u32, u32)> {
        let mut counts = std::collections::BTreeMap::new();
        for &id in ids.iter().take(to).skip(from) {
            if id < 10 {
                *counts.entry(id).or_insert(0) += 1;
            }
        }
        counts.into_iter().collect()
    }

    #[test]
    fn incremental_undo_and_rescan_agree_with_a_count_from_scratch() {
        let ids: Vec<u32> = (0..60).map(|i| (i * 7 % 13) as u32).collect();
        let mut counts = TokenCounts::new(3, 40, 10);
        for len in 0..=ids.len() {
            counts.update(&&ids[..len]);
            if len % 5 == 0 {
                counts.undo();
                counts.update(&&ids[..len]);
            }
            assert_eq!(counts.counts(), counted(&ids[..len], 3, 40), "{len}");
        }
        // An update taken back leaves the state as it was, whether it extended or rescanned.
        for other in [&ids[..], &ids[..20], &[1u32, 2][..]] {
            let before = (counts.counts.clone(), counts.cursor);
            counts.update(&[other, &[4, 4, 5]].concat());
            counts.undo();
            assert_eq!((counts.counts.clone(), counts.cursor), before);
        }
        counts.update(&&ids[..20]); // a rollback: recounted
        assert_eq!(counts.counts(), counted(&ids[..20], 3, 40));
        counts.undo();
        assert_eq!(counts.counts(), counted(&ids, 3, 40));
    }
}

#[cfg(test)]
mod window_tests {
    use super::*;
    use proptest::prelude::*;

    fn counted(ids: &[u32], from: usize, to: usize, window: Option<usize>) -> Vec<(u32, u32)> {
        let end = ids.len().min(to);
        let start = window.map_or(from, |w| from.max(end.saturating_sub(w)));
        let mut counts = std::collections::BTreeMap::new();
        for &id in ids.iter().take(end).skip(start) {
            if id < 10 {
                *counts.entry(id).or_insert(0u32) += 1;
            }
        }
        counts.into_iter().collect()
    }

    proptest! {
        /// Growing histories (several ids a step, some steps undone, some rolled back) with a
        /// window: the counts are always those of the last `window` positions in scope.
        #[test]
        fn windowed_counts_equal_a_count_of_the_window(
            steps in proptest::collection::vec((proptest::collection::vec(0u32..12, 0..5), 0u8..10), 1..40),
            from in 0usize..6,
            to in prop_oneof![Just(usize::MAX), 3usize..40],
            window in prop_oneof![Just(None), (0usize..9).prop_map(Some)],
        ) {
            let mut counts = TokenCounts::new(from, to, 10).with_window(window);
            let mut ids: Vec<u32> = vec![];
            for (new, what) in steps {
                match what {
                    0 => {
                        let before = counts.counts.clone();
                        counts.update(&[&ids[..], &new[..]].concat());
                        counts.undo();
                        prop_assert_eq!(&counts.counts, &before);
                    }
                    1 => ids.truncate(ids.len().saturating_sub(2)),
                    _ => ids.extend(new),
                }
                counts.update(&ids);
                prop_assert_eq!(counts.counts(), counted(&ids, from, to, window));
            }
        }
    }
}
