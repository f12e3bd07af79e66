//! Bans pushed as the cheapest edit: one sparse edit per token, or a bitmask for a long list.

use crate::plan::{Edit, RowPlan};

/// Ban lists longer than this are pushed as a bitmask: one bit per token up to the largest id,
/// applied word by word in the row's pass, instead of one sparse edit per token.
pub(crate) const MASK_FROM: usize = 256;

/// Bans `tokens` (sorted, distinct): a sparse edit each, or one bitmask for a long list.
pub(crate) fn push_bans(plan: &mut RowPlan, tokens: &[u32]) {
    match tokens.last() {
        Some(&last) if tokens.len() > MASK_FROM => {
            plan.push_mask_with((last as usize + 1).div_ceil(32), true, |words| {
                words.fill(u32::MAX);
                for &token in tokens {
                    words[token as usize / 32] &= !(1 << (token % 32));
                }
            })
        }
        _ => {
            for &token in tokens {
                plan.push(Edit::Ban { token });
            }
        }
    }
}
