use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::history::TokenHistory;
use crate::plan::{Edit, RowPlan};
use crate::processors::counts::{window_of, TokenCounts};
use crate::processors::frequency_penalty::check_openai_penalty;
use crate::processors::repetition_penalty::vocab_limit;
use crate::processors::LogitsProcessor;
use crate::spec::{KindSpec, SpecContext};

/// `{"kind": "presence_penalty", "penalty": 0.5}`: `penalty` in `-2..=2`, over the generated ids.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PresencePenaltySpec {
    pub penalty: f64,
    /// Only the last `window` generated ids count (llama.cpp's `penalty_last_n`; -1 or absent:
    /// all of them, 0: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<i64>,
}

impl KindSpec for PresencePenaltySpec {
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
            PresencePenalty::new(self.penalty, prompt_len, context.vocab_size)?
                .with_window(window_of(self.window)?),
        ))
    }
}

/// OpenAI's and vLLM's presence penalty: the logit of every token that occurs among the
/// generated ids (the ids past the prompt's length) is lowered by `penalty`, once however often
/// it occurs. A negative penalty encourages repeats.
///
/// ```
/// use logits_processing::{process_row, processors::PresencePenalty};
/// let mut penalty = PresencePenalty::new(0.5, 1, None)?; // the first id is the prompt
/// let mut row = [1.0f32; 3];
/// process_row(&mut penalty, &[2u32, 1, 1], &mut row)?;
/// assert_eq!(row, [1.0, 0.5, 1.0]);
/// # Ok::<(), logits_processing::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct PresencePenalty {
    penalty: f32,
    counts: TokenCounts,
}

impl PresencePenalty {
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

impl LogitsProcessor for PresencePenalty {
    fn plan(&mut self, ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        if self.penalty == 0.0 {
            return Ok(());
        }
        self.counts.update(ids);
        for &(token, _) in self.counts.counts() {
            plan.push(Edit::Bias {
                token,
                bias: -self.penalty,
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
