//! EOS id lists, shared by the length processors.

use crate::error::{Error, Result};
use crate::spec::{check_len, SpecContext};

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
pub(crate) fn eos_ids(context: &SpecContext, ids: &[u32]) -> Result<Vec<u32>> {
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
