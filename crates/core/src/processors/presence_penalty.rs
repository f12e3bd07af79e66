use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::processors::count_penalty::{check_count_penalty, CountPenalty};
use crate::processors::LogitsProcessor;
use crate::spec::{EngineContext, KindSpec};

/// `{"kind": "presence_penalty", "penalty": 0.5}`: `penalty` finite (OpenAI's range `-2..=2`, or beyond as
/// llama.cpp accepts; 0 changes nothing), over the generated ids.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PresencePenaltySpec {
    pub penalty: f64,
    /// Only the last `window` generated ids count (llama.cpp's `penalty_last_n`; -1 or absent:
    /// all of them, 0: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = -1))]
    pub window: Option<i64>,
}

impl KindSpec for PresencePenaltySpec {
    fn needs_prompt_len(&self) -> bool {
        true
    }

    fn check(&self) -> Result<()> {
        check_count_penalty(self.penalty, self.window)
    }

    fn realize(
        &self,
        context: &EngineContext,
        prompt_len: usize,
    ) -> Result<Box<dyn LogitsProcessor>> {
        PresencePenalty::realized(self.penalty, self.window, context, prompt_len)
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
pub type PresencePenalty = CountPenalty<false>;
