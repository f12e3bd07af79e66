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
