//! Inf/NaN removal's row math.

use crate::logit::Logit;

/// NaN to `0.0`, `+inf` to `T::MAX`, `-inf` to `-T::MAX` (torch's `finfo(dtype).max` and `.min`),
/// every finite value as it is: transformers' three `torch.where`s.
pub(super) fn apply<T: Logit>(row: &mut [T]) {
    let min = T::from_f32(-T::MAX.to_f32());
    for x in row.iter_mut() {
        if !x.is_finite() {
            let v = x.to_f32();
            *x = if v.is_nan() {
                T::from_f32(0.0)
            } else if v > 0.0 {
                T::MAX
            } else {
                min
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    #[test]
    fn non_finite_values_become_the_types_extremes_and_zero() {
        let mut row = [1.5f32, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0];
        apply(&mut row);
        assert_eq!(row[..4], [1.5, 0.0, f32::MAX, f32::MIN]);
        assert!(row[4] == 0.0 && row[4].is_sign_negative());
        let mut half = [f16::NAN, f16::INFINITY, f16::NEG_INFINITY];
        apply(&mut half);
        assert_eq!(half, [f16::ZERO, f16::MAX, f16::MIN]);
        let mut brain = [bf16::NAN, bf16::INFINITY, bf16::NEG_INFINITY];
        apply(&mut brain);
        assert_eq!(brain, [bf16::ZERO, bf16::MAX, bf16::MIN]);
    }
}
