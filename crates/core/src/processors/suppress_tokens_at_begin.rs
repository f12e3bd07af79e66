use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::history::TokenHistory;
use crate::plan::RowPlan;
use crate::processors::eos::distinct;
use crate::processors::{push_bans, LogitsProcessor};
use crate::spec::{check_len, EngineContext, KindSpec};

/// `{"kind": "suppress_tokens_at_begin", "token_ids": [220, 50256], "begin_index": 12}`;
/// `begin_index` defaults to the prompt's length (the first generated token, as `generate()`
/// sets it for a decoder-only model).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SuppressTokensAtBeginSpec {
    pub token_ids: Vec<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub begin_index: Option<usize>,
}

impl KindSpec for SuppressTokensAtBeginSpec {
    fn needs_prompt_len(&self) -> bool {
        self.begin_index.is_none()
    }

    fn check(&self) -> Result<()> {
        check_len("token_ids", self.token_ids.len())
    }

    fn realize(
        &self,
        context: &EngineContext,
        prompt_len: usize,
    ) -> Result<Box<dyn LogitsProcessor>> {
        context.check_ids("token_ids", self.token_ids.iter().copied())?;
        Ok(Box::new(SuppressTokensAtBegin::new(
            self.token_ids.clone(),
            self.begin_index.unwrap_or(prompt_len),
        )))
    }
}

/// transformers' `SuppressTokensAtBeginLogitsProcessor`: bans `token_ids` at the one step where
/// there are exactly `begin_index` ids.
///
/// ```
/// use logits_processing::{process_row, processors::SuppressTokensAtBegin};
/// let mut suppress = SuppressTokensAtBegin::new(vec![1], 2);
/// let mut row = [1.0f32; 2];
/// process_row(&mut suppress, &[0u32, 0], &mut row)?;
/// assert_eq!(row, [1.0, f32::NEG_INFINITY]);
/// let mut row = [1.0f32; 2];
/// process_row(&mut suppress, &[0u32, 0, 0], &mut row)?;
/// assert_eq!(row, [1.0, 1.0]);
/// # Ok::<(), logits_processing::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct SuppressTokensAtBegin {
    token_ids: Vec<u32>,
    begin_index: usize,
}

impl SuppressTokensAtBegin {
    pub fn new(token_ids: Vec<u32>, begin_index: usize) -> Self {
        Self {
            token_ids: distinct(&token_ids),
            begin_index,
        }
    }
}

impl LogitsProcessor for SuppressTokensAtBegin {
    fn plan(&mut self, ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        if ids.token_count() == self.begin_index {
            push_bans(plan, &self.token_ids);
        }
        Ok(())
    }

    fn undo(&mut self) {}

    fn max_token_id(&self) -> Option<u32> {
        self.token_ids.last().copied()
    }
}
