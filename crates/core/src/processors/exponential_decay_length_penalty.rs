use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::history::TokenHistory;
use crate::plan::{Edit, RowPlan};
use crate::processors::eos::{check_eos, distinct, eos_ids};
use crate::processors::LogitsProcessor;
use crate::spec::{EngineContext, KindSpec};

/// `{"kind": "exponential_decay_length_penalty", "start_index": 20, "decay_factor": 1.05,
/// "eos_token_ids": [2]}`: `decay_factor` finite and > 0; `start_index` counts generated ids.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExponentialDecayLengthPenaltySpec {
    pub start_index: usize,
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub decay_factor: f64,
    pub eos_token_ids: Vec<u32>,
}

impl KindSpec for ExponentialDecayLengthPenaltySpec {
    fn needs_prompt_len(&self) -> bool {
        true
    }

    fn check(&self) -> Result<()> {
        check_eos(&self.eos_token_ids)?;
        ExponentialDecayLengthPenalty::new(self.start_index, self.decay_factor, vec![0], 0)
            .map(drop)
    }

    fn realize(
        &self,
        context: &EngineContext,
        prompt_len: usize,
    ) -> Result<Box<dyn LogitsProcessor>> {
        let eos = eos_ids(context, &self.eos_token_ids)?;
        Ok(Box::new(ExponentialDecayLengthPenalty::new(
            self.start_index,
            self.decay_factor,
            eos,
            prompt_len,
        )?))
    }
}

/// The largest `decay_factor^i - 1`: a logit of `1e4` gains at most `1e34`.
const MAX_FACTOR: f64 = 1e30;

/// transformers' `ExponentialDecayLengthPenalty`: once more than `start_index` ids follow the
/// prompt, each EOS id's logit `x` (when finite) becomes `x + |x| * (decay_factor^i - 1)`, where
/// `i` is how many ids past `prompt_len + start_index` there are: the EOS logit rises (for
/// `decay_factor > 1`) exponentially with the length, from either sign.
///
/// `decay_factor^i - 1` is computed in f64 with the C library's `pow`, saturated at `1e30` (so
/// that a long generation or a large factor leaves the logit finite, where transformers' becomes
/// infinite: 1.05 passes f32's range after about 1,800 ids), and rounded to f32, and the rest in
/// f32, as transformers computes it on an f32 row: bit for bit its result there. On f16
/// and bf16 rows transformers rounds `|x| * (decay_factor^i - 1)` to the row's type before the
/// addition, and here the result is rounded once: the two can differ by one unit in the last
/// place of the added value plus one of the result.
///
/// ```
/// use logits_processing::{process_row, processors::ExponentialDecayLengthPenalty};
/// let mut decay = ExponentialDecayLengthPenalty::new(1, 2.0, vec![0], 2)?; // past 3 ids
/// let mut row = [-1.0f32, 1.0];
/// process_row(&mut decay, &[5u32, 5, 5, 5, 5], &mut row)?; // i = 2: x + |x| * 3
/// assert_eq!(row, [2.0, 1.0]);
/// # Ok::<(), logits_processing::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ExponentialDecayLengthPenalty {
    // Past this many ids, the penalty applies.
    regulation_start: usize,
    decay_factor: f64,
    eos_token_ids: Vec<u32>,
}

impl ExponentialDecayLengthPenalty {
    pub fn new(
        start_index: usize,
        decay_factor: f64,
        eos_token_ids: Vec<u32>,
        prompt_len: usize,
    ) -> Result<Self> {
        if !(decay_factor.is_finite() && decay_factor > 0.0) {
            return Err(Error::argument(
                "decay_factor",
                format!("must be finite and > 0, got {decay_factor}"),
            ));
        }
        Ok(Self {
            regulation_start: start_index.saturating_add(prompt_len),
            decay_factor,
            eos_token_ids: distinct(&eos_token_ids),
        })
    }
}

impl LogitsProcessor for ExponentialDecayLengthPenalty {
    fn plan(&mut self, ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        let len = ids.token_count();
        if len > self.regulation_start {
            let i = (len - self.regulation_start) as f64;
            // Python's `pow(factor, i) - 1` (a double), which torch rounds to f32; saturated,
            // where torch's would overflow.
            let factor = (self.decay_factor.powf(i) - 1.0).min(MAX_FACTOR) as f32;
            for &token in &self.eos_token_ids {
                plan.push(Edit::AddScaledAbs { token, factor });
            }
        }
        Ok(())
    }

    fn undo(&mut self) {}

    fn max_token_id(&self) -> Option<u32> {
        self.eos_token_ids.last().copied()
    }
}
