//! Smoothing's row math: quadratic sampling around the row's largest value.

use crate::reshape::Shape;

/// The shape smoothing gives `values`: the webui's constants around the row's largest value.
#[inline(always)]
pub(crate) fn shape(values: &[f32], k: f32, s: f32) -> Shape {
    let max = crate::truncation::largest(values);
    if !max.is_finite() {
        return Shape::Identity;
    }
    Shape::Quadratic { max, k, s }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_keeps_its_bits_one_value_or_a_row_at_a_time() {
        let shape = shape(&[1.0, f32::NAN, -3.0], 0.4, 0.8);
        let nans = [f32::NAN, -f32::NAN, f32::from_bits(0x7fc0_1234)];
        let mut row = nans;
        shape.apply_row(&mut row);
        for (x, y) in nans.into_iter().zip(row) {
            assert_eq!(shape.apply(x).to_bits(), x.to_bits());
            assert_eq!(y.to_bits(), x.to_bits());
        }
    }
}
