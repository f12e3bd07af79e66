use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::history::TokenHistory;
use crate::plan::{Edit, RowPlan};
use crate::processors::counts::{window_of, TokenCounts};
use crate::processors::repetition_penalty::vocab_limit;
use crate::processors::LogitsProcessor;
use crate::spec::{KindSpec, SpecContext};

/// `{"kind": "frequency_penalty", "penalty": 0.5}`: `penalty` in `-2..=2`, over the generated ids.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FrequencyPenaltySpec {
    pub penalty: f64,
    /// Only the last `window` generated ids count (llama.cpp's `penalty_last_n`; -1 or absent:
    /// all of them, 0: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<i64>,
}

impl KindSpec for FrequencyPenaltySpec {
    fn needs_prompt_len(&self) -> bool {
        true
    }

    fn check(&self) -> Result<()> {
        window_of(self.window)?;
        check_openai_penalty(self.penalty)
    }

    fn realize(
        &self,
        context: &SpecContext,
        prompt_len: usize,
    ) -> Result<Box<dyn LogitsProcessor>> {
        Ok(Box::new(
            FrequencyPenalty::new(self.penalty, prompt_len, context.vocab_size)?
                .with_window(window_of(self.window)?),
        ))
    }
}

/// OpenAI's range for frequency and presence penalties.
pub(crate) fn check_openai_penalty(penalty: f64) -> Result<()> {
    if (-2.0..=2.0).contains(&penalty) {
        Ok(())
    } else {
        Err(crate::Error::argument(
            "penalty",
            format!("must be between -2 and 2, got {penalty}"),
        ))
    }
}

/// OpenAI's and vLLM's frequency penalty: each token's logit is lowered by `penalty` times the
/// number of times it occurs among the generated ids (the ids past the prompt's length):
/// `logit - penalty * count`, computed in f32 as vLLM does. A negative penalty encourages
/// repeats.
///
/// Counts are updated from the new ids only; a step costs one sparse edit per distinct generated
/// token, whatever the history's length.
///
/// ```
/// use logits_processing::{process_row, processors::FrequencyPenalty};
/// let mut penalty = FrequencyPenalty::new(0.5, 1, None)?; // the first id is the prompt
/// let mut row = [1.0f32; 3];
/// process_row(&mut penalty, &[2u32, 1, 1, 2], &mut row)?;
/// assert_eq!(row, [1.0, 0.0, 0.5]);
/// # Ok::<(), logits_processing::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct FrequencyPenalty {
    penalty: f32,
    counts: TokenCounts,
}

impl FrequencyPenalty {
    /// Only the last `window` ids in scope count (llama.cpp's `penalty_last_n`), updated as
    /// incrementally as the rest: each step adds the new ids and takes out those that left.
    pub fn with_window(mut self, window: Option<usize>) -> Self {
        self.counts = self.counts.with_window(window);
        self
    }

    pub fn new(penalty: f64, prompt_len: usize, vocab_size: Option<usize>) -> Result<Self> {
        check_openai_penalty(penalty)?;
        Ok(Self {
            penalty: penalty as f32,
            counts: TokenCounts::new(prompt_len, usize::MAX, vocab_limit(vocab_size)),
        })
    }
}

impl LogitsProcessor for FrequencyPenalty {
    fn plan(&mut self, ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        if self.penalty == 0.0 {
            return Ok(());
        }
        self.counts.update(ids);
        for &(token, count) in self.counts.counts() {
            plan.push(Edit::Bias {
                token,
                bias: -(self.penalty * count as f32),
            });
        }
        Ok(())
    }

    fn undo(&mut self) {
        if self.penalty != 0.0 {
            self.counts.undo();
        }
    }

    fn reset(&mut self) {
        self.counts.reset();
    }
}
