use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::history::TokenHistory;
use crate::plan::{Edit, RowPlan};
use crate::processors::{LogitsProcessor, MASK_FROM};
use crate::spec::{check_len, EngineContext, KindSpec};

/// `{"kind": "ban_tokens", "token_ids": [5, 6]}`: the ids whose logits become `-inf`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BanTokensSpec {
    pub token_ids: Vec<u32>,
}

impl KindSpec for BanTokensSpec {
    fn check(&self) -> Result<()> {
        check_len("token_ids", self.token_ids.len())
    }

    fn realize(&self, context: &EngineContext, _: usize) -> Result<Box<dyn LogitsProcessor>> {
        context.check_ids("token_ids", self.token_ids.iter().copied())?;
        Ok(Box::new(BanTokens::new(self.token_ids.clone())))
    }
}

/// Sets the logits of a fixed set of tokens to `-inf` at every step. Costs O(number of tokens)
/// per step on top of the row's pass for short lists, and O(largest id / 32) for long ones.
#[derive(Debug, Clone, PartialEq)]
pub struct BanTokens {
    token_ids: Vec<u32>,
    // For long lists: bit set = allowed, up to the largest banned id.
    mask: Option<Vec<u32>>,
}

impl BanTokens {
    pub fn new(mut token_ids: Vec<u32>) -> Self {
        token_ids.sort_unstable();
        token_ids.dedup();
        let mask = (token_ids.len() > MASK_FROM).then(|| {
            let words = (*token_ids.last().unwrap() as usize + 1).div_ceil(32);
            let mut mask = vec![u32::MAX; words];
            for &token in &token_ids {
                mask[token as usize / 32] &= !(1 << (token % 32));
            }
            mask
        });
        Self { token_ids, mask }
    }

    pub fn token_ids(&self) -> &[u32] {
        &self.token_ids
    }
}

impl LogitsProcessor for BanTokens {
    fn plan(&mut self, _ids: &dyn TokenHistory, plan: &mut RowPlan) -> Result<()> {
        match &self.mask {
            Some(mask) => plan.push_mask(mask, true),
            None => {
                for &token in &self.token_ids {
                    plan.push(Edit::Ban { token });
                }
            }
        }
        Ok(())
    }

    fn undo(&mut self) {}

    fn max_token_id(&self) -> Option<u32> {
        self.token_ids.last().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_and_short_lists_ban_the_same_tokens() {
        let ids: Vec<u32> = (0..2000).map(|i| i * 7 % 4001).collect();
        let mut row = vec![1.0f32; 4100];
        crate::process_row(&mut BanTokens::new(ids.clone()), &[0u32; 0], &mut row).unwrap();
        let mut expected = vec![1.0f32; 4100];
        for &id in &ids {
            expected[id as usize] = f32::NEG_INFINITY;
        }
        assert_eq!(row, expected);
    }
}
