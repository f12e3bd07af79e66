//! Top-a's row math: the values whose probability is at least `a` times the square of the
//! largest.

use crate::truncation::select::{lowest_reaching, with_min_keep};
use crate::truncation::{heavy, largest, lowest_reaching_near, Band, Softmax, Work};

/// The band top-a keeps. With `q = exp(x - max)` and `S` the sum of the `q`s (the fixed-point sum
/// of the truncation module), `p = q / S` and `p_max = 1 / S`, so the rule is `q >= a / S`: one
/// vectorized pass for `S`, then one pass of compares, `q` computed only for the values within a
/// margin of `max + ln(a / S)` ([`lowest_reaching`]); or from the values that weigh anything when
/// they are few ([`heavy`]: one pass).
#[inline(always)]
pub(crate) fn band(values: &[f32], a: f32, min_keep: usize, work: &mut Work) -> Band {
    if a <= 0.0 {
        return Band::ALL;
    }
    let near = heavy(values, false, work, |near, softmax, work| {
        let lo = lowest_reaching_near(near, softmax.max, a / softmax.scale(), work)?;
        Some((lo, softmax.max))
    });
    let max = match near {
        Ok((lo, max)) => return with_min_keep(values, lo, max, min_keep, work),
        Err(max) => max.unwrap_or_else(|| largest(values)),
    };
    if !max.is_finite() {
        return Band::ALL;
    }
    let softmax = Softmax::weights_only(values, max);
    let threshold = a / softmax.scale();
    let lo = lowest_reaching(values, max, threshold, work);
    with_min_keep(values, lo, max, min_keep, work)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// text-generation-webui's `TopALogitsWarper`, in f64: sort, softmax, remove
    /// `probs < probs_max^2 * a`, keep `min_tokens_to_keep`.
    fn webui(values: &[f32], a: f64, min_keep: usize) -> Vec<bool> {
        let max = values.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
        let q: Vec<f64> = values.iter().map(|&x| (x as f64 - max).exp()).collect();
        let s: f64 = q.iter().sum();
        let p_max = 1.0 / s;
        let mut order: Vec<usize> = (0..values.len()).collect();
        order.sort_by(|&i, &j| values[j].total_cmp(&values[i]));
        let mut keep: Vec<bool> = q.iter().map(|&q| q / s >= p_max * p_max * a).collect();
        for &i in order.iter().take(min_keep) {
            keep[i] = true;
        }
        keep
    }

    #[test]
    fn equals_text_generation_webui_away_from_the_threshold() {
        let mut seed = 11u64;
        for len in [2usize, 5, 300, 20_000] {
            for a in [0.0f64, 0.01, 0.2, 0.9] {
                for min_keep in [1usize, 3] {
                    let row: Vec<f32> = (0..len)
                        .map(|_| {
                            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                            ((seed >> 40) as f32 / (1u64 << 24) as f32) * 10.0 - 5.0
                        })
                        .collect();
                    let b = band(&row, a as f32, min_keep, &mut vec![]);
                    let kept: Vec<bool> = row.iter().map(|&x| !b.removes(x)).collect();
                    let expected = webui(&row, a, min_keep);
                    let differ = kept.iter().zip(&expected).filter(|(x, y)| x != y).count();
                    assert!(differ <= 1, "len {len} a {a}: {differ} differ");
                }
            }
        }
    }
}
