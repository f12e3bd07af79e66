use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::history::TokenHistory;
use crate::plan::RowPlan;
use crate::processors::eos::{check_eos, distinct, eos_ids};
use crate::processors::{push_bans, LogitsProcessor};
use crate::spec::{EngineContext, KindSpec};

/// `{"kind": "min_length", "min_length": 20, "eos_token_ids": [2]}`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MinLengthSpec {
    pub min_length: usize,
    pub eos_token_ids: Vec<u32>,
}

impl KindSpec for MinLengthSpec {
    fn check(&self) -> Result<()> {
        check_eos(&self.eos_token_ids)
    }

    fn realize(&self, context: &EngineContext, _: usize) -> Result<Box<dyn LogitsProcessor>> {
        let eos = eos_ids(context, &self.eos_token_ids)?;
        Ok(Box::new(MinLength::new(self.min_length, eos)))
    }
}

/// transformers' `MinLengthLogitsProcessor`: bans the EOS ids while there are fewer than
/// `min_length` ids, the prompt included (see `min_new_tokens` to count generated ids only).
///
/// ```
/// use logits_processing::{process_row, processors::MinLength};
/// let mut min = MinLength::new(3, vec![0]);
/// let mut row = [1.0f32; 2];
/// process_row(&mut min, &[1u32, 1], &mut row)?;
/// assert_eq!(row, [f32::NEG_INFINITY, 1.0]);
/// let mut row = [1.0f32; 2];
/// process_row(&mut min, &[1u32, 1, 1], &mut row)?;
/// assert_eq!(row, [1.0, 1.0]);
/// # Ok::<(), logits_processing::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct MinLength {
    min_length: usize,
    eos_token_ids: Vec<u32>,
}

impl MinLength {
    pub fn new(min_length: usize, eos_token_ids: Vec<u32>) -> Self {
        Self {
            min_length,
            eos_token_ids: distinct(&eos_token_ids),
        }
    }
}

impl LogitsProcessor for MinLength {
    fn plan(&mut self, ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        if ids.token_count() < self.min_length {
            push_bans(plan, &self.eos_token_ids);
        }
        Ok(())
    }

    fn undo(&mut self) {}

    fn max_token_id(&self) -> Option<u32> {
        self.eos_token_ids.last().copied()
    }
}
