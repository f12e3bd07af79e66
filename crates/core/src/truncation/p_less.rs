//! P-less's row math: the values whose probability is at least the row's collision probability
//! `sum p^2` (the chance that two independent draws agree), or, normalized (p-less-norm),
//! `(n sum p^2 - 1) / (n - 1)` over the row's `n` candidates.

use crate::truncation::select::{lowest_reaching, with_min_keep};
use crate::truncation::{exp, fixed_square, largest, Band, Softmax, Work, FIXED_BITS};

/// The band p-less keeps. With `q = exp(x - max)`, `S = sum q` and `p = q / S`, the rule
/// `p >= sum p^2` is `q >= sum q^2 / S`: one pass for `S` (the module's fixed-point sum), one for
/// `sum q^2` (fixed point too, [`fixed_square`]: exact in any order, so the device's band kernel
/// gives the same), then [`lowest_reaching`]'s compares. The largest value always reaches the
/// threshold (`p_max >= sum p^2`), so the band is never empty; ties at the threshold are kept.
/// `normalized`: the paper's p-less-norm, `p >= (n sum p^2 - 1) / (n - 1)` with `n` the finite
/// values (the authors' code takes the vocab size: the same on a row no earlier step cut), which
/// is `q >= (n sum q^2 / S - S) / (n - 1)`; it keeps at least what p-less keeps.
#[inline(always)]
pub(crate) fn band(values: &[f32], min_keep: usize, normalized: bool, work: &mut Work) -> Band {
    let max = largest(values);
    if !max.is_finite() {
        return Band::ALL;
    }
    let s = Softmax::weights_only(values, max).scale() as f64;
    let (squares, candidates) = values
        .iter()
        .filter(|x| !x.is_nan() && **x != f32::NEG_INFINITY)
        .fold((0u64, 0usize), |(sum, n), &x| {
            (sum + fixed_square(exp(x - max)), n + 1)
        });
    let collision = squares as f64 / (1u64 << FIXED_BITS) as f64 / s;
    let threshold = match (normalized, candidates) {
        (false, _) => collision,
        // One candidate: it is the row's whole mass, kept.
        (true, 0..=1) => 0.0,
        (true, n) => ((n as f64 * collision - s) / (n as f64 - 1.0)).max(0.0),
    };
    // Never above 1, the largest value's q: the maximum stays kept whatever the rounding.
    let threshold = (threshold as f32).min(1.0);
    let lo = lowest_reaching(values, max, threshold, work);
    with_min_keep(values, lo, max, min_keep, work)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The paper's definition in f64: softmax, keep `p_i >= sum_j p_j^2`, then the `min_keep`
    /// largest.
    fn definition(values: &[f32], min_keep: usize, normalized: bool) -> Vec<bool> {
        let max = values.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
        let q: Vec<f64> = values.iter().map(|&x| (x as f64 - max).exp()).collect();
        let s: f64 = q.iter().sum();
        let p: Vec<f64> = q.iter().map(|q| q / s).collect();
        let collision: f64 = p.iter().map(|p| p * p).sum();
        let n = values.iter().filter(|x| x.is_finite()).count() as f64;
        let threshold = match normalized {
            false => collision,
            true if n <= 1.0 => 0.0,
            true => (n * collision - 1.0) / (n - 1.0),
        };
        let mut order: Vec<usize> = (0..values.len()).collect();
        order.sort_by(|&i, &j| values[j].total_cmp(&values[i]));
        let mut keep: Vec<bool> = p.iter().map(|&p| p >= threshold).collect();
        for &i in order.iter().take(min_keep) {
            keep[i] = true;
        }
        keep
    }

    fn kept(row: &[f32], min_keep: usize) -> Vec<bool> {
        kept_by(row, min_keep, false)
    }

    fn kept_by(row: &[f32], min_keep: usize, normalized: bool) -> Vec<bool> {
        let b = band(row, min_keep, normalized, &mut vec![]);
        row.iter().map(|&x| !b.removes(x)).collect()
    }

    #[test]
    fn equals_the_definition_away_from_the_threshold() {
        let mut seed = 7u64;
        for len in [1usize, 2, 5, 300, 20_000] {
            for spread in [0.5f32, 4.0, 20.0] {
                for (min_keep, normalized) in [(1usize, false), (3, false), (1, true), (3, true)] {
                    let row: Vec<f32> = (0..len)
                        .map(|i| {
                            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                            if i % 7 == 3 {
                                f32::NEG_INFINITY
                            } else {
                                ((seed >> 40) as f32 / (1u64 << 24) as f32) * spread - spread / 2.0
                            }
                        })
                        .collect();
                    let expected = definition(&row, min_keep, normalized);
                    let differ = kept_by(&row, min_keep, normalized)
                        .iter()
                        .zip(&expected)
                        .filter(|(x, y)| x != y)
                        .count();
                    assert!(differ <= 1, "len {len} spread {spread}: {differ} differ");
                }
            }
        }
    }

    #[test]
    fn worked_cases() {
        let ninf = f32::NEG_INFINITY;
        // p = (2/3, 1/6, 1/6): sum p^2 = 1/2, only the first reaches it.
        let l4 = 4f32.ln();
        assert_eq!(kept(&[l4 + 0.7, 0.7, 0.7], 1), [true, false, false]);
        // Uniform: sum p^2 = 1/n = every p, the ties all kept.
        assert_eq!(kept(&[1.0, 1.0, 1.0, 1.0], 1), [true; 4]);
        // One finite value: kept, the rest were already -inf.
        assert_eq!(kept(&[ninf, 3.0, ninf], 1), [false, true, false]);
        // min_keep widens the band to the k largest.
        assert_eq!(kept(&[l4 + 0.7, 0.7, 0.2], 2), [true, true, false]);
        // No finite value: nothing to decide.
        assert_eq!(band(&[ninf, ninf], 1, false, &mut vec![]), Band::ALL);
        // Normalized: p = (2/3, 1/6, 1/6), n = 3: (3/2 - 1) / 2 = 1/4, still only the first;
        // p = (1/2, 1/4, 1/4): sum p^2 = 3/8, (9/8 - 1) / 2 = 1/16, all three (p-less: one).
        assert_eq!(
            kept_by(&[l4 + 0.7, 0.7, 0.7], 1, true),
            [true, false, false]
        );
        let l2 = 2f32.ln();
        assert_eq!(kept_by(&[l2, 0.0, 0.0], 1, true), [true; 3]);
        assert_eq!(kept_by(&[l2, 0.0, 0.0], 1, false), [true, false, false]);
        assert_eq!(kept_by(&[ninf, 3.0, ninf], 1, true), [false, true, false]);
    }
}
