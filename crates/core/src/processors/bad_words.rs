use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::history::TokenHistory;
use crate::plan::RowPlan;
use crate::processors::matcher::{Automaton, Matcher};
use crate::processors::{push_bans, LogitsProcessor};
use crate::spec::{check_len, EngineContext, KindSpec, MAX_TOKEN_IDS};

/// `{"kind": "bad_words", "sequences": [[5], [7, 8, 9]]}`: token sequences never to generate.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BadWordsSpec {
    pub sequences: Vec<Vec<u32>>,
}

/// Checks a list of token sequences: each non-empty, at most [`MAX_TOKEN_IDS`] ids in all.
pub(crate) fn check_sequences<'a>(
    field: &str,
    sequences: impl ExactSizeIterator<Item = &'a Vec<u32>>,
) -> Result<()> {
    check_len(field, sequences.len())?;
    let mut total = 0;
    for (i, sequence) in sequences.enumerate() {
        if sequence.is_empty() {
            return Err(Error::argument(
                format!("{field}[{i}]"),
                "must not be empty",
            ));
        }
        total += sequence.len();
    }
    if total > MAX_TOKEN_IDS {
        return Err(Error::TooLarge {
            field: field.into(),
            len: total,
            limit: MAX_TOKEN_IDS,
        });
    }
    Ok(())
}

impl KindSpec for BadWordsSpec {
    fn check(&self) -> Result<()> {
        check_sequences("sequences", self.sequences.iter())
    }

    fn realize(&self, context: &EngineContext, _: usize) -> Result<Box<dyn LogitsProcessor>> {
        for (i, sequence) in self.sequences.iter().enumerate() {
            context.check_ids(&format!("sequences[{i}]"), sequence.iter().copied())?;
        }
        Ok(Box::new(BadWords::new(self.sequences.clone())?))
    }
}

/// transformers' `NoBadWordsLogitsProcessor`: a sequence of one token is banned at every step; a
/// longer one has its last token banned whenever the ids end with the rest of it.
///
/// The sequences' prefixes form an Aho-Corasick automaton, advanced by the new ids only: a step
/// costs amortized `O(1)` per new id plus one ban per banned token, whatever the history's length
/// or the number of sequences. Banning sets `-inf` whatever the logit was (transformers adds
/// `-inf`, which leaves a NaN or `+inf` logit NaN). transformers' `generate()` also drops the
/// one-token sequences that are an EOS id; a spec bans what it lists.
///
/// ```
/// use logits_processing::{process_row, processors::BadWords};
/// let mut bad = BadWords::new(vec![vec![0], vec![1, 2]])?;
/// let mut row = [1.0f32; 4];
/// process_row(&mut bad, &[3u32, 1], &mut row)?; // "1 2" is one token from complete
/// let ninf = f32::NEG_INFINITY;
/// assert_eq!(row, [ninf, 1.0, ninf, 1.0]);
/// # Ok::<(), logits_processing::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct BadWords {
    sequences: Vec<Vec<u32>>,
    matcher: Matcher,
    // The tokens banned at every step, sorted.
    always: Vec<u32>,
    banned: Vec<u32>,
}

impl BadWords {
    pub fn new(sequences: Vec<Vec<u32>>) -> Result<Self> {
        check_sequences("sequences", sequences.iter())?;
        let automaton = Arc::new(Automaton::new(&sequences));
        let mut always: Vec<u32> = automaton
            .always()
            .iter()
            .map(|&s| sequences[s as usize][0])
            .collect();
        always.sort_unstable();
        always.dedup();
        Ok(Self {
            sequences,
            matcher: Matcher::new(automaton),
            always,
            banned: vec![],
        })
    }

    pub fn sequences(&self) -> &[Vec<u32>] {
        &self.sequences
    }

    /// The tokens banned after `ids`, sorted; the state brought up to them.
    pub fn banned(&mut self, ids: &dyn TokenHistory) -> &[u32] {
        let state = self.matcher.update(ids);
        self.banned.clear();
        for s in self.matcher.automaton().completing(state) {
            let sequence = &self.sequences[s as usize];
            self.banned.push(sequence[sequence.len() - 1]);
        }
        let matched = !self.banned.is_empty();
        self.banned.extend_from_slice(&self.always);
        if matched {
            self.banned.sort_unstable();
            self.banned.dedup();
        }
        &self.banned
    }
}

impl LogitsProcessor for BadWords {
    fn plan(&mut self, ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        self.banned(ids);
        push_bans(plan, &self.banned);
        Ok(())
    }

    fn undo(&mut self) {
        self.matcher.undo();
    }

    fn max_token_id(&self) -> Option<u32> {
        self.sequences.iter().flatten().copied().max()
    }

    fn reset(&mut self) {
        self.matcher.reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_sequences_are_refused_naming_the_entry() {
        match BadWords::new(vec![vec![1], vec![]]) {
            Err(Error::InvalidArgument { field, .. }) => assert_eq!(field, "sequences[1]"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_sequence_bans_only_when_its_prefix_ends_the_ids() {
        let mut bad = BadWords::new(vec![vec![4, 5, 6], vec![2]]).unwrap();
        assert_eq!(bad.banned(&[4u32]), [2]);
        assert_eq!(bad.banned(&[4u32, 5]), [2, 6]);
        assert_eq!(bad.banned(&[4u32, 5, 5]), [2]);
        assert_eq!(bad.banned(&[4u32, 5, 5, 4, 5]), [2, 6]);
    }
}
