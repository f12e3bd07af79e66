use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::history::TokenHistory;
use crate::plan::{Edit, RowPlan, WholeRow};
use crate::processors::LogitsProcessor;
use crate::spec::{EngineContext, KindSpec};

/// `{"kind": "inf_nan_remove"}`: NaN becomes `0.0`, `+inf` the row type's largest finite value
/// and `-inf` its smallest (`finfo(dtype).max` and `.min` of f32, f16 or bf16), as transformers'
/// `InfNanRemoveLogitsProcessor` (`remove_invalid_values`). A token banned before it (`-inf`)
/// ends at the smallest finite value, as in transformers: still never sampled beside a finite
/// logit, but finite, so a row whose every token was banned is uniform after it instead of
/// getting EOS.
///
/// ```
/// use logits_processing::{process_row, processors::InfNanRemove};
/// let mut row = [1.0f32, f32::NAN, f32::INFINITY, f32::NEG_INFINITY];
/// process_row(&mut InfNanRemove, &[0u32], &mut row)?;
/// assert_eq!(row, [1.0, 0.0, f32::MAX, f32::MIN]);
/// # Ok::<(), logits_processing::Error>(())
/// ```
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InfNanRemoveSpec {}

impl KindSpec for InfNanRemoveSpec {
    fn realize(&self, _: &EngineContext, _: usize) -> Result<Box<dyn LogitsProcessor>> {
        Ok(Box::new(InfNanRemove))
    }
}

/// Removes NaN and infinities at every step: see [`InfNanRemoveSpec`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InfNanRemove;

impl LogitsProcessor for InfNanRemove {
    fn plan(&mut self, _ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        plan.push(Edit::Whole(WholeRow::InfNanRemove));
        Ok(())
    }

    fn undo(&mut self) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::ForcedValue;

    #[test]
    fn after_a_force_the_other_logits_are_the_minimum_as_transformers_gives_them() {
        // forced_eos then remove_invalid_values, in generate()'s order.
        let mut plan = RowPlan::new();
        plan.push(Edit::Ban { token: 0 });
        plan.push(Edit::Force {
            token: 2,
            value: ForcedValue::Set(0.0),
        });
        InfNanRemove.plan(&[0u32], &mut plan).unwrap();
        plan.push(Edit::Scale { temperature: 2.0 });
        let mut row = [1.0f32, f32::NAN, 3.0, 4.0];
        plan.apply(&mut row).unwrap();
        assert_eq!(row, [f32::MIN / 2.0, f32::MIN / 2.0, 0.0, f32::MIN / 2.0]);
        assert_eq!(plan.forced_token(), None);
    }
}
