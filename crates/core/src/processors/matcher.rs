//! Which token sequences are one token from complete at the end of a request's ids: the state
//! of `bad_words` and `sequence_bias`, advanced by the new ids only.

use std::collections::HashMap;
use std::sync::Arc;

use crate::history::TokenHistory;
use crate::processors::cursor::Cursor;

const ROOT: u32 = 0;
const NONE: u32 = u32::MAX;

/// An Aho-Corasick automaton over the sequences' prefixes (each sequence but its last token).
/// Its state after a list of ids is the longest suffix of the ids that is a prefix of some
/// sequence; every prefix that ends the ids is on that state's chain of failure links, so the
/// sequences one token from complete are found without looking back at the ids.
#[derive(Debug, PartialEq)]
pub(crate) struct Automaton {
    children: HashMap<(u32, u32), u32>,
    fail: Vec<u32>,
    // The sequences whose prefix is exactly this node, by index.
    ends: Vec<Vec<u32>>,
    // The nearest node down the failure chain (itself excluded, the root excluded) with ends.
    next_end: Vec<u32>,
}

impl Automaton {
    /// The automaton of the prefixes of `sequences` (each at least one token long). Sequences of
    /// one token have the empty prefix: they end at the root, which every state reaches.
    pub fn new(sequences: &[Vec<u32>]) -> Self {
        let mut children = HashMap::new();
        let mut ends: Vec<Vec<u32>> = vec![vec![]];
        for (s, sequence) in sequences.iter().enumerate() {
            let mut node = ROOT;
            for &token in &sequence[..sequence.len() - 1] {
                node = *children.entry((node, token)).or_insert_with(|| {
                    ends.push(vec![]);
                    ends.len() as u32 - 1
                });
            }
            ends[node as usize].push(s as u32);
        }
        let nodes = ends.len();
        let mut by_parent: Vec<Vec<(u32, u32)>> = vec![vec![]; nodes];
        for (&(parent, token), &child) in &children {
            by_parent[parent as usize].push((token, child));
        }
        // Breadth first, so a node's failure link is set before its children need it.
        let mut fail = vec![ROOT; nodes];
        let mut next_end = vec![NONE; nodes];
        let mut queue = std::collections::VecDeque::from([ROOT]);
        while let Some(node) = queue.pop_front() {
            for &(token, child) in &by_parent[node as usize] {
                if node != ROOT {
                    let mut f = fail[node as usize];
                    fail[child as usize] = loop {
                        if let Some(&c) = children.get(&(f, token)) {
                            break c;
                        }
                        if f == ROOT {
                            break ROOT;
                        }
                        f = fail[f as usize];
                    };
                }
                let f = fail[child as usize];
                next_end[child as usize] = if f != ROOT && !ends[f as usize].is_empty() {
                    f
                } else {
                    next_end[f as usize]
                };
                queue.push_back(child);
            }
        }
        Self {
            children,
            fail,
            ends,
            next_end,
        }
    }

    /// The state after `state` reads `token`.
    fn step(&self, mut state: u32, token: u32) -> u32 {
        loop {
            if let Some(&child) = self.children.get(&(state, token)) {
                return child;
            }
            if state == ROOT {
                return ROOT;
            }
            state = self.fail[state as usize];
        }
    }

    /// The sequences (by index) of one token that always apply.
    pub fn always(&self) -> &[u32] {
        &self.ends[ROOT as usize]
    }

    /// The sequences of two tokens or more whose prefix ends the ids, in `state`.
    pub fn completing(&self, state: u32) -> impl Iterator<Item = u32> + '_ {
        let first = if state != ROOT && !self.ends[state as usize].is_empty() {
            state
        } else {
            self.next_end[state as usize]
        };
        std::iter::successors((first != NONE).then_some(first), |&node| {
            let next = self.next_end[node as usize];
            (next != NONE).then_some(next)
        })
        .flat_map(|node| self.ends[node as usize].iter().copied())
    }
}

/// A request's place in an [`Automaton`], advanced by the new ids only (a full rescan when the
/// ids do not extend the previous call's, see [`Cursor`]). Each id costs amortized `O(1)`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Matcher {
    automaton: Arc<Automaton>,
    state: u32,
    cursor: Cursor,
    // Before the last update, for `undo`.
    last: (u32, Cursor),
}

impl Matcher {
    pub fn new(automaton: Arc<Automaton>) -> Self {
        Self {
            automaton,
            state: ROOT,
            cursor: Cursor::default(),
            last: (ROOT, Cursor::default()),
        }
    }

    pub fn automaton(&self) -> &Automaton {
        &self.automaton
    }

    /// Brings the state up to `ids`; returns it.
    pub fn update(&mut self, ids: &dyn TokenHistory) -> u32 {
        self.last = (self.state, self.cursor);
        let from = if self.cursor.extended_by(ids) {
            self.cursor.seen()
        } else {
            self.state = ROOT;
            0
        };
        for i in from..ids.token_count() {
            self.state = self.automaton.step(self.state, ids.token_at(i));
        }
        self.cursor.read_all(ids);
        self.state
    }

    pub fn undo(&mut self) {
        (self.state, self.cursor) = self.last;
    }

    pub fn reset(&mut self) {
        self.state = ROOT;
        self.cursor = Cursor::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The sequences whose prefix (all but the last token) ends `ids`, by brute force.
    fn completing(sequences: &[Vec<u32>], ids: &[u32]) -> Vec<u32> {
        (0..sequences.len() as u32)
            .filter(|&s| {
                let prefix = &sequences[s as usize][..sequences[s as usize].len() - 1];
                !prefix.is_empty() && ids.ends_with(prefix)
            })
            .collect()
    }

    proptest! {
        #[test]
        fn finds_every_prefix_that_ends_the_ids(
            sequences in proptest::collection::vec(
                proptest::collection::vec(0u32..3, 1..5), 1..8),
            steps in proptest::collection::vec(
                (0usize..5, proptest::collection::vec(0u32..3, 0..4)), 1..30),
        ) {
            let automaton = Arc::new(Automaton::new(&sequences));
            let always: Vec<u32> = (0..sequences.len() as u32)
                .filter(|&s| sequences[s as usize].len() == 1)
                .collect();
            prop_assert_eq!(automaton.always(), &always[..]);
            let mut matcher = Matcher::new(automaton.clone());
            let mut ids: Vec<u32> = vec![];
            for (action, chunk) in steps {
                match action {
                    0..=2 => ids.extend(chunk),
                    3 => {
                        let before = (matcher.state, matcher.cursor);
                        matcher.update(&[&ids[..], &chunk].concat());
                        matcher.undo();
                        prop_assert_eq!((matcher.state, matcher.cursor), before);
                        matcher.update(&[9u32]);
                        matcher.undo();
                        prop_assert_eq!((matcher.state, matcher.cursor), before);
                        ids.extend(chunk);
                    }
                    _ => ids = chunk,
                }
                let state = matcher.update(&ids);
                let mut got: Vec<u32> = automaton.completing(state).collect();
                got.sort_unstable();
                prop_assert_eq!(got, completing(&sequences, &ids), "{:?}", ids);
            }
        }
    }
}
