//! Top-k's row math: the `k` largest values (every tie of the k-th).

use crate::truncation::select::kth_largest;
use crate::truncation::{Band, Work};

/// The band top-k keeps: from the `max(k, min_keep)`-th largest value up.
#[inline(always)]
pub(crate) fn band(values: &[f32], k: u32, min_keep: u32, work: &mut Work) -> Band {
    Band {
        lo: kth_largest(values, k.max(min_keep) as usize, work),
        hi: f32::INFINITY,
    }
}
