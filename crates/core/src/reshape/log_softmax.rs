//! Log-softmax's row math: every value less the row's log-sum-exp.

use crate::reshape::Shape;

/// The shape log-softmax gives `values`: `(x - max) - ln(sum exp(x - max))` over the values that
/// are not NaN, as torch's `log_softmax` computes it, with the truncation rules' arithmetic (their
/// exact fixed-point sum `S`, and [`crate::truncation::ln`] of it in f64, rounded to f32), which
/// the device computes bit for bit. A row whose largest value is not finite is left as it is
/// (torch would give NaN).
#[inline(always)]
pub(crate) fn shape(values: &[f32]) -> Shape {
    let max = crate::truncation::largest(values);
    if !max.is_finite() {
        return Shape::Identity;
    }
    let sum = crate::truncation::Softmax::weights_only(values, max).sum_f64();
    Shape::LogSoftmax {
        max,
        log_sum: crate::truncation::ln(sum) as f32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_values_become_log_probabilities() {
        let row = [2.0f32, 1.0, f32::NEG_INFINITY, 0.0];
        let shape = shape(&row);
        let out: Vec<f32> = row.iter().map(|&x| shape.apply(x)).collect();
        let total: f64 = out.iter().map(|&y| (y as f64).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6, "{total}");
        assert_eq!(out[2], f32::NEG_INFINITY);
        // Differences between logits stay.
        assert!((out[0] - out[1] - 1.0).abs() < 1e-6);
        assert_eq!(super::shape(&[f32::NEG_INFINITY; 3]), Shape::Identity);
    }
}
