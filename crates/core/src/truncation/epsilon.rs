//! Epsilon's and eta's row math: the values whose probability is at least `epsilon` (eta: at
//! least `min(epsilon, sqrt(epsilon) * exp(-entropy))`).

use crate::truncation::select::with_min_keep;
use crate::truncation::{heavy, largest, lowest_reaching_near, Band, Softmax, Truncation, Work};
#[cfg(target_arch = "x86_64")]
use crate::truncation::{select::lowest_reaching, simd};

/// The band epsilon or eta (`rule`) keeps: the sums over the row, then the lowest value whose `q`
/// reaches the rule's threshold; at least `min_keep` values. From the values that weigh anything
/// when they are few ([`heavy`]: one pass) and the threshold is not tiny.
#[inline(always)]
pub(crate) fn band(values: &[f32], rule: &Truncation, min_keep: usize, work: &mut Work) -> Band {
    let eta = matches!(rule, Truncation::Eta { .. });
    let near = heavy(values, eta, work, |near, softmax, work| {
        let lo = lowest_reaching_near(near, softmax.max, softmax.threshold(rule), work)?;
        Some((lo, softmax.max))
    });
    let max = match near {
        Ok((lo, max)) => return with_min_keep(values, lo, max, min_keep, work),
        Err(max) => max.unwrap_or_else(|| largest(values)),
    };
    if !max.is_finite() {
        // No distribution (as `Softmax::is_defined`).
        return Band::ALL;
    }
    #[cfg(target_arch = "x86_64")]
    if simd::available() && values.len() < 1 << 21 {
        // The sums in one pass, then the lowest value whose `q` reaches the
        // threshold by comparison (`exp` only near it).
        let (sum, entropy_sum) = simd::sums(values, max, eta);
        let softmax = Softmax {
            max,
            sum,
            entropy_sum,
        };
        let threshold = softmax.threshold(rule);
        let lo = lowest_reaching(values, max, threshold, work);
        return with_min_keep(values, lo, max, min_keep, work);
    }
    // A plain loop, not a closure: inlined into the FMA-compiled caller.
    let softmax = Softmax::of(values);
    let threshold = softmax.threshold(rule);
    let mut lo = f32::INFINITY;
    for &x in values {
        if !x.is_nan() && softmax.q(x) >= threshold {
            lo = lo.min(x);
        }
    }
    with_min_keep(values, lo, max, min_keep, work)
}
