use crate::error::Result;
use crate::history::TokenHistory;
use crate::plan::{Edit, RowPlan};
use crate::processors::LogitsProcessor;

/// Sets the logits of a fixed set of tokens to `-inf` at every step. Costs O(number of tokens) per
/// step on top of the row's pass.
#[derive(Debug, Clone, PartialEq)]
pub struct BanTokens {
    token_ids: Vec<u32>,
}

impl BanTokens {
    pub fn new(mut token_ids: Vec<u32>) -> Self {
        token_ids.sort_unstable();
        token_ids.dedup();
        Self { token_ids }
    }

    pub fn token_ids(&self) -> &[u32] {
        &self.token_ids
    }
}

impl LogitsProcessor for BanTokens {
    fn plan(&mut self, _ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        for &token in &self.token_ids {
            plan.push(Edit::Ban { token });
        }
        Ok(())
    }

    fn max_token_id(&self) -> Option<u32> {
        self.token_ids.last().copied()
    }
}
