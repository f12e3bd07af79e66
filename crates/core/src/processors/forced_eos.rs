use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::history::TokenHistory;
use crate::plan::RowPlan;
use crate::processors::eos::{check_eos, eos_ids, ForcedEosIds};
use crate::processors::LogitsProcessor;
use crate::spec::{EngineContext, KindSpec};

/// `{"kind": "forced_eos", "max_length": 64, "eos_token_ids": [2]}`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ForcedEosSpec {
    pub max_length: usize,
    pub eos_token_ids: Vec<u32>,
}

impl KindSpec for ForcedEosSpec {
    fn check(&self) -> Result<()> {
        check_eos(&self.eos_token_ids)
    }

    fn realize(&self, context: &EngineContext, _: usize) -> Result<Box<dyn LogitsProcessor>> {
        let eos = eos_ids(context, &self.eos_token_ids)?;
        Ok(Box::new(ForcedEos::new(self.max_length, eos)))
    }
}

/// transformers' `ForcedEOSTokenLogitsProcessor`: at the step where there are `max_length - 1`
/// ids (so the next token is the last one allowed), every logit becomes `-inf` and each EOS id's
/// becomes `0.0`, whatever it was (an EOS id banned by an earlier step included); other steps are
/// left alone. One EOS id is a force of the row (a write-only fill); several are a mask and a
/// set per id.
///
/// ```
/// use logits_processing::{process_row, processors::ForcedEos};
/// let mut eos = ForcedEos::new(4, vec![0, 2]);
/// let mut row = [1.0f32; 3];
/// process_row(&mut eos, &[1u32, 1, 1], &mut row)?;
/// assert_eq!(row, [0.0, f32::NEG_INFINITY, 0.0]);
/// # Ok::<(), logits_processing::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ForcedEos {
    max_length: usize,
    eos: ForcedEosIds,
}

impl ForcedEos {
    pub fn new(max_length: usize, eos_token_ids: Vec<u32>) -> Self {
        Self {
            max_length,
            eos: ForcedEosIds::new(&eos_token_ids),
        }
    }
}

impl LogitsProcessor for ForcedEos {
    fn plan(&mut self, ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        if ids.token_count().checked_add(1) != Some(self.max_length) {
            return Ok(());
        }
        self.eos.push(plan);
        Ok(())
    }

    fn undo(&mut self) {}

    fn max_token_id(&self) -> Option<u32> {
        self.eos.max_token_id()
    }
}
