//! Top-H's row math (transformers' `TopHLogitsWarper`): among the 100 largest values, in
//! descending order, keep a prefix while the cumulative entropy `sum -p ln p` of its
//! probabilities (a softmax over those 100 alone) stays within `top_h` times their entropy.

use crate::truncation::kth_largest;
use crate::truncation::Band;
use crate::truncation::Work;

/// transformers' fixed candidate count (`self.top_n = 100`).
pub(crate) const TOP_N: usize = 100;

/// The band top-H keeps. The candidates are the finite values from the `TOP_N`-th largest up
/// (a selection, then a sort of at most `TOP_N` values). The sums run in f64, the cumulative
/// one in rank order as torch's CPU `cumsum` (which accumulates f32 in double); a term whose f32
/// probability underflows to 0 ends the prefix, as transformers' `-0 * ln 0` is NaN there and
/// NaN never passes `<= tau`. Ties at the boundary are all kept, as in the other rules.
#[inline(always)]
pub(crate) fn band(values: &[f32], top_h: f32, work: &mut Work) -> Band {
    let finite = values.iter().filter(|x| x.is_finite()).count();
    if finite == 0 || values.contains(&f32::INFINITY) {
        return Band::ALL;
    }
    let n = TOP_N.min(finite);
    let floor = kth_largest(values, n, work).max(f32::MIN);
    let mut top: Vec<f32> = values
        .iter()
        .copied()
        .filter(|&x| x.is_finite() && x >= floor)
        .collect();
    top.sort_unstable_by(|a, b| b.total_cmp(a));
    top.truncate(n);
    let max = top[0] as f64;
    let sum: f64 = top.iter().map(|&x| (x as f64 - max).exp()).sum();
    let lse = max + sum.ln();
    let entropy: f64 = -top
        .iter()
        .map(|&x| {
            let l = x as f64 - lse;
            l * l.exp()
        })
        .sum::<f64>();
    let tau = entropy * top_h as f64;
    let mut cumulative = 0.0f64;
    let mut last = 0;
    for (rank, &x) in top.iter().enumerate() {
        let l = x as f64 - lse;
        if rank > 0 && (l as f32).exp() == 0.0 {
            break;
        }
        cumulative += -(l.exp()) * l;
        if rank == 0 || cumulative <= tau {
            last = rank;
        } else {
            break;
        }
    }
    Band {
        lo: top[last],
        hi: f32::INFINITY,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_largest_and_a_prefix() {
        let row = [3.0f32, 1.0, 2.0, 0.0, f32::NEG_INFINITY];
        let b = band(&row, 1.0, &mut vec![]);
        assert!(!b.removes(0.0), "top_h 1 keeps every finite candidate");
        let b = band(&row, 0.01, &mut vec![]);
        assert_eq!(b.lo, 3.0, "a small top_h keeps the largest alone");
        let b = band(&[f32::NEG_INFINITY, 1.0], 0.5, &mut vec![]);
        assert_eq!(b.lo, 1.0, "one finite token");
    }

    #[test]
    fn only_the_hundred_largest_are_candidates() {
        let row: Vec<f32> = (0..300).map(|i| -(i as f32) * 1e-3).collect();
        let b = band(&row, 1.0, &mut vec![]);
        assert_eq!(b.lo, row[99]);
    }
}
