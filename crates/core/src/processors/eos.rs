//! EOS id lists, shared by the length processors.

use crate::error::{Error, Result};
use crate::plan::{Edit, ForcedValue, RowPlan};
use crate::spec::{check_len, EngineContext};

/// EOS ids to force a row to: every logit `-inf` but theirs, which become `0.0`. One id is a
/// force of the row (a write-only fill); several are a mask and a set per id.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ForcedEosIds {
    // Sorted and distinct.
    ids: Vec<u32>,
    // Bit set for each id (several ids only).
    mask: Vec<u32>,
}

impl ForcedEosIds {
    pub(crate) fn new(ids: &[u32]) -> Self {
        let ids = distinct(ids);
        let mut mask = vec![];
        if ids.len() > 1 {
            mask = vec![0u32; (*ids.last().unwrap() as usize + 1).div_ceil(32)];
            for &token in &ids {
                mask[token as usize / 32] |= 1 << (token % 32);
            }
        }
        Self { ids, mask }
    }

    /// Plans the force.
    pub(crate) fn push(&self, plan: &mut RowPlan) {
        match self.ids[..] {
            [] => {}
            [token] => plan.push(Edit::Force {
                token,
                value: ForcedValue::Set(0.0),
            }),
            _ => {
                plan.push_mask(&self.mask, false);
                for &token in &self.ids {
                    plan.push(Edit::Set { token, value: 0.0 });
                }
            }
        }
    }

    pub(crate) fn max_token_id(&self) -> Option<u32> {
        self.ids.last().copied()
    }
}

/// Checks a spec's `eos_token_ids`: at least one id, within the size limit.
pub(crate) fn check_eos(ids: &[u32]) -> Result<()> {
    check_len("eos_token_ids", ids.len())?;
    if ids.is_empty() {
        return Err(Error::argument(
            "eos_token_ids",
            "must list at least one id",
        ));
    }
    Ok(())
}

/// The ids checked against the vocab, sorted and distinct.
pub(crate) fn eos_ids(context: &EngineContext, ids: &[u32]) -> Result<Vec<u32>> {
    check_eos(ids)?;
    context.check_ids("eos_token_ids", ids.iter().copied())?;
    Ok(distinct(ids))
}

pub(crate) fn distinct(ids: &[u32]) -> Vec<u32> {
    let mut ids = ids.to_vec();
    ids.sort_unstable();
    ids.dedup();
    ids
}
