use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::history::TokenHistory;
use crate::plan::{Edit, RowPlan};
use crate::processors::counts::TokenCounts;
use crate::processors::frequency_penalty::check_openai_penalty;
use crate::processors::repetition_penalty::vocab_limit;
use crate::processors::LogitsProcessor;
use crate::spec::{KindSpec, SpecContext};

/// `{"kind": "presence_penalty", "penalty": 0.5}`: `penalty` in `-2..=2`, over the generated ids.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PresencePenaltySpec {
    pub penalty: f64,
}

impl KindSpec for PresencePenaltySpec {
    fn check(&self) -> Result<()> {
        check_openai_penalty(self.penalty)
    }

    fn realize(
        &self,
        context: &SpecContext,
        prompt_len: usize,
    ) -> Result<Box<dyn LogitsProcessor>> {
        Ok(Box::new(PresencePenalty::new(
            self.penalty,
            prompt_len,
            context.vocab_size,
        )?))
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
