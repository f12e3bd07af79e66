use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::history::TokenHistory;
use crate::plan::{Edit, RowPlan};
use crate::processors::counts::{window_of, TokenCounts};
use crate::processors::{LogitsProcessor, MIN_TEMPERATURE};
use crate::spec::{EngineContext, KindSpec};

/// Which ids a repetition penalty looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// The prompt and the generated ids (transformers' default for decoder-only models).
    #[default]
    All,
    /// The generated ids only (past the prompt's length).
    Output,
    /// The prompt's ids only.
    Prompt,
}

/// `{"kind": "repetition_penalty", "penalty": 1.2, "scope": "all"}`: `penalty` finite, at least
/// `1e-30` (as a temperature: positive logits are divided by it) and within f32's range.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RepetitionPenaltySpec {
    #[schemars(range(min = 1e-30))]
    pub penalty: f64,
    #[serde(default)]
    pub scope: Scope,
    /// Only the last `window` ids in scope count (llama.cpp's `penalty_last_n`; -1 or absent:
    /// all of them, 0: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = -1))]
    pub window: Option<i64>,
}

impl KindSpec for RepetitionPenaltySpec {
    fn needs_prompt_len(&self) -> bool {
        self.scope != Scope::All
    }

    fn check(&self) -> Result<()> {
        window_of(self.window)?;
        RepetitionPenalty::new(self.penalty, self.scope, 0, None).map(drop)
    }

    fn realize(
        &self,
        context: &EngineContext,
        prompt_len: usize,
    ) -> Result<Box<dyn LogitsProcessor>> {
        Ok(Box::new(
            RepetitionPenalty::new(self.penalty, self.scope, prompt_len, context.vocab_size)?
                .with_window(window_of(self.window)?),
        ))
    }
}

/// transformers' `RepetitionPenaltyLogitsProcessor`: the logit `x` of every distinct token among
/// the ids in scope becomes `x / penalty` when `x >= 0` and `x * penalty` when `x < 0`, once per
/// token however often it occurs. `penalty > 1` discourages repeats, `< 1` encourages them, `1`
/// changes nothing.
///
/// Scope `all` is transformers' behaviour for decoder-only models (prompt included); `output`
/// is its `prompt_ignore_length = prompt_len`; `prompt` looks at the prompt alone. Ids outside the
/// vocab (when it is known at admission) are skipped, as transformers drops them.
///
/// The counts are updated from the new ids only ([`TokenCounts`]); a step costs `O(distinct
/// tokens)` for its edits (one sparse edit each), whatever the history's length.
///
/// ```
/// use logits_processing::{process_row, processors::{RepetitionPenalty, Scope}};
/// let mut penalty = RepetitionPenalty::new(2.0, Scope::All, 0, None)?;
/// let mut row = [4.0f32, -4.0, 4.0];
/// process_row(&mut penalty, &[0u32, 1, 0], &mut row)?;
/// assert_eq!(row, [2.0, -8.0, 4.0]);
/// # Ok::<(), logits_processing::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct RepetitionPenalty {
    penalty: f32,
    counts: TokenCounts,
}

impl RepetitionPenalty {
    /// Only the last `window` ids in scope count (llama.cpp's `penalty_last_n`), updated as
    /// incrementally as the rest: each step adds the new ids and takes out those that left.
    pub fn with_window(mut self, window: Option<usize>) -> Self {
        self.counts = self.counts.with_window(window);
        self
    }

    /// `prompt_len` bounds the scopes `output` and `prompt`; ids at or above `vocab_size` (when
    /// given) are skipped.
    pub fn new(
        penalty: f64,
        scope: Scope,
        prompt_len: usize,
        vocab_size: Option<usize>,
    ) -> Result<Self> {
        let as_f32 = penalty as f32;
        // A positive logit is divided by it: below the smallest temperature, it would overflow.
        if !(penalty.is_finite() && penalty >= MIN_TEMPERATURE && as_f32.is_finite()) {
            return Err(Error::argument(
                "penalty",
                format!(
                    "must be finite and at least 1e-30 (a smaller one turns logits into \
                     infinity), got {penalty}"
                ),
            ));
        }
        let (from, to) = match scope {
            Scope::All => (0, usize::MAX),
            Scope::Output => (prompt_len, usize::MAX),
            Scope::Prompt => (0, prompt_len),
        };
        Ok(Self {
            penalty: as_f32,
            counts: TokenCounts::new(from, to, vocab_limit(vocab_size)),
        })
    }
}

/// Ids at or above this are outside the vocab.
pub(crate) fn vocab_limit(vocab_size: Option<usize>) -> u32 {
    vocab_size.map_or(u32::MAX, |v| v.min(u32::MAX as usize) as u32)
}

impl LogitsProcessor for RepetitionPenalty {
    fn plan(&mut self, ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        // A penalty of 1 leaves every value as it is (x / 1 and x * 1 are exact).
        if self.penalty == 1.0 {
            return Ok(());
        }
        self.counts.update(ids);
        for &(token, _) in self.counts.counts() {
            plan.push(Edit::Penalty {
                token,
                penalty: self.penalty,
            });
        }
        Ok(())
    }

    fn undo(&mut self) {
        if self.penalty != 1.0 {
            self.counts.undo();
        }
    }

    fn reset(&mut self) {
        self.counts.reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process_row;

    #[test]
    fn scopes_look_at_their_part_of_the_ids() {
        let ids = [0u32, 1, 2, 3];
        for (scope, penalized) in [
            (Scope::All, vec![0, 1, 2, 3]),
            (Scope::Output, vec![2, 3]),
            (Scope::Prompt, vec![0, 1]),
        ] {
            let mut p = RepetitionPenalty::new(2.0, scope, 2, None).unwrap();
            let mut row = [8.0f32; 5];
            process_row(&mut p, &ids, &mut row).unwrap();
            let got: Vec<usize> = (0..5).filter(|&i| row[i] == 4.0).collect();
            assert_eq!(got, penalized, "{scope:?}");
        }
    }

    #[test]
    fn ids_outside_the_vocab_are_skipped_and_bad_penalties_refused() {
        let mut p = RepetitionPenalty::new(2.0, Scope::All, 0, Some(3)).unwrap();
        let mut row = [8.0f32; 3];
        process_row(&mut p, &[1u32, 7], &mut row).unwrap();
        assert_eq!(row, [8.0, 4.0, 8.0]);
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e-60] {
            assert!(RepetitionPenalty::new(bad, Scope::All, 0, None).is_err());
        }
    }
}
