use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::history::TokenHistory;
use crate::plan::{Edit, Reshape, RowPlan};
use crate::processors::LogitsProcessor;
use crate::spec::{EngineContext, KindSpec};

/// `{"kind": "log_softmax"}`: the row as log-probabilities, `log_softmax` over the row as it
/// stands where the kind runs: transformers' `LogitNormalization` (its `renormalize_logits`),
/// which it runs after every warper. Kept logits keep their differences; `-inf` stays `-inf`,
/// NaN stays NaN and takes no part in the sum. A row whose largest logit is not finite is left as
/// it is.
///
/// ```
/// use logits_processing::{process_row, processors::LogSoftmax};
/// let mut row = [0f32, 0.0, f32::NEG_INFINITY, 0.0, 0.0];
/// process_row(&mut LogSoftmax, &[0u32], &mut row)?;
/// let quarter = 0.25f32.ln();
/// assert_eq!(row, [quarter, quarter, f32::NEG_INFINITY, quarter, quarter]);
/// # Ok::<(), logits_processing::Error>(())
/// ```
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LogSoftmaxSpec {}

impl KindSpec for LogSoftmaxSpec {
    fn realize(&self, _: &EngineContext, _: usize) -> Result<Box<dyn LogitsProcessor>> {
        Ok(Box::new(LogSoftmax))
    }
}

/// The row as log-probabilities at every step: see [`LogSoftmaxSpec`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LogSoftmax;

impl LogitsProcessor for LogSoftmax {
    fn plan(&mut self, _ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        plan.push(Edit::Reshape(Reshape::LogSoftmax));
        Ok(())
    }

    fn undo(&mut self) {}
}
