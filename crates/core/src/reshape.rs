//! Row-dependent value transforms: a rule that reads the row as it stands where it runs (its
//! entropy, its maximum) and resolves to an element-wise [`Shape`], applied in the row's one pass
//! like a truncation's band.
//!
//! Each rule's row math is one file beside this one, a `shape` function that [`Reshape::shape`]
//! dispatches to: `dynamic_temperature.rs`, `smoothing.rs`, `adaptive_p.rs` and `log_softmax.rs`. The kinds (in
//! `crate::processors`) decide which rule runs with which parameters; nothing here imports them.

mod adaptive_p;
mod dynamic_temperature;
mod log_softmax;
mod smoothing;

use crate::logit::Logit;

/// The smallest temperature: a logit of `1e4` divided by it is `1e34`, well within f32; below
/// it logits become infinite (a subnormal one, `1e-45`, turns every logit above `5e-7` into
/// infinity).
pub const MIN_TEMPERATURE: f64 = 1e-30;

/// A transform whose parameters come from the row ([`crate::Edit::Reshape`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Reshape {
    /// llama.cpp's entropy-scaled temperature (`temp_ext`): see
    /// [`crate::processors::DynamicTemperatureSpec`].
    DynamicTemperature {
        temperature: f32,
        range: f32,
        exponent: f32,
    },
    /// text-generation-webui's quadratic sampling with its constants `k * factor` and
    /// `s * factor`: see [`crate::processors::SmoothingSpec`].
    Smoothing { k: f32, s: f32 },
    /// llama.cpp's adaptive-p transform toward the step's adapted target probability; `key`
    /// tells one step's rule from another's: see [`crate::processors::AdaptivePSpec`].
    AdaptiveP { target: f32, key: u32 },
    /// `log_softmax` over the row: see [`crate::processors::LogSoftmaxSpec`].
    LogSoftmax,
}

impl Reshape {
    /// Whether only the CPU path has this rule (the device's band kernel has all but dynamic
    /// temperature).
    pub fn on_cpu_only(&self) -> bool {
        matches!(self, Reshape::DynamicTemperature { .. })
    }

    /// Whether the rule's pass keeps what it read for its processor's next step
    /// ([`crate::RowPlan::observed`]): adaptive-p's.
    pub fn observes(&self) -> bool {
        matches!(self, Reshape::AdaptiveP { .. })
    }

    /// The shape this rule gives `values` (the row as it stands where the rule runs). Compiled
    /// for FMA and AVX2 where the CPU has them, as [`crate::Truncation::band`] is (the same bits:
    /// the fixed-point sums are exact and `fmaf` is correctly rounded either way).
    pub fn shape(&self, values: &[f32]) -> Shape {
        #[cfg(target_arch = "x86_64")]
        if crate::cpu::avx2_fma() {
            // SAFETY: the CPU has FMA and AVX2.
            return unsafe { self.shape_fma(values) };
        }
        self.shape_portable(values)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn shape_fma(&self, values: &[f32]) -> Shape {
        self.shape_portable(values)
    }

    #[inline(always)]
    fn shape_portable(&self, values: &[f32]) -> Shape {
        match *self {
            Reshape::DynamicTemperature {
                temperature,
                range,
                exponent,
            } => dynamic_temperature::shape(values, temperature, range, exponent),
            Reshape::Smoothing { k, s } => smoothing::shape(values, k, s),
            Reshape::AdaptiveP { target, .. } => adaptive_p::shape(values, target),
            Reshape::LogSoftmax => log_softmax::shape(values),
        }
    }
}

/// An element-wise transform, resolved from a row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Shape {
    /// Every value stays.
    Identity,
    /// `x / temperature` (IEEE division, as [`crate::Edit::Scale`]).
    Scale { temperature: f32 },
    /// Values below `max` become `-inf` (a temperature of 0: greedy); NaN stays.
    Greedy { max: f32 },
    /// Quadratic sampling around `max`: a value `x` other than `-inf` and NaN (which stay), with
    /// `d = x - max`, becomes `(-(k * d^2) + s * d^3) + max`, each operation rounded to f32
    /// (`d^2 = d * d`, `d^3 = d * d * d`), as torch computes text-generation-webui's expression
    /// on an f32 row.
    /// Where that overflows (torch's infinity or NaN) for a finite `x`, the value is the
    /// expression computed in f64 saturated at `±f32::MAX`: a finite logit stays finite.
    Quadratic { max: f32, k: f32, s: f32 },
    /// llama.cpp's adaptive-p transform: a value `x` other than `-inf`, with
    /// `p = exp(x - max) / scale` and `d = |(p - target) / 0.3|`, becomes `5 - 10 d^2 / (1 + d)`
    /// (f32, as llama.cpp).
    AdaptiveP { max: f32, scale: f32, target: f32 },
    /// `(x - max) - log_sum` (f32, as torch's `log_softmax`).
    LogSoftmax { max: f32, log_sum: f32 },
}

/// [`Shape::Quadratic`] of a finite `x` whose f32 arithmetic overflowed: in f64 (which cannot
/// overflow for f32 operands: `|k d^2|, |s d^3| < 1e155`), saturated at `±f32::MAX`.
#[cold]
fn saturated_quadratic(x: f32, max: f32, k: f32, s: f32) -> f32 {
    let d = x as f64 - max as f64;
    let y = -(k as f64 * d * d) + s as f64 * d * d * d + max as f64;
    y.clamp(-(f32::MAX as f64), f32::MAX as f64) as f32
}

impl Shape {
    /// The value `x` becomes.
    #[inline(always)]
    pub fn apply(&self, x: f32) -> f32 {
        match *self {
            Shape::Identity => x,
            Shape::Scale { temperature } => x / temperature,
            Shape::Greedy { max } => {
                if x < max {
                    f32::NEG_INFINITY
                } else {
                    x
                }
            }
            Shape::Quadratic { max, k, s } => {
                // NaN stays as it is: through the negation below its sign would be the
                // compiler's choice (LLVM may turn `-a + b` into `b - a`), and differ between
                // the passes that inline this.
                if x == f32::NEG_INFINITY || x.is_nan() {
                    return x;
                }
                let d = x - max;
                let d2 = d * d;
                let d3 = d * d * d;
                let y = (-(k * d2) + s * d3) + max;
                if y.is_finite() || !x.is_finite() {
                    return y;
                }
                saturated_quadratic(x, max, k, s)
            }
            Shape::AdaptiveP { max, scale, target } => {
                if x == f32::NEG_INFINITY {
                    return x;
                }
                let p = crate::truncation::exp(x - max) / scale;
                let d = ((p - target) * (1.0 / 0.3f32)).abs();
                5.0 - 10.0 * d * d / (1.0 + d)
            }
            Shape::LogSoftmax { max, log_sum } => (x - max) - log_sum,
        }
    }

    /// Applies the shape to every value of `row`, rounding to `T` after. Compiled for FMA and
    /// AVX2 where the CPU has them (the same bits: adaptive-p's `exp` uses fused multiply-adds,
    /// correctly rounded either way, and is a C library call per operation without them).
    pub fn apply_row<T: Logit>(&self, row: &mut [T]) {
        match *self {
            Shape::Identity => {}
            Shape::Scale { temperature } => T::divide_row(row, temperature),
            _ => {
                #[cfg(target_arch = "x86_64")]
                if crate::cpu::avx2_fma() {
                    // SAFETY: the CPU has FMA and AVX2.
                    return unsafe { self.apply_each_fma(row) };
                }
                self.apply_each(row)
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn apply_each_fma<T: Logit>(&self, row: &mut [T]) {
        self.apply_each(row)
    }

    #[inline(always)]
    fn apply_each<T: Logit>(&self, row: &mut [T]) {
        for x in row.iter_mut() {
            *x = T::from_f32(self.apply(x.to_f32()));
        }
    }
}
