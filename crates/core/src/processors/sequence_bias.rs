use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::history::TokenHistory;
use crate::plan::{Edit, RowPlan};
use crate::processors::bad_words::check_sequences;
use crate::processors::matcher::{Automaton, Matcher};
use crate::processors::{check_bias, LogitsProcessor};
use crate::spec::{EngineContext, KindSpec};

/// `{"kind": "sequence_bias", "biases": [[[5], -1.0], [[7, 8], 2.5]]}`: a list of
/// `[token ids, bias]` pairs, each bias finite.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SequenceBiasSpec {
    pub biases: Vec<(Vec<u32>, f64)>,
}

impl KindSpec for SequenceBiasSpec {
    fn check(&self) -> Result<()> {
        SequenceBias::check(&self.biases)
    }

    fn realize(&self, context: &EngineContext, _: usize) -> Result<Box<dyn LogitsProcessor>> {
        for (i, (sequence, _)) in self.biases.iter().enumerate() {
            context.check_ids(&format!("biases[{i}][0]"), sequence.iter().copied())?;
        }
        Ok(Box::new(SequenceBias::new(self.biases.clone())?))
    }
}

/// transformers' `SequenceBiasLogitsProcessor`: a sequence of one token has its bias added at
/// every step; a longer one has its bias added to its last token whenever the ids end with the
/// rest of it. Biases are finite, so a bias never brings back a banned token.
///
/// As in transformers, a sequence listed twice keeps its first place and its last bias, and the
/// biases that meet on one token are summed in f32 in transformers' order (one-token biases
/// first, then the longer sequences grouped by length in order of first appearance) before one
/// addition to the logit: bit for bit transformers' result on f32 rows. On f16 and bf16 rows
/// transformers rounds the summed bias to the row's type before adding it, and here the f32 sum
/// is added and the result rounded once: the two can differ by one unit in the last place of
/// the summed bias plus one of the result.
/// (transformers also adds `0.0` to every other logit, turning `-0.0` into `0.0`; here untouched
/// logits keep their bits.)
///
/// The sequences' prefixes form an Aho-Corasick automaton advanced by the new ids only: a step
/// costs amortized `O(1)` per new id plus one edit per biased token.
///
/// ```
/// use logits_processing::{process_row, processors::SequenceBias};
/// let mut bias = SequenceBias::new(vec![(vec![0], -1.0), (vec![1, 2], 2.5)])?;
/// let mut row = [1.0f32; 3];
/// process_row(&mut bias, &[1u32], &mut row)?;
/// assert_eq!(row, [0.0, 1.0, 3.5]);
/// # Ok::<(), logits_processing::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct SequenceBias {
    // Distinct sequences, in transformers' dict order, with their bias.
    sequences: Vec<Vec<u32>>,
    biases: Vec<f32>,
    // Each longer sequence's place in transformers' summation order.
    rank: Vec<u32>,
    matcher: Matcher,
    // (token, bias) of the one-token sequences, by token.
    always: Vec<(u32, f32)>,
    // (last token, rank, sequence) of the sequences one token from complete.
    matched: Vec<(u32, u32, u32)>,
}

impl SequenceBias {
    fn check(biases: &[(Vec<u32>, f64)]) -> Result<()> {
        check_sequences("biases", biases.iter().map(|(s, _)| s))?;
        for (i, &(_, bias)) in biases.iter().enumerate() {
            check_bias(format!("biases[{i}][1]"), bias)?;
        }
        Ok(())
    }

    pub fn new(biases: Vec<(Vec<u32>, f64)>) -> Result<Self> {
        Self::check(&biases)?;
        // A dict from sequence to bias: the first place, the last bias.
        let mut sequences: Vec<Vec<u32>> = vec![];
        let mut values: Vec<f32> = vec![];
        let mut place = std::collections::HashMap::new();
        for (sequence, bias) in biases {
            match place.get(&sequence) {
                Some(&at) => values[at] = bias as f32,
                None => {
                    place.insert(sequence.clone(), sequences.len());
                    sequences.push(sequence);
                    values.push(bias as f32);
                }
            }
        }
        // Longer sequences are summed group by group (groups by length, in order of first
        // appearance), in dict order within a group.
        let mut lengths: Vec<usize> = vec![];
        for s in sequences.iter().filter(|s| s.len() > 1) {
            if !lengths.contains(&s.len()) {
                lengths.push(s.len());
            }
        }
        let mut order: Vec<usize> = (0..sequences.len())
            .filter(|&s| sequences[s].len() > 1)
            .collect();
        order.sort_by_key(|&s| lengths.iter().position(|&l| l == sequences[s].len()));
        let mut rank = vec![u32::MAX; sequences.len()];
        for (r, &s) in order.iter().enumerate() {
            rank[s] = r as u32;
        }
        let automaton = Arc::new(Automaton::new(&sequences));
        let mut always: Vec<(u32, f32)> = automaton
            .always()
            .iter()
            .map(|&s| (sequences[s as usize][0], values[s as usize]))
            .collect();
        always.sort_unstable_by_key(|&(token, _)| token);
        Ok(Self {
            sequences,
            biases: values,
            rank,
            matcher: Matcher::new(automaton),
            always,
            matched: vec![],
        })
    }
}

impl LogitsProcessor for SequenceBias {
    fn plan(&mut self, ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        let state = self.matcher.update(ids);
        self.matched.clear();
        for s in self.matcher.automaton().completing(state) {
            let sequence = &self.sequences[s as usize];
            self.matched
                .push((sequence[sequence.len() - 1], self.rank[s as usize], s));
        }
        self.matched.sort_unstable();
        // Merge the one-token biases with the matched sequences', by token.
        let (mut a, mut m) = (0, 0);
        while a < self.always.len() || m < self.matched.len() {
            let token = match (self.always.get(a), self.matched.get(m)) {
                (Some(&(ta, _)), Some(&(tm, _, _))) => ta.min(tm),
                (Some(&(ta, _)), None) => ta,
                (None, Some(&(tm, _, _))) => tm,
                (None, None) => unreachable!(),
            };
            // transformers starts from a zero bias, adds the one-token bias, then the others.
            let mut bias = 0.0f32;
            if let Some(&(_, b)) = self.always.get(a).filter(|&&(t, _)| t == token) {
                bias += b;
                a += 1;
            }
            while let Some(&(_, _, s)) = self.matched.get(m).filter(|&&(t, _, _)| t == token) {
                bias += self.biases[s as usize];
                m += 1;
            }
            plan.push(Edit::Bias { token, bias });
        }
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
    use crate::process_row;

    #[test]
    fn a_repeated_sequence_keeps_its_last_bias_and_matches_sum() {
        let mut bias = SequenceBias::new(vec![
            (vec![3], 1.0),
            (vec![1, 3], 0.5),
            (vec![3], 2.0),
            (vec![0, 1, 3], 0.25),
        ])
        .unwrap();
        let mut row = [0.0f32; 4];
        process_row(&mut bias, &[0u32, 1], &mut row).unwrap();
        assert_eq!(row, [0.0, 0.0, 0.0, 2.75]);
        let mut row = [0.0f32; 4];
        process_row(&mut bias, &[0u32, 1, 2], &mut row).unwrap();
        assert_eq!(row, [0.0, 0.0, 0.0, 2.0]);
    }

    #[test]
    fn non_finite_biases_are_refused_naming_the_entry() {
        match SequenceBias::new(vec![(vec![1], 1.0), (vec![2], f64::NEG_INFINITY)]) {
            Err(crate::Error::InvalidArgument { field, .. }) => assert_eq!(field, "biases[1][1]"),
            other => panic!("{other:?}"),
        }
    }
}
