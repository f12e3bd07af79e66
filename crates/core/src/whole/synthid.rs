//! SynthID Text's score update (transformers' `update_scores`): the row's softmax, a tournament
//! update per depth, then its log.

use crate::logit::Logit;
use crate::synthid::Watermark;

/// The value `x` has in `T`, as f32.
#[inline(always)]
fn round<T: Logit>(x: f32) -> f32 {
    T::from_f32(x).to_f32()
}

/// `probs = softmax(row)`; per depth `d`, `probs *= 1 + g_d - sum(g_d * probs)`; then
/// `log(probs)`, a non-finite log becoming `-T::MAX` (torch's `finfo.min`). Each operation is
/// rounded to `T` as torch rounds it on a tensor of that type; the softmax's sum and the masses
/// are summed in f64 (torch sums in f32, in its own order), so a value may differ from torch's
/// by a few units in the last place. NaN takes no part and stays NaN; a row whose largest value
/// is not finite (none finite, or `+inf`) is left as it is (torch gives every logit `finfo.min`).
pub(super) fn apply<T: Logit>(row: &mut [T], watermark: &Watermark, context: i64) {
    let values: Vec<f32> = row.iter().map(|x| x.to_f32()).collect();
    let max = crate::truncation::largest(&values);
    if !max.is_finite() {
        return;
    }
    // A NaN takes no part: its probability is 0 in the sums and its logit is not written.
    let q: Vec<f64> = values
        .iter()
        .map(|&x| {
            if x.is_nan() {
                0.0
            } else {
                ((x - max) as f64).exp()
            }
        })
        .collect();
    let sum: f64 = q.iter().sum();
    let mut probs: Vec<f32> = q.iter().map(|&q| round::<T>((q / sum) as f32)).collect();
    drop(q);
    let g: Vec<u64> = (0..row.len())
        .map(|v| watermark.g_bits(context, v as i64))
        .collect();
    for d in 0..watermark.depth() {
        let mass: f64 = probs
            .iter()
            .zip(&g)
            .map(|(&p, &bits)| p as f64 * (bits >> d & 1) as f64)
            .sum();
        let mass = round::<T>(mass as f32);
        let factors = [round::<T>(1.0 - mass), round::<T>(2.0 - mass)];
        for (p, &bits) in probs.iter_mut().zip(&g) {
            *p = round::<T>(*p * factors[(bits >> d & 1) as usize]);
        }
    }
    let min = T::from_f32(-T::MAX.to_f32());
    for ((x, &p), &v) in row.iter_mut().zip(&probs).zip(&values) {
        if v.is_nan() {
            continue;
        }
        let log = (p as f64).ln() as f32;
        *x = if log.is_finite() {
            T::from_f32(log)
        } else {
            min
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_update_keeps_a_distribution_and_banned_tokens_at_the_minimum() {
        let watermark = Watermark::new(&[654, 400, 836], 1 << 16, 0).unwrap();
        let mut row = [1.0f32, 2.0, f32::NEG_INFINITY, 0.5, -1.0, f32::NAN];
        apply(
            &mut row,
            &watermark,
            crate::synthid::context_hash([0, 0, 0]),
        );
        assert_eq!(row[2], f32::MIN);
        assert!(row[5].is_nan());
        let total: f64 = row[..5].iter().map(|&y| (y as f64).exp()).sum();
        assert!((total - 1.0).abs() < 1e-5, "{total}");
        let mut none = [f32::NEG_INFINITY; 3];
        apply(&mut none, &watermark, 1);
        assert_eq!(none, [f32::NEG_INFINITY; 3]);
    }
}
