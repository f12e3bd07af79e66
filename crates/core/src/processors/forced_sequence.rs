use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::history::TokenHistory;
use crate::plan::{Edit, ForcedValue, RowPlan};
use crate::processors::LogitsProcessor;
use crate::spec::{check_len, EngineContext, KindSpec};

/// How a spec's forced sequence finds its position: by counting calls (`"calls"`, the reference's
/// way and the default) or from the number of generated tokens (`"tokens"`: robust to
/// preemption, prefill/decode splits and migration).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PositionSpec {
    #[default]
    Calls,
    Tokens,
}

impl PositionSpec {
    pub(crate) fn position(self, prompt_len: usize) -> Position {
        match self {
            PositionSpec::Calls => Position::Calls,
            PositionSpec::Tokens => Position::GeneratedTokens { prompt_len },
        }
    }
}

/// `{"kind": "forced_sequence", "token_ids": [9906, 1917], "eos_token_id": 2, "position": "calls"}`:
/// the ids to force, one per step, then the EOS id forever; `position` `"calls"` (the default)
/// counts calls, `"tokens"` counts the generated ids.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ForcedSequenceSpec {
    pub token_ids: Vec<u32>,
    pub eos_token_id: u32,
    #[serde(default)]
    pub position: PositionSpec,
}

impl KindSpec for ForcedSequenceSpec {
    fn needs_prompt_len(&self) -> bool {
        self.position == PositionSpec::Tokens
    }

    fn check(&self) -> Result<()> {
        check_len("token_ids", self.token_ids.len())
    }

    fn realize(
        &self,
        context: &EngineContext,
        prompt_len: usize,
    ) -> Result<Box<dyn LogitsProcessor>> {
        context.check_ids("token_ids", self.token_ids.iter().copied())?;
        context.check_id("eos_token_id", self.eos_token_id)?;
        Ok(Box::new(
            ForcedSequence::new(self.token_ids.clone(), Some(self.eos_token_id))?
                .with_position(self.position.position(prompt_len)),
        ))
    }

    fn position_by_tokens(&mut self) {
        self.position = PositionSpec::Tokens;
    }
}

/// Where a forced sequence takes its position from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Position {
    /// One step per call, as the reference counts. One instance serves one request, and a call
    /// that is repeated or skipped (preemption, a prefill/decode split) shifts the sequence.
    #[default]
    Calls,
    /// The number of ids past the prompt: `ids.token_count() - prompt_len`. Survives preemption and a
    /// decode worker picking up a request whose first token came from a prefill worker.
    GeneratedTokens { prompt_len: usize },
}

/// Forces `token_ids` one per step, then the EOS token forever.
///
/// Each call keeps only the target token's logit (at its own value) and sets every other logit to
/// `-inf`. The target is `token_ids[k]` at step `k`, else `eos_token_id`; an empty sequence means
/// EOS from the first call.
///
/// ```
/// use logits_processing::{process_row, ForcedSequence};
/// let mut forced = ForcedSequence::new(vec![2, 0], Some(3))?;
/// let mut row = [0.5f32, 1.5, 2.5, 3.5];
/// process_row(&mut forced, &[7u32], &mut row)?;
/// assert_eq!(row, [f32::NEG_INFINITY, f32::NEG_INFINITY, 2.5, f32::NEG_INFINITY]);
/// assert_eq!(forced.state(), 1);
/// # Ok::<(), logits_processing::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ForcedSequence {
    token_ids: Vec<u32>,
    eos_token_id: u32,
    position: Position,
    state: usize,
    // The state before the last plan, for `undo`.
    previous: usize,
}

impl ForcedSequence {
    /// A forced sequence counting calls, as the reference does. `eos_token_id` is required.
    pub fn new(token_ids: Vec<u32>, eos_token_id: Option<u32>) -> Result<Self> {
        let eos_token_id = eos_token_id.ok_or(Error::MissingEosToken {
            processor: "ForcedSequenceLogitsProcessor",
        })?;
        Ok(Self {
            token_ids,
            eos_token_id,
            position: Position::Calls,
            state: 0,
            previous: 0,
        })
    }

    /// The same sequence, taking its position from `position` instead.
    pub fn with_position(mut self, position: Position) -> Self {
        self.position = position;
        self
    }

    pub fn token_ids(&self) -> &[u32] {
        &self.token_ids
    }

    pub fn eos_token_id(&self) -> u32 {
        self.eos_token_id
    }

    pub fn position(&self) -> Position {
        self.position
    }

    /// The position the next call forces (the number of steps taken so far).
    pub fn state(&self) -> usize {
        self.state
    }

    /// Sets the position counter, as assigning the reference's `state` attribute does.
    pub fn set_state(&mut self, state: usize) {
        self.state = state;
    }

    /// The token forced at step `k`.
    pub fn target(&self, k: usize) -> u32 {
        self.token_ids.get(k).copied().unwrap_or(self.eos_token_id)
    }
}

impl LogitsProcessor for ForcedSequence {
    fn plan(&mut self, ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        let k = match self.position {
            Position::Calls => self.state,
            Position::GeneratedTokens { prompt_len } => {
                ids.token_count().saturating_sub(prompt_len)
            }
        };
        plan.push(Edit::Force {
            token: self.target(k),
            value: ForcedValue::Keep,
        });
        self.previous = self.state;
        self.state = k.saturating_add(1);
        Ok(())
    }

    fn undo(&mut self) {
        self.state = self.previous;
    }

    fn max_token_id(&self) -> Option<u32> {
        self.token_ids
            .iter()
            .copied()
            .chain([self.eos_token_id])
            .max()
    }

    fn reset(&mut self) {
        self.state = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process_row;

    fn survivors(row: &[f32]) -> Vec<usize> {
        (0..row.len())
            .filter(|&i| row[i] != f32::NEG_INFINITY)
            .collect()
    }

    #[test]
    fn forces_each_token_then_eos_forever() {
        let mut forced = ForcedSequence::new(vec![4, 1, 4], Some(0)).unwrap();
        let mut seen = vec![];
        for step in 0..6 {
            let mut row: Vec<f32> = (0..5).map(|i| i as f32 + 0.5).collect();
            process_row(&mut forced, &[9u32], &mut row).unwrap();
            let kept = survivors(&row);
            assert_eq!(kept.len(), 1, "step {step}");
            assert_eq!(row[kept[0]], kept[0] as f32 + 0.5, "keeps its own value");
            seen.push(kept[0]);
        }
        assert_eq!(seen, [4, 1, 4, 0, 0, 0]);
    }

    #[test]
    fn empty_sequence_is_eos_from_the_first_call() {
        let mut forced = ForcedSequence::new(vec![], Some(2)).unwrap();
        let mut row = [1.0f32; 3];
        process_row(&mut forced, &[0u32; 0], &mut row).unwrap();
        assert_eq!(survivors(&row), [2]);
    }

    #[test]
    fn requires_eos() {
        assert_eq!(
            ForcedSequence::new(vec![1], None).unwrap_err(),
            Error::MissingEosToken {
                processor: "ForcedSequenceLogitsProcessor"
            }
        );
    }

    #[test]
    fn position_from_tokens_survives_repeated_and_skipped_calls() {
        let mut forced = ForcedSequence::new(vec![1, 2, 3], Some(0))
            .unwrap()
            .with_position(Position::GeneratedTokens { prompt_len: 2 });
        let mut row = [0.0f32; 4];
        // The prefill worker produced the first token (1); the decode worker starts at position 1.
        process_row(&mut forced, &[7u32, 7, 1], &mut row).unwrap();
        assert_eq!(survivors(&row), [2]);
        // The same step again (a preempted request recomputed): the same answer.
        let mut row = [0.0f32; 4];
        process_row(&mut forced, &[7u32, 7, 1], &mut row).unwrap();
        assert_eq!(survivors(&row), [2]);
        assert_eq!(forced.state(), 2);
    }

    #[test]
    fn token_outside_the_row_is_an_error_and_changes_nothing() {
        let mut forced = ForcedSequence::new(vec![10], Some(0)).unwrap();
        let mut row = [1.0f32; 4];
        assert!(matches!(
            process_row(&mut forced, &[0u32; 0], &mut row),
            Err(Error::TokenOutOfVocab { token_id: 10, .. })
        ));
        assert_eq!(row, [1.0; 4]);
        assert_eq!(forced.state(), 0);
    }
}
