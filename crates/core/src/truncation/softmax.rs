//! The softmax in fixed point: the row's maximum, the weights of its values and their sums
//! (vectorized where the CPU allows, the same bits everywhere).

use crate::truncation::select::{lowest_reaching, max_and_near};
#[cfg(target_arch = "x86_64")]
use crate::truncation::simd;
use crate::truncation::{exp, fixed, from_order_key, order_key, Truncation, Work, FIXED_BITS};
#[cfg(target_arch = "x86_64")]
use crate::truncation::{EXP_LN2_HI, EXP_LN2_LO, EXP_LOG2_E, EXP_POLY, EXP_SHIFTER};

/// The largest non-NaN value under `f32::total_cmp` order (`-inf` when there is none): the
/// softmax's maximum.
#[inline(always)]
pub(crate) fn largest(values: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    let max = if crate::cpu::avx() {
        // SAFETY: the CPU has AVX.
        unsafe { largest_float_avx(values) }
    } else {
        largest_float(values)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let max = largest_float(values);
    if max == 0.0 {
        // `0.0` is above `-0.0` in the total order.
        let positive = values.iter().any(|x| x.to_bits() == 0);
        return if positive { 0.0 } else { -0.0 };
    }
    max
}

/// The largest value by float comparison (NaN never wins one; `-inf` for none): [`largest`]
/// but for the sign of a zero.
fn largest_float(values: &[f32]) -> f32 {
    values
        .iter()
        .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m })
}

/// [`largest_float`] with four independent vectors of running maxima.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
fn largest_float_avx(values: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let blocks = values.chunks_exact(32);
    let rest = largest_float(blocks.remainder());
    let mut maxima = [_mm256_set1_ps(f32::NEG_INFINITY); 4];
    for block in blocks {
        for (i, m) in maxima.iter_mut().enumerate() {
            // SAFETY: `block` holds 32 f32. `max_ps(x, m)` is `x > m ? x : m`.
            *m = _mm256_max_ps(unsafe { _mm256_loadu_ps(block.as_ptr().add(8 * i)) }, *m);
        }
    }
    let mut lanes = [0f32; 32];
    for (i, m) in maxima.into_iter().enumerate() {
        // SAFETY: `lanes` holds 32 f32.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr().add(8 * i), m) };
    }
    lanes
        .into_iter()
        .fold(rest, |m, x| if x > m { x } else { m })
}

/// `sum fixed(q(x))` over `values`, the softmax's `W` (NaN adds nothing): AVX2 where the CPU has
/// it, with the same bits as [`Softmax::weights`] one value at a time (a test compares them).
#[inline(always)]
pub fn weight_sum(values: &[f32], max: f32) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if values.len() < 1 << 21 && simd::available() {
        return simd::sums(values, max, false).0;
    }
    #[cfg(target_arch = "x86_64")]
    if values.len() < 1 << 21 && crate::cpu::avx2_fma() {
        // SAFETY: the CPU has FMA and AVX2.
        return unsafe { weight_sum_avx2(values, max) };
    }
    weight_sum_scalar(values, max)
}

#[inline(always)]
fn weight_sum_scalar(values: &[f32], max: f32) -> u64 {
    let softmax = Softmax {
        max,
        sum: 0,
        entropy_sum: 0,
    };
    values.iter().map(|&x| softmax.weights(x).0).sum()
}

/// [`weight_sum`] eight values at a time: [`exp`]'s operations in the same order on each lane.
/// Only `d = x - max` in `[-87, 0]` is computed (there `exp`'s scale `2^n` is normal); below it
/// `q < 2^-125` and its weight is 0, as for NaN.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(super) fn weight_sum_avx2(values: &[f32], max: f32) -> u64 {
    use std::arch::x86_64::*;
    let splat = _mm256_set1_ps;
    let (max_v, floor, weightless) = (splat(max), splat(-87.0), splat(-WEIGHTLESS));
    let (log2_e, shifter) = (splat(EXP_LOG2_E), splat(EXP_SHIFTER));
    let (ln2_hi, ln2_lo) = (splat(-EXP_LN2_HI), splat(-EXP_LN2_LO));
    let one = splat(1.0);
    // `q * 2^32` is `y * 2^(n + 32)`: the same rounding, scaled exactly.
    let bias = _mm256_set1_epi32(127 + FIXED_BITS as i32);
    // `round(q * 2^32)` of eight values (0 where `d < -87` or NaN), as integral f32.
    let fixed_weights = |x: __m256| {
        let d = _mm256_sub_ps(x, max_v);
        let live = _mm256_cmp_ps::<_CMP_GE_OQ>(d, floor);
        let n = _mm256_sub_ps(_mm256_fmadd_ps(d, log2_e, shifter), shifter);
        let r = _mm256_fmadd_ps(n, ln2_hi, d);
        let r = _mm256_fmadd_ps(n, ln2_lo, r);
        let mut p = splat(EXP_POLY[0]);
        for &c in &EXP_POLY[1..] {
            p = _mm256_fmadd_ps(p, r, splat(c));
        }
        let y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), one);
        let pow2 = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(n), bias));
        let t = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(y, _mm256_castsi256_ps(pow2)),
        );
        _mm256_and_ps(t, live)
    };
    // Sums of integers below 2^32 in f64 are exact up to 2^53: rows of up to 2^21 values.
    let mut sums = [_mm256_setzero_pd(); 4];
    let add = |sums: &mut [__m256d; 4], t: __m256| {
        sums[0] = _mm256_add_pd(sums[0], _mm256_cvtps_pd(_mm256_castps256_ps128(t)));
        sums[1] = _mm256_add_pd(sums[1], _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(t)));
    };
    let blocks = values.chunks_exact(16);
    let rest = blocks.remainder();
    for block in blocks {
        // SAFETY: `block` holds 16 f32.
        let (a, b) = unsafe {
            (
                _mm256_loadu_ps(block.as_ptr()),
                _mm256_loadu_ps(block.as_ptr().add(8)),
            )
        };
        // Blocks far below the maximum weigh nothing (most of a model's row).
        let heavy = _mm256_or_ps(
            _mm256_cmp_ps::<_CMP_GE_OQ>(_mm256_sub_ps(a, max_v), weightless),
            _mm256_cmp_ps::<_CMP_GE_OQ>(_mm256_sub_ps(b, max_v), weightless),
        );
        if _mm256_testz_ps(heavy, heavy) == 1 {
            continue;
        }
        // Two independent chains of `exp`, interleaved.
        let (ta, tb) = (fixed_weights(a), fixed_weights(b));
        add(&mut sums, ta);
        sums.swap(0, 2);
        sums.swap(1, 3);
        add(&mut sums, tb);
    }
    let sum = _mm256_add_pd(
        _mm256_add_pd(sums[0], sums[1]),
        _mm256_add_pd(sums[2], sums[3]),
    );
    let mut lanes = [0f64; 4];
    // SAFETY: `lanes` holds 4 f64.
    unsafe { _mm256_storeu_pd(lanes.as_mut_ptr(), sum) };
    lanes.iter().map(|&sum| sum as u64).sum::<u64>() + weight_sum_scalar(rest, max)
}

/// Values more than this below the maximum have weight 0: `exp(d) < 2^-33`, which rounds to 0
/// in fixed point (a test checks every f32 from `-104` to here).
pub(super) const WEIGHTLESS: f32 = 23.0;

/// Values more than this below the maximum have entropy weight 0: `fixed(q * -d)` with
/// `e^-27 * 27 * 2^32 < 0.22` (a test checks every f32 from `-104` to here).
pub(super) const ENTROPY_WEIGHTLESS: f32 = 27.0;

/// How far below the maximum [`heavy`] collects: one more than [`WEIGHTLESS`] (for the entropy
/// sum too, [`ENTROPY_WEIGHTLESS`]), so that the rounding of `max - below` (at most `2^-7` for a
/// maximum below `1e5`) cannot leave out a value that weighs anything.
pub(crate) fn heavy_below(entropy: bool) -> f32 {
    1.0 + if entropy {
        ENTROPY_WEIGHTLESS
    } else {
        WEIGHTLESS
    }
}

/// The softmax of `values` from the values that weigh anything, when they are at most a
/// sixteenth of the row (a model's row: its mass sits within a few units of its maximum; a flat
/// row gives up after a sixteenth, which a larger share would make cost more than it saves): [`near_max`]
/// collects every value from `max - below` up (`below` [`heavy_below`]`(entropy)`: an upper set
/// of the row, NaN and `-inf` aside), the values below it weigh 0, so the sums over them are the
/// whole row's (`E` when `entropy`, else 0; vectorized where the CPU allows). Returns what
/// `then` makes of those values and that softmax (`work` its scratch space); `Err` with the
/// row's maximum when it was found on the way (with the sign of a zero decided) where there are
/// more of them, the maximum is not finite or is `1e5` or more in magnitude, or `then` gives
/// `None`; `Err(None)` without AVX2.
#[inline(always)]
pub(crate) fn heavy<R>(
    values: &[f32],
    entropy: bool,
    work: &mut Work,
    then: impl FnOnce(&[f32], Softmax, &mut Work) -> Option<R>,
) -> Result<R, Option<f32>> {
    let below = heavy_below(entropy);
    let mut near = NEAR.take();
    let found = near_max(values, -below, values.len() / 16, work, &mut near);
    let usable = |max: f32| match max.is_finite() && max.abs() < 1e5 {
        true => Ok(max),
        false => Err(Some(max)),
    };
    let max = match found.and_then(usable) {
        Ok(max) => max,
        Err(max) => {
            NEAR.set(near);
            return Err(max);
        }
    };
    let (sum, entropy_sum) = sums(&near, max, entropy);
    let made = then(
        &near,
        Softmax {
            max,
            sum,
            entropy_sum,
        },
        work,
    );
    NEAR.set(near);
    made.ok_or(Some(max))
}

thread_local! {
    /// [`heavy`]'s values, kept between the calls of a thread (at most a sixteenth of the
    /// longest row it has cut).
    static NEAR: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// `W` and (when `entropy`) `E` over `values` under `max`: the passes of `truncation/simd.rs`
/// where the CPU has them, else one value at a time.
#[inline(always)]
fn sums(values: &[f32], max: f32, entropy: bool) -> (u64, u64) {
    #[cfg(target_arch = "x86_64")]
    if values.len() < 1 << 21 && simd::available() {
        return simd::sums(values, max, entropy);
    }
    let softmax = Softmax {
        max,
        sum: 0,
        entropy_sum: 0,
    };
    values.iter().fold((0, 0), |(w, e), &x| {
        let (dw, de) = softmax.weights(x);
        (w + dw, if entropy { e + de } else { 0 })
    })
}

/// The row's maximum (NaN never wins; as [`largest`] decides it), with every value but `-inf`
/// from `maximum + below` up in `near` (an upper set of the row): one pass for both
/// ([`max_and_near`], `work` its scratch space) where the values near the running maximum are at
/// most 4,096 (a row whose values near its maximum are spread through it), else a pass for the
/// maximum and one for the values near it (a model's row: its maximum stands far above most of
/// it, and the running maximum of its first values far below the last). `Err` with the maximum
/// past `limit` values, or `None` without AVX2 (and FMA for the second way). For a maximum that
/// is not finite or is `1e5` or more in magnitude, `near` is left unspecified (the caller's to
/// refuse).
#[inline(always)]
pub(crate) fn near_max(
    values: &[f32],
    below: f32,
    limit: usize,
    work: &mut Work,
    near: &mut Vec<f32>,
) -> Result<f32, Option<f32>> {
    near.clear();
    let max = match max_and_near(values, below, limit.min(4096), work) {
        Some(max) => {
            let floor = max + below;
            near.extend(work.iter().map(|e| e.2).filter(|&x| x >= floor));
            max
        }
        #[cfg(target_arch = "x86_64")]
        None if simd::available() => {
            let max = largest(values);
            let usable = max.is_finite() && max.abs() < 1e5;
            if usable && !simd::values_at_least(values, max + below, limit, near) {
                return Err(Some(max));
            }
            return Ok(max);
        }
        None => return Err(None),
    };
    // The sign of a zero maximum, as `largest` decides it.
    Ok(if max == 0.0 { largest(values) } else { max })
}

/// Sets each entry's weight to `fixed(exp(value - max))` ([`Softmax::weights`]): sixteen or eight
/// at a time where the CPU allows.
#[inline(always)]
pub(crate) fn weigh(work: &mut Work, max: f32) {
    #[cfg(target_arch = "x86_64")]
    if simd::available() {
        return simd::fill_weights(work, max);
    }
    let softmax = Softmax {
        max,
        sum: 0,
        entropy_sum: 0,
    };
    for e in work.iter_mut() {
        e.1 = softmax.weights(e.2).0;
    }
}

/// The smallest value whose `q` reaches `threshold` (`+inf` when none does), as
/// [`lowest_reaching`] finds it over the whole row, from [`heavy`]'s values: a value below them
/// has `q < 4e-11` (its `x - max` is at most `-23.99`), so for a threshold of `1e-10` or more
/// none of them reaches it. `None` for a smaller threshold (or NaN).
#[inline(always)]
pub(crate) fn lowest_reaching_near(
    near: &[f32],
    max: f32,
    threshold: f32,
    work: &mut Work,
) -> Option<f32> {
    (threshold >= 1e-10).then(|| lowest_reaching(near, max, threshold, work))
}

/// A row's softmax in the fixed-point form the module docs describe: the maximum, the sum `W`
/// of the probabilities' fixed-point weights and the entropy sum `E`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Softmax {
    pub max: f32,
    pub sum: u64,
    pub entropy_sum: u64,
}

impl Softmax {
    /// The weight sum of `values` under their maximum `max`, without the entropy sum: what the
    /// rules that compare probabilities (top-p, top-a, XTC, mirostat, adaptive-p) need.
    #[inline(always)]
    pub fn weights_only(values: &[f32], max: f32) -> Self {
        Softmax {
            max,
            sum: weight_sum(values, max),
            entropy_sum: 0,
        }
    }

    /// The maximum of `values`; then the sums over them (in any order: they are exact), with the
    /// passes of `truncation/simd.rs` where the CPU has them.
    #[inline(always)]
    pub fn of(values: &[f32]) -> Self {
        #[cfg(target_arch = "x86_64")]
        if values.len() < 1 << 21 && simd::available() {
            let max = largest(values);
            let (sum, entropy_sum) = if max.is_finite() {
                simd::sums(values, max, true)
            } else {
                (0, 0)
            };
            return Softmax {
                max,
                sum,
                entropy_sum,
            };
        }
        let max = values
            .iter()
            .filter(|x| !x.is_nan())
            .map(|&x| order_key(x))
            .max()
            .map_or(f32::NEG_INFINITY, from_order_key);
        let mut softmax = Softmax {
            max,
            sum: 0,
            entropy_sum: 0,
        };
        if softmax.is_defined() {
            for &x in values {
                let (w, e) = softmax.weights(x);
                softmax.sum += w;
                softmax.entropy_sum += e;
            }
        }
        softmax
    }

    /// Whether the row has a distribution: its largest non-NaN value is finite.
    pub fn is_defined(&self) -> bool {
        self.max.is_finite()
    }

    /// `exp(x - max)`, the probability of `x` times the sum `S`.
    #[inline(always)]
    pub fn q(&self, x: f32) -> f32 {
        exp(x - self.max)
    }

    /// The fixed-point weights `x` adds to the sum and to the entropy sum (NaN adds nothing).
    #[inline(always)]
    pub fn weights(&self, x: f32) -> (u64, u64) {
        if x.is_nan() {
            return (0, 0);
        }
        let d = x - self.max;
        let q = exp(d);
        if q > 0.0 {
            (fixed(q), fixed(q * -d))
        } else {
            (0, 0)
        }
    }

    /// The sum `S = W * 2^-32` of the `q`s, in f32.
    pub fn scale(&self) -> f32 {
        self.sum_f64() as f32
    }

    /// `S = W * 2^-32` in f64 (exact: `W` is below `2^53` for any row shorter than `2^21`).
    pub fn sum_f64(&self) -> f64 {
        self.sum as f64 / (1u64 << FIXED_BITS) as f64
    }

    /// `E / W`, the entropy less `ln S`, in f32.
    pub fn shift(&self) -> f32 {
        (self.entropy_sum as f64 / self.sum as f64) as f32
    }

    /// A fraction `p` of the total mass, in the units of the fixed-point sums.
    pub fn target(&self, p: f32) -> f64 {
        p as f64 * self.sum as f64
    }

    /// The `q` a value must reach to be kept by min-p, epsilon or eta (`+inf` for other rules).
    #[inline(always)]
    pub fn threshold(&self, rule: &Truncation) -> f32 {
        match *rule {
            Truncation::MinP { p, .. } => p,
            Truncation::Epsilon { epsilon, .. } => epsilon * self.scale(),
            Truncation::Eta { epsilon, .. } => {
                (epsilon * self.scale()).min(epsilon.sqrt() * exp(-self.shift()))
            }
            _ => f32::INFINITY,
        }
    }

    /// The typical rule's score of `x`: `|-ln p - H| = |d + E / W|`.
    #[inline(always)]
    pub fn typical_score(&self, x: f32, shift: f32) -> f32 {
        ((x - self.max) + shift).abs()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::truncation::{Work, EXP_MIN};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]
        /// The vectorized sum of weights is the one-value-at-a-time sum, bit for bit, over
        /// values around every range `exp` distinguishes (normal, subnormal, zero results).
        #[test]
        fn weight_sum_is_the_sum_of_weights(
            row in proptest::collection::vec(
                prop_oneof![
                    -110.0f32..0.0,
                    -90.0f32..-84.0,
                    -24.0f32..0.0,
                    Just(f32::NAN),
                    Just(f32::NEG_INFINITY),
                    Just(-0.0f32),
                ],
                0..200,
            ),
            // Mostly weightless: whole blocks skipped.
            far in proptest::collection::vec(prop_oneof![9 => -110.0f32..-22.0, 1 => -30.0f32..0.0], 0..400),
        ) {
            let softmax = Softmax { max: 0.0, sum: 0, entropy_sum: 0 };
            for row in [row, far] {
                let one_by_one: u64 = row.iter().map(|&x| softmax.weights(x).0).sum();
                prop_assert_eq!(weight_sum(&row, 0.0), one_by_one);
                prop_assert_eq!(weight_sum_scalar(&row, 0.0), one_by_one);
                #[cfg(target_arch = "x86_64")]
                {
                    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                        // SAFETY: the CPU has AVX2 and FMA.
                        prop_assert_eq!(unsafe { weight_sum_avx2(&row, 0.0) }, one_by_one);
                    }
                    if simd::available() {
                        let entropy: u64 = row.iter().map(|&x| softmax.weights(x).1).sum();
                        prop_assert_eq!(simd::sums(&row, 0.0, true), (one_by_one, entropy));
                        let mut work: Work = row.iter().map(|&x| (0, 0, x)).collect();
                        simd::fill_weights(&mut work, 0.0);
                        for e in &work {
                            prop_assert_eq!(e.1, softmax.weights(e.2).0, "{}", e.2);
                        }
                    }
                }
            }
        }
    }

    /// Every f32 from `-104` (below which `exp` is 0) up to `-WEIGHTLESS` has weight 0 (up to
    /// `-ENTROPY_WEIGHTLESS`, entropy weight 0): the
    /// vectorized sum may skip blocks below it.
    #[test]
    fn values_far_below_the_maximum_weigh_nothing() {
        let softmax = Softmax {
            max: 0.0,
            sum: 0,
            entropy_sum: 0,
        };
        let (from, to) = (EXP_MIN.to_bits(), (-WEIGHTLESS).to_bits());
        // Negative floats: larger bits are further from zero.
        for bits in to..=from {
            let d = f32::from_bits(bits);
            assert_eq!(softmax.weights(d).0, 0, "{d}");
        }
        assert!(softmax.weights(-WEIGHTLESS + 0.5).0 > 0);
        let to = (-ENTROPY_WEIGHTLESS).to_bits();
        for bits in to..=from {
            let d = f32::from_bits(bits);
            assert_eq!(softmax.weights(d).1, 0, "{d}");
        }
        assert!(softmax.weights(-WEIGHTLESS - 3.0).1 > 0);
    }
}
