//! Adaptive-p's row math: the softmax's maximum and sum, for the transform toward the target.

use crate::reshape::Shape;
use crate::truncation::{largest, Softmax};

/// The shape adaptive-p gives `values`: the softmax's maximum and sum, and the target.
#[inline(always)]
pub(crate) fn shape(values: &[f32], target: f32) -> Shape {
    let max = largest(values);
    if !max.is_finite() {
        return Shape::Identity;
    }
    let softmax = Softmax::weights_only(values, max);
    Shape::AdaptiveP {
        max,
        scale: softmax.scale(),
        target,
    }
}
