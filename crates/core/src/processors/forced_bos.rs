use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::history::TokenHistory;
use crate::plan::{Edit, ForcedValue, RowPlan};
use crate::processors::LogitsProcessor;
use crate::spec::{EngineContext, KindSpec};

/// `{"kind": "forced_bos", "bos_token_id": 0}`: the first generated token is `bos_token_id`, as
/// transformers' `ForcedBOSTokenLogitsProcessor` forces it (encoder-decoder models, whose decoder
/// ids start with one start token).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ForcedBosSpec {
    pub bos_token_id: u32,
}

impl KindSpec for ForcedBosSpec {
    fn realize(&self, context: &EngineContext, _: usize) -> Result<Box<dyn LogitsProcessor>> {
        context.check_id("bos_token_id", self.bos_token_id)?;
        Ok(Box::new(ForcedBos::new(self.bos_token_id)))
    }
}

/// transformers' `ForcedBOSTokenLogitsProcessor`: at the step where there is one id, every logit
/// becomes `-inf` and `bos_token_id`'s becomes `0.0`, whatever it was; other steps are left
/// alone. The step is read from the ids' length alone, so a resumed request forces it (or not)
/// as the uninterrupted one does.
///
/// ```
/// use logits_processing::{process_row, processors::ForcedBos};
/// let mut bos = ForcedBos::new(1);
/// let mut row = [1.0f32, -3.0, 2.0];
/// process_row(&mut bos, &[7u32], &mut row)?;
/// let ninf = f32::NEG_INFINITY;
/// assert_eq!(row, [ninf, 0.0, ninf]);
/// let mut later = [1.0f32, -3.0, 2.0];
/// process_row(&mut bos, &[7u32, 1], &mut later)?;
/// assert_eq!(later, [1.0, -3.0, 2.0]);
/// # Ok::<(), logits_processing::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ForcedBos {
    bos_token_id: u32,
}

impl ForcedBos {
    pub fn new(bos_token_id: u32) -> Self {
        Self { bos_token_id }
    }
}

impl LogitsProcessor for ForcedBos {
    fn plan(&mut self, ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        if ids.token_count() == 1 {
            plan.push(Edit::Force {
                token: self.bos_token_id,
                value: ForcedValue::Set(0.0),
            });
        }
        Ok(())
    }

    fn undo(&mut self) {}

    fn max_token_id(&self) -> Option<u32> {
        Some(self.bos_token_id)
    }
}
