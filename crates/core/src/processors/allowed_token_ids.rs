use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::history::TokenHistory;
use crate::plan::RowPlan;
use crate::processors::LogitsProcessor;
use crate::spec::{check_len, EngineContext, KindSpec};

/// `{"kind": "allowed_token_ids", "token_ids": [5, 6]}`: at least one id.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AllowedTokenIdsSpec {
    pub token_ids: Vec<u32>,
}

impl KindSpec for AllowedTokenIdsSpec {
    fn check(&self) -> Result<()> {
        check_len("token_ids", self.token_ids.len())?;
        AllowedTokenIds::new(&self.token_ids).map(drop)
    }

    fn realize(&self, context: &EngineContext, _: usize) -> Result<Box<dyn LogitsProcessor>> {
        context.check_ids("token_ids", self.token_ids.iter().copied())?;
        Ok(Box::new(AllowedTokenIds::new(&self.token_ids)?))
    }
}

/// vLLM's `allowed_token_ids`: every logit but those of the listed ids becomes `-inf`, at every
/// step (a bitmask edit: one select per logit in the row's pass).
///
/// ```
/// use logits_processing::{process_row, processors::AllowedTokenIds};
/// let mut allowed = AllowedTokenIds::new(&[1, 3])?;
/// let mut row = [1.0f32; 5];
/// process_row(&mut allowed, &[0u32], &mut row)?;
/// let ninf = f32::NEG_INFINITY;
/// assert_eq!(row, [ninf, 1.0, ninf, 1.0, ninf]);
/// # Ok::<(), logits_processing::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct AllowedTokenIds {
    // Bit set = allowed, up to the largest id; everything past it is banned.
    mask: Vec<u32>,
    max_token_id: u32,
}

impl AllowedTokenIds {
    pub fn new(token_ids: &[u32]) -> Result<Self> {
        let Some(&max_token_id) = token_ids.iter().max() else {
            return Err(Error::argument("token_ids", "must list at least one id"));
        };
        let mut mask = vec![0u32; (max_token_id as usize + 1).div_ceil(32)];
        for &token in token_ids {
            mask[token as usize / 32] |= 1 << (token % 32);
        }
        Ok(Self { mask, max_token_id })
    }
}

impl LogitsProcessor for AllowedTokenIds {
    fn plan(&mut self, _ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        plan.push_mask(&self.mask, false);
        Ok(())
    }

    fn undo(&mut self) {}

    fn max_token_id(&self) -> Option<u32> {
        Some(self.max_token_id)
    }
}
