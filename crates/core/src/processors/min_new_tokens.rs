use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::history::TokenHistory;
use crate::plan::RowPlan;
use crate::processors::eos::{check_eos, distinct, eos_ids};
use crate::processors::{push_bans, LogitsProcessor};
use crate::spec::{EngineContext, KindSpec};

/// `{"kind": "min_new_tokens", "min_new_tokens": 5, "eos_token_ids": [2]}`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MinNewTokensSpec {
    pub min_new_tokens: usize,
    pub eos_token_ids: Vec<u32>,
}

impl KindSpec for MinNewTokensSpec {
    fn needs_prompt_len(&self) -> bool {
        true
    }

    fn check(&self) -> Result<()> {
        check_eos(&self.eos_token_ids)
    }

    fn realize(
        &self,
        context: &EngineContext,
        prompt_len: usize,
    ) -> Result<Box<dyn LogitsProcessor>> {
        let eos = eos_ids(context, &self.eos_token_ids)?;
        Ok(Box::new(MinNewTokens::new(
            self.min_new_tokens,
            eos,
            prompt_len,
        )))
    }
}

/// transformers' `MinNewTokensLengthLogitsProcessor`: bans the EOS ids while fewer than
/// `min_new_tokens` ids follow the prompt (`ids - prompt_len < min_new_tokens`, with ids shorter
/// than the prompt counting as fewer).
///
/// ```
/// use logits_processing::{process_row, processors::MinNewTokens};
/// let mut min = MinNewTokens::new(1, vec![0], 2); // a prompt of 2 ids
/// let mut row = [1.0f32; 2];
/// process_row(&mut min, &[1u32, 1], &mut row)?;
/// assert_eq!(row, [f32::NEG_INFINITY, 1.0]);
/// # Ok::<(), logits_processing::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct MinNewTokens {
    // Ids below this many ban the EOS ids.
    min_ids: usize,
    eos_token_ids: Vec<u32>,
}

impl MinNewTokens {
    pub fn new(min_new_tokens: usize, eos_token_ids: Vec<u32>, prompt_len: usize) -> Self {
        Self {
            min_ids: prompt_len.saturating_add(min_new_tokens),
            eos_token_ids: distinct(&eos_token_ids),
        }
    }
}

impl LogitsProcessor for MinNewTokens {
    fn plan(&mut self, ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        if ids.token_count() < self.min_ids {
            push_bans(plan, &self.eos_token_ids);
        }
        Ok(())
    }

    fn undo(&mut self) {}

    fn max_token_id(&self) -> Option<u32> {
        self.eos_token_ids.last().copied()
    }
}
