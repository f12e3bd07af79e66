//! The element types a logits row may hold: f32, f16 and bf16.

use half::{bf16, f16};

use crate::kernels::{self, Pass};

/// A logit element. Arithmetic is done in f32; f16 and bf16 results are rounded back to nearest-even,
/// which is what torch does for these dtypes.
pub trait Logit: Copy + Send + Sync + PartialEq + std::fmt::Debug + 'static {
    /// The element type's name, as torch and numpy spell it.
    const DTYPE: DType;
    const NEG_INFINITY: Self;
    /// The largest finite value (torch's `finfo(dtype).max`; the smallest is its negation).
    const MAX: Self;
    fn to_f32(self) -> f32;
    fn from_f32(value: f32) -> Self;
    /// Whether the value is neither infinite nor NaN.
    #[inline(always)]
    fn is_finite(self) -> bool {
        self.exponent_unset() != 0
    }
    /// The exponent bits that are clear: zero exactly when the value is infinite or NaN. An
    /// integer, so that a scan of a row OR-reduces it in vector registers.
    #[doc(hidden)]
    fn exponent_unset(self) -> u32;
    /// Divides every element by `divisor` in place, as IEEE division rounds it (f16 and bf16:
    /// divided in f32, rounded back to nearest-even), which is what torch's CPU `div_` gives.
    fn divide_row(row: &mut [Self], divisor: f32) {
        Self::divide(Pass::in_place(row), divisor)
    }

    /// [`Logit::divide_row`] from `src` into `dst` (of the same length).
    fn divide_into(src: &[Self], dst: &mut [Self], divisor: f32) {
        Self::divide(Pass::between(src, dst), divisor)
    }

    #[doc(hidden)]
    fn divide(pass: Pass<Self>, divisor: f32);

    /// The row itself when its elements are f32 (read in place, without a widened copy).
    #[doc(hidden)]
    fn as_f32(row: &[Self]) -> Option<&[f32]> {
        let _ = row;
        None
    }

    /// [`Logit::as_f32`], writable.
    #[doc(hidden)]
    fn as_f32_mut(row: &mut [Self]) -> Option<&mut [f32]> {
        let _ = row;
        None
    }
}

impl Logit for f32 {
    fn divide(pass: Pass<Self>, divisor: f32) {
        kernels::divide_f32(pass, divisor)
    }
    fn as_f32(row: &[Self]) -> Option<&[f32]> {
        Some(row)
    }
    fn as_f32_mut(row: &mut [Self]) -> Option<&mut [f32]> {
        Some(row)
    }
    const DTYPE: DType = DType::F32;
    const NEG_INFINITY: Self = f32::NEG_INFINITY;
    const MAX: Self = f32::MAX;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn exponent_unset(self) -> u32 {
        !self.to_bits() & 0x7f80_0000
    }
    #[inline(always)]
    fn from_f32(value: f32) -> Self {
        value
    }
}

impl Logit for f16 {
    fn divide(pass: Pass<Self>, divisor: f32) {
        kernels::divide_f16(pass, divisor)
    }
    const DTYPE: DType = DType::F16;
    const NEG_INFINITY: Self = f16::NEG_INFINITY;
    const MAX: Self = f16::MAX;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn exponent_unset(self) -> u32 {
        u32::from(!self.to_bits() & 0x7c00)
    }
    #[inline(always)]
    fn from_f32(value: f32) -> Self {
        f16::from_f32(value)
    }
}

impl Logit for bf16 {
    fn divide(pass: Pass<Self>, divisor: f32) {
        kernels::divide_bf16(pass, divisor)
    }
    const DTYPE: DType = DType::BF16;
    const NEG_INFINITY: Self = bf16::NEG_INFINITY;
    const MAX: Self = bf16::MAX;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline(always)]
    fn exponent_unset(self) -> u32 {
        u32::from(!self.to_bits() & 0x7f80)
    }
    #[inline(always)]
    fn from_f32(value: f32) -> Self {
        bf16::from_f32(value)
    }
}

/// The runtime tag of a [`Logit`] type, for callers that hold untyped buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_finite_agrees_with_the_value_for_every_half_and_some_f32() {
        for bits in 0..=u16::MAX {
            let (h, b) = (f16::from_bits(bits), bf16::from_bits(bits));
            assert_eq!(Logit::is_finite(h), h.to_f32().is_finite(), "{bits:#x}");
            assert_eq!(Logit::is_finite(b), b.to_f32().is_finite(), "{bits:#x}");
        }
        for x in [
            0.0f32,
            -0.0,
            1e-45,
            f32::MAX,
            f32::MIN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ] {
            assert_eq!(Logit::is_finite(x), x.is_finite(), "{x}");
        }
    }
}
