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

#[cfg(test)]
mod tests {
    use crate::truncation::Truncation;

    #[test]
    fn top_k_keeps_ties_and_everything_when_k_exceeds_the_row() {
        let x = [1.0f32, 3.0, 3.0, 2.0, f32::NEG_INFINITY];
        let band = Truncation::TopK { k: 2, min_keep: 1 }.band(&x, &mut vec![]);
        let kept: Vec<bool> = x.iter().map(|&v| !band.removes(v)).collect();
        assert_eq!(kept, [false, true, true, false, false]);
        let all = Truncation::TopK { k: 50, min_keep: 1 }.band(&x, &mut vec![]);
        assert_eq!(all.lo, f32::NEG_INFINITY);
    }
}
