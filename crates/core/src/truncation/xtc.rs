//! XTC's row math: the cut that removes every value above the least likely one whose
//! probability reaches the threshold.

use crate::truncation::select::lowest_reaching;
use crate::truncation::{heavy, largest, lowest_reaching_near, Band, Softmax, Work};

/// The band XTC's cut keeps: `v` the smallest value whose probability reaches `threshold`
/// (`q >= threshold * S`), every value above `v` removed, when there is one and at least
/// `min_keep` finite values stay; otherwise everything. For `min_keep` 1, from the values that
/// weigh anything when they are few ([`heavy`]: one pass).
#[inline(always)]
pub(crate) fn band(values: &[f32], threshold: f32, min_keep: usize, work: &mut Work) -> Band {
    let mut known = None;
    if min_keep == 1 {
        let near = heavy(values, false, work, |near, softmax, work| {
            let v = lowest_reaching_near(near, softmax.max, threshold * softmax.scale(), work)?;
            // The values above `v` are among the values near the maximum.
            Some(match near.iter().any(|&x| x > v) {
                true => Band {
                    lo: f32::NEG_INFINITY,
                    hi: v,
                },
                false => Band::ALL,
            })
        });
        match near {
            Ok(band) => return band,
            Err(max) => known = max,
        }
    }
    let max = known.unwrap_or_else(|| largest(values));
    if !max.is_finite() {
        return Band::ALL;
    }
    let softmax = Softmax::weights_only(values, max);
    let v = lowest_reaching(values, max, threshold * softmax.scale(), work);
    let removed = values.iter().filter(|&&x| x > v).count();
    if removed == 0 {
        return Band::ALL;
    }
    if min_keep > 1 {
        let finite = values.iter().filter(|x| x.is_finite()).count();
        if finite - removed < min_keep {
            return Band::ALL;
        }
    }
    Band {
        lo: f32::NEG_INFINITY,
        hi: v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_at_the_last_place_are_kept_together() {
        let b = band(&[2.0, 2.0, 2.0, -4.0], 0.1, 1, &mut vec![]);
        assert_eq!(b, Band::ALL);
        let b = band(&[3.0, 2.0, 2.0, -4.0], 0.1, 1, &mut vec![]);
        assert_eq!(b.hi, 2.0);
        // A threshold of 0: every finite token reaches it; the least likely stays, -inf aside.
        let b = band(&[3.0, 2.0, f32::NEG_INFINITY, -4.0], 0.0, 1, &mut vec![]);
        assert_eq!(b.hi, -4.0);
    }
}
